#include "client/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace fedlearn {
namespace {

// Magic numbers: two zero bytes, the element type, the number of dimensions.
constexpr uint8_t kUnsignedByte = 0x08;
constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// The whole file, at most kMaxIdxBytes of it.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const size_t n = std::fread(buf, 1, sizeof(buf), f.get());
    bytes.append(buf, n);
    if (static_cast<int64_t>(bytes.size()) > kMaxIdxBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": larger than the ", kMaxIdxBytes, "-byte limit"));
    }
    if (n < sizeof(buf)) break;
  }
  if (std::ferror(f.get())) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
  }
  return bytes;
}

bool IsGzip(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f &&
         static_cast<uint8_t>(bytes[1]) == 0x8b;
}

// Decompresses a gzip file (one or more concatenated members, as gunzip
// accepts) into at most kMaxIdxBytes.
absl::StatusOr<std::string> Gunzip(absl::string_view compressed,
                                   const std::string& path) {
  z_stream zs = {};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": cannot initialise zlib"));
  }
  std::unique_ptr<z_stream, int (*)(z_stream*)> cleanup(&zs, inflateEnd);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  zs.avail_in = static_cast<uInt>(compressed.size());

  std::string out;
  size_t produced = 0;
  for (;;) {
    if (produced == out.size()) {
      if (static_cast<int64_t>(out.size()) >= kMaxIdxBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": decompresses to ", kMaxIdxBytes, " bytes or more"));
      }
      out.resize(std::min<size_t>(
          std::max<size_t>(2 * out.size(), 4 * compressed.size() + 4096),
          kMaxIdxBytes));
    }
    zs.next_out = reinterpret_cast<Bytef*>(&out[produced]);
    zs.avail_out = static_cast<uInt>(out.size() - produced);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    produced = out.size() - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      // Another gzip member follows, or garbage does.
      const absl::string_view rest(reinterpret_cast<const char*>(zs.next_in),
                                   zs.avail_in);
      if (!IsGzip(rest)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": ", rest.size(), " bytes of garbage after the gzip data"));
      }
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": truncated gzip data"));
    }
    if (rc == Z_MEM_ERROR) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": out of memory decompressing"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": corrupt gzip data (",
                     zs.msg != nullptr ? zs.msg : "zlib error", ")"));
  }
  out.resize(produced);
  return out;
}

// The file's contents, decompressed if it is gzip.
absl::StatusOr<std::string> ReadMaybeGzipped(const std::string& path) {
  // Not FEDLEARN_ASSIGN_OR_RETURN: moving the string out of the StatusOr
  // trips a false -Wmaybe-uninitialized in g++ 12.
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok() || !IsGzip(*bytes)) return bytes;
  return Gunzip(*bytes, path);
}

uint32_t BigEndian32(const char* p) {
  const auto* u = reinterpret_cast<const uint8_t*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) |
         (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

void PutBigEndian32(uint32_t v, std::string* out) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  out->append(b, 4);
}

// The name of an IDX element type, or null if the byte is not one.
const char* TypeName(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return nullptr;
  }
}

// An IDX file's dimensions and the bytes of its elements (a view into the
// file's contents).
struct IdxView {
  std::vector<int64_t> dims;
  absl::string_view data;
};

// Checks `bytes` (the contents of `path`) against `magic` and that it holds
// exactly the elements its header promises.
absl::StatusOr<IdxView> ParseIdx(absl::string_view bytes,
                                 const std::string& path, uint32_t magic,
                                 const char* what) {
  const auto expected = [&] {
    return absl::StrFormat("expected 0x%08x (%s)", magic, what);
  };
  if (bytes.size() < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: ", bytes.size(),
                     " bytes, shorter than the 4-byte IDX magic number"));
  }
  const uint32_t got = BigEndian32(bytes.data());
  const uint8_t type = static_cast<uint8_t>(got >> 8);
  const int ndims = static_cast<int>(got & 0xff);
  if ((got >> 16) != 0 || TypeName(type) == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an IDX file: magic 0x%08x, %s", path, got, expected()));
  }
  if (type != kUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: element type 0x%02x (%s), expected 0x%02x (unsigned byte)", path,
        type, TypeName(type), kUnsignedByte));
  }
  if (ndims != static_cast<int>(magic & 0xff)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: wrong magic 0x%08x (%d-dimensional), %s", path,
                        got, ndims, expected()));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: ", bytes.size(),
                     " bytes, shorter than its ", header, "-byte header"));
  }
  IdxView view;
  const uint64_t available = bytes.size() - header;
  for (int i = 0; i < ndims; ++i) {
    view.dims.push_back(BigEndian32(bytes.data() + 4 + 4 * i));
  }
  // The product of the dimensions, computed only as far as it stays within
  // what the file holds (so it cannot overflow).
  uint64_t elements = 1;
  bool too_many = false;
  if (std::find(view.dims.begin(), view.dims.end(), 0) != view.dims.end()) {
    elements = 0;
  } else {
    for (const int64_t d : view.dims) {
      if (elements > available / static_cast<uint64_t>(d)) {
        too_many = true;
        break;
      }
      elements *= static_cast<uint64_t>(d);
    }
  }
  if (too_many) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: the header's dimensions [",
                     absl::StrJoin(view.dims, ", "), "] need more than the ",
                     available, " data bytes present"));
  }
  if (elements < available) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", available - elements, " trailing bytes after the ",
        elements, " data bytes its header describes"));
  }
  view.data = bytes.substr(header);
  return view;
}

