#include "client/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace fedlearn {
namespace {

using Partitions = std::vector<std::vector<int64_t>>;

// Portable samplers over mt19937_64 (whose output the standard fixes), in
// place of std::shuffle and the std distributions (which it does not).
class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}

  // Uniform in [0, n), n > 0, without modulo bias.
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t x = rng_();
      if (x >= threshold) return x % n;
    }
  }

  // Uniform in (0, 1): never 0, so its logarithm is finite.
  double Open01() {
    return (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53;
  }

  // Standard normal, by Marsaglia's polar method.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    for (;;) {
      const double u = 2.0 * Open01() - 1.0;
      const double v = 2.0 * Open01() - 1.0;
      const double s = u * u + v * v;
      if (s >= 1.0 || s == 0.0) continue;
      const double f = std::sqrt(-2.0 * std::log(s) / s);
      spare_ = v * f;
      has_spare_ = true;
      return u * f;
    }
  }

  // The logarithm of a Gamma(alpha, 1) draw, alpha > 0, by Marsaglia and
  // Tsang's method (2000). Logarithms because for small alpha the draw itself
  // underflows to 0 often enough to matter: Gamma(alpha) = Gamma(alpha + 1) *
  // U^(1/alpha).
  double LogGamma(double alpha) {
    if (alpha < 1.0) {
      return LogGamma(alpha + 1.0) + std::log(Open01()) / alpha;
    }
    const double d = alpha - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      const double x = Normal();
      double v = 1.0 + c * x;
      if (v <= 0.0) continue;
      v = v * v * v;
      const double u = Open01();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) {
        return std::log(d) + std::log(v);
      }
    }
  }

  // Fisher-Yates.
  template <typename T>
  void Shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) {
      std::swap(v[i - 1], v[Below(i)]);
    }
  }

 private:
  std::mt19937_64 rng_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// 0 .. n-1 in a random order.
std::vector<int64_t> ShuffledIndices(int64_t n, Random& random) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  random.Shuffle(order);
  return order;
}

// The indices of each label, each list in a random order; one list per label
// value up to the largest present.
std::vector<std::vector<int64_t>> IndicesByLabel(
    absl::Span<const uint8_t> labels, Random& random) {
  const int num_labels =
      labels.empty() ? 0 : *std::max_element(labels.begin(), labels.end()) + 1;
  std::vector<std::vector<int64_t>> by_label(num_labels);
  for (const int64_t i : ShuffledIndices(labels.size(), random)) {
    by_label[labels[i]].push_back(i);
  }
  return by_label;
}

Partitions Iid(int64_t n, int num_partitions, Random& random) {
  const std::vector<int64_t> order = ShuffledIndices(n, random);
  Partitions parts(num_partitions);
  // Part p takes order[p*n/P, (p+1)*n/P): sizes differ by at most one.
  for (int p = 0; p < num_partitions; ++p) {
    parts[p].assign(order.begin() + p * n / num_partitions,
                    order.begin() + (p + 1) * n / num_partitions);
  }
  return parts;
}

Partitions Shards(absl::Span<const uint8_t> labels, int num_partitions,
                  Random& random) {
  // Sorted by label, ties in random order.
  std::vector<int64_t> sorted;
  sorted.reserve(labels.size());
  for (const std::vector<int64_t>& same : IndicesByLabel(labels, random)) {
    sorted.insert(sorted.end(), same.begin(), same.end());
  }
  const int64_t n = static_cast<int64_t>(sorted.size());
  const int64_t num_shards = 2 * int64_t{num_partitions};
  std::vector<int64_t> shard_order(num_shards);
  std::iota(shard_order.begin(), shard_order.end(), int64_t{0});
  random.Shuffle(shard_order);
  Partitions parts(num_partitions);
  for (int64_t k = 0; k < num_shards; ++k) {
    const int64_t shard = shard_order[k];
    // Shard s is sorted[s*n/S, (s+1)*n/S): equal sizes when S divides n.
    parts[k / 2].insert(parts[k / 2].end(),
                        sorted.begin() + shard * n / num_shards,
                        sorted.begin() + (shard + 1) * n / num_shards);
  }
  return parts;
}

