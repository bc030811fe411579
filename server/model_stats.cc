#include "server/model_stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fedlearn {

std::vector<TensorStats> ComputeTensorStats(const ModelSpec& spec,
                                            absl::Span<const float> weights,
                                            int bins) {
  std::vector<TensorStats> out;
  out.reserve(spec.tensors.size());
  for (const TensorSpec& t : spec.tensors) {
    const absl::Span<const float> v = weights.subspan(
        static_cast<size_t>(t.offset), static_cast<size_t>(t.num_elements));
    TensorStats s;
    s.name = t.name;
    s.shape = t.shape;
    s.count = static_cast<int64_t>(v.size());
    s.histogram.assign(static_cast<size_t>(std::max(bins, 1)), 0);
    if (v.empty()) {
      out.push_back(std::move(s));
      continue;
    }
    double sum = 0, squares = 0;
    float lo = v[0], hi = v[0];
    for (float x : v) {
      sum += x;
      squares += double{x} * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const double n = static_cast<double>(v.size());
    s.l2 = std::sqrt(squares);
    s.mean = sum / n;
    double centered = 0;  // second pass: no cancellation for tiny spreads
    for (float x : v) centered += (x - s.mean) * (x - s.mean);
    s.std = std::sqrt(centered / n);
    s.min = lo;
    s.max = hi;
    const double width = (double{hi} - lo) / static_cast<double>(bins);
    for (float x : v) {
      if (!std::isfinite(x)) continue;  // never in an accepted model
      size_t bin = 0;
      if (width > 0) {
        bin = static_cast<size_t>((x - double{lo}) / width);
        bin = std::min(bin, s.histogram.size() - 1);
      }
      ++s.histogram[bin];
    }
    out.push_back(std::move(s));
  }
  return out;
}

namespace {

// Tensor names come from the model registry; escaped all the same.
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// JSON has no NaN or Infinity: those (a diverged model) become null.
std::string JsonNumber(double v) {
  return std::isfinite(v) ? absl::StrFormat("%.9g", v) : "null";
}

}  // namespace

std::string TensorStatsJson(int64_t round,
                            const std::vector<TensorStats>& tensors) {
  std::string out = absl::StrCat("{\"round\":", round, ",\"tensors\":[");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorStats& t = tensors[i];
    absl::StrAppend(
        &out, i ? "," : "", "{\"name\":", JsonString(t.name), ",\"shape\":[",
        absl::StrJoin(t.shape, ","), "],\"count\":", t.count,
        ",\"l2\":", JsonNumber(t.l2), ",\"mean\":", JsonNumber(t.mean),
        ",\"std\":", JsonNumber(t.std), ",\"min\":", JsonNumber(t.min),
        ",\"max\":", JsonNumber(t.max),
        ",\"histogram\":{\"lo\":", JsonNumber(t.min),
        ",\"hi\":", JsonNumber(t.max), ",\"counts\":[",
        absl::StrJoin(t.histogram, ","), "]}}");
  }
  return out + "]}";
}

}  // namespace fedlearn