// `dir`/`name` if it exists, else `dir`/`name`.gz if that does.
absl::StatusOr<std::string> FindSplitFile(const std::string& dir,
                                          const std::string& name) {
  const std::filesystem::path base = std::filesystem::path(dir) / name;
  for (const std::string& candidate : {base.string(), base.string() + ".gz"}) {
    std::error_code ec;
    if (std::filesystem::exists(candidate, ec)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat(base.string(), " not found (nor ", name, ".gz)"));
}

absl::Status WriteFile(const std::string& path, const std::string& bytes) {
  File f(std::fopen(path.c_str(), "wb"));
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
  }
  if (std::fclose(f.release()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadIdx(const std::string& images_path,
                                const std::string& labels_path,
                                int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("loading ", labels_path, ": num_classes ", num_classes,
                     " outside [1, 256]"));
  }
  FEDLEARN_ASSIGN_OR_RETURN(const std::string image_bytes,
                            ReadMaybeGzipped(images_path));
  FEDLEARN_ASSIGN_OR_RETURN(
      const IdxView images,
      ParseIdx(image_bytes, images_path, kImagesMagic, "unsigned byte images"));
  if (images.dims[1] == 0 || images.dims[2] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": images of ",
                                                   images.dims[1], " x ",
                                                   images.dims[2], " pixels"));
  }
  FEDLEARN_ASSIGN_OR_RETURN(const std::string label_bytes,
                            ReadMaybeGzipped(labels_path));
  FEDLEARN_ASSIGN_OR_RETURN(
      const IdxView labels,
      ParseIdx(label_bytes, labels_path, kLabelsMagic, "unsigned byte labels"));
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " has ", images.dims[0], " images but ",
                     labels_path, " has ", labels.dims[0], " labels"));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    const int label = static_cast<uint8_t>(labels.data[i]);
    if (label >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels_path, ": label ", label, " of example ", i,
                       " is not below num_classes ", num_classes));
    }
  }
  Dataset data;
  data.rows = images.dims[1];
  data.cols = images.dims[2];
  data.pixels.assign(images.data.begin(), images.data.end());
  data.labels.assign(labels.data.begin(), labels.data.end());
  return data;
}

absl::StatusOr<Dataset> LoadMnistDir(const std::string& dir, bool train,
                                     int num_classes) {
  const std::string split = train ? "train" : "t10k";
  FEDLEARN_ASSIGN_OR_RETURN(
      const std::string images,
      FindSplitFile(dir, absl::StrCat(split, "-images-idx3-ubyte")));
  FEDLEARN_ASSIGN_OR_RETURN(
      const std::string labels,
      FindSplitFile(dir, absl::StrCat(split, "-labels-idx1-ubyte")));
  return LoadIdx(images, labels, num_classes);
}

absl::Status WriteIdx(const std::string& images_path,
                      const std::string& labels_path, const Dataset& data) {
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
  if (data.rows <= 0 || data.cols <= 0 || data.rows > kMaxDim ||
      data.cols > kMaxDim || data.size() > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("writing ", images_path, ": ", data.size(), " images of ",
                     data.rows, " x ", data.cols, " pixels"));
  }
  if (static_cast<int64_t>(data.pixels.size()) !=
      data.size() * data.rows * data.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "writing ", images_path, ": ", data.pixels.size(), " pixels for ",
        data.size(), " images of ", data.rows, " x ", data.cols));
  }
  std::string images;
  images.reserve(16 + data.pixels.size());
  PutBigEndian32(kImagesMagic, &images);
  PutBigEndian32(static_cast<uint32_t>(data.size()), &images);
  PutBigEndian32(static_cast<uint32_t>(data.rows), &images);
  PutBigEndian32(static_cast<uint32_t>(data.cols), &images);
  images.append(reinterpret_cast<const char*>(data.pixels.data()),
                data.pixels.size());
  FEDLEARN_RETURN_IF_ERROR(WriteFile(images_path, images));

  std::string labels;
  labels.reserve(8 + data.labels.size());
  PutBigEndian32(kLabelsMagic, &labels);
  PutBigEndian32(static_cast<uint32_t>(data.size()), &labels);
  labels.append(reinterpret_cast<const char*>(data.labels.data()),
                data.labels.size());
  return WriteFile(labels_path, labels);
}

Dataset Subset(const Dataset& data, absl::Span<const int64_t> indices) {
  Dataset out;
  out.rows = data.rows;
  out.cols = data.cols;
  const size_t image = static_cast<size_t>(data.pixels_per_image());
  out.pixels.resize(indices.size() * image);
  out.labels.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    std::copy_n(data.image(indices[i]), image, out.pixels.data() + i * image);
    out.labels[i] = data.labels[static_cast<size_t>(indices[i])];
  }
  return out;
}

PixelStats ComputePixelStats(const Dataset& data) {
  PixelStats stats;
  if (data.pixels.empty()) return stats;
  // Exact integer sums over a histogram: the same result on any machine.
  std::array<int64_t, 256> histogram = {};
  for (const uint8_t p : data.pixels) ++histogram[p];
  double sum = 0, sum_sq = 0;
  for (int v = 0; v < 256; ++v) {
    sum += static_cast<double>(histogram[v]) * v;
    sum_sq += static_cast<double>(histogram[v]) * v * v;
  }
  const double n = static_cast<double>(data.pixels.size());
  const double mean = sum / n;
  const double variance = std::max(0.0, sum_sq / n - mean * mean);
  stats.mean = static_cast<float>(mean / 255.0);
  stats.std = static_cast<float>(std::max(1e-6, std::sqrt(variance) / 255.0));
  return stats;
}

}  // namespace fedlearn