Partitions Dirichlet(absl::Span<const uint8_t> labels, double alpha,
                     int num_partitions, Random& random) {
  Partitions parts(num_partitions);
  std::vector<double> share(num_partitions);
  for (const std::vector<int64_t>& same : IndicesByLabel(labels, random)) {
    // Client proportions for this class: normalised Gamma(alpha) draws,
    // computed from their logarithms so that tiny draws do not all round to 0.
    double max_log = -std::numeric_limits<double>::infinity();
    for (double& s : share) {
      s = random.LogGamma(alpha);
      max_log = std::max(max_log, s);
    }
    if (std::isfinite(max_log)) {
      double total = 0.0;
      for (double& s : share) total += (s = std::exp(s - max_log));
      for (double& s : share) s /= total;
    } else {
      // Every draw underflowed even as a logarithm (alpha below ~1e-300):
      // the limit as alpha -> 0, the whole class to one client.
      std::fill(share.begin(), share.end(), 0.0);
      share[random.Below(num_partitions)] = 1.0;
    }
    // Client p takes same[cut(p), cut(p + 1)), cuts at the rounded cumulative
    // shares.
    const int64_t count = static_cast<int64_t>(same.size());
    double cumulative = 0.0;
    int64_t begin = 0;
    for (int p = 0; p < num_partitions; ++p) {
      cumulative += share[p];
      const int64_t end =
          p + 1 == num_partitions
              ? count
              : std::clamp<int64_t>(std::llround(cumulative * count), begin,
                                    count);
      parts[p].insert(parts[p].end(), same.begin() + begin, same.begin() + end);
      begin = end;
    }
  }
  return parts;
}

// Gives every empty partition one example from the largest (the lowest
// numbered among equals), while the largest has more than one.
void FillEmpty(Partitions& parts) {
  for (std::vector<int64_t>& empty : parts) {
    if (!empty.empty()) continue;
    auto largest = std::max_element(
        parts.begin(), parts.end(),
        [](const auto& a, const auto& b) { return a.size() < b.size(); });
    if (largest->size() < 2) return;
    empty.push_back(largest->back());
    largest->pop_back();
  }
}

absl::Status CheckAlpha(double alpha, absl::string_view context) {
  if (!std::isfinite(alpha) || alpha <= 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        context, ": dirichlet alpha ", alpha, " must be a finite number > 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PartitionScheme> ParsePartitionScheme(absl::string_view text) {
  PartitionScheme scheme;
  if (text == "iid") {
    scheme.kind = PartitionScheme::Kind::kIid;
    return scheme;
  }
  if (text == "shards") {
    scheme.kind = PartitionScheme::Kind::kShards;
    return scheme;
  }
  absl::string_view alpha_text = text;
  if (absl::ConsumePrefix(&alpha_text, "dirichlet:")) {
    const std::string context = absl::StrCat("partition scheme \"", text, "\"");
    double alpha = 0.0;
    if (!absl::SimpleAtod(alpha_text, &alpha)) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": \"", alpha_text, "\" is not a number"));
    }
    FEDLEARN_RETURN_IF_ERROR(CheckAlpha(alpha, context));
    scheme.kind = PartitionScheme::Kind::kDirichlet;
    scheme.alpha = alpha;
    return scheme;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown partition scheme \"", text,
                   "\" (expected iid, shards or dirichlet:ALPHA)"));
}

std::string PartitionSchemeToString(const PartitionScheme& scheme) {
  switch (scheme.kind) {
    case PartitionScheme::Kind::kIid:
      return "iid";
    case PartitionScheme::Kind::kShards:
      return "shards";
    case PartitionScheme::Kind::kDirichlet:
      return absl::StrCat("dirichlet:", scheme.alpha);
  }
  return "unknown";
}

absl::StatusOr<Partitions> Partition(absl::Span<const uint8_t> labels,
                                     const PartitionScheme& scheme,
                                     int num_partitions, uint64_t seed) {
  if (num_partitions < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "partition: num_partitions ", num_partitions, " must be at least 1"));
  }
  Random random(seed);
  Partitions parts;
  switch (scheme.kind) {
    case PartitionScheme::Kind::kIid:
      parts = Iid(static_cast<int64_t>(labels.size()), num_partitions, random);
      break;
    case PartitionScheme::Kind::kShards:
      parts = Shards(labels, num_partitions, random);
      break;
    case PartitionScheme::Kind::kDirichlet:
      FEDLEARN_RETURN_IF_ERROR(CheckAlpha(scheme.alpha, "partition"));
      parts = Dirichlet(labels, scheme.alpha, num_partitions, random);
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "partition: unknown scheme kind ", static_cast<int>(scheme.kind)));
  }
  FillEmpty(parts);
  for (std::vector<int64_t>& part : parts) std::sort(part.begin(), part.end());
  return parts;
}

}  // namespace fedlearn
