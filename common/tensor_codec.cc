#include "common/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little endian; this build copies floats as they are"
#endif

namespace fedlearn {
namespace {

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Calls fn(bytes, n) on each piece of `pieces` in order, past their first
// `skip` bytes.
template <typename Fn>
void ForEachPiece(absl::Span<const absl::string_view> pieces, size_t skip,
                  Fn fn) {
  for (absl::string_view piece : pieces) {
    const size_t drop = std::min(skip, piece.size());
    skip -= drop;
    if (piece.size() > drop) fn(piece.data() + drop, piece.size() - drop);
  }
}

// Copies the first `n` bytes of `pieces` (which hold at least n) to `out`.
void CopyPrefix(absl::Span<const absl::string_view> pieces, char* out,
                size_t n) {
  for (absl::string_view piece : pieces) {
    if (n == 0) return;
    const size_t step = std::min(n, piece.size());
    std::memcpy(out, piece.data(), step);
    out += step;
    n -= step;
  }
}

}  // namespace

v1::ModelSpec ToProto(const ModelSpec& spec) {
  v1::ModelSpec proto;
  proto.set_name(spec.name);
  proto.set_num_parameters(spec.num_parameters);
  for (const TensorSpec& t : spec.tensors) {
    v1::TensorSpec* out = proto.add_tensors();
    out->set_name(t.name);
    for (int64_t d : t.shape) out->add_shape(d);
    out->set_dtype(v1::DTYPE_FLOAT32);
  }
  return proto;
}

absl::StatusOr<ModelSpec> FromProto(const v1::ModelSpec& proto) {
  std::vector<TensorDecl> decls;
  decls.reserve(proto.tensors_size());
  for (const v1::TensorSpec& t : proto.tensors()) {
    if (t.dtype() != v1::DTYPE_FLOAT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", proto.name(), ": tensor ", t.name(), " has dtype ",
          v1::DType_Name(t.dtype()), ", want float32"));
    }
    decls.push_back(TensorDecl{
        t.name(), {t.shape().begin(), t.shape().end()}, Init::kZeros});
  }
  FEDLEARN_ASSIGN_OR_RETURN(ModelSpec spec,
                            MakeModelSpec(proto.name(), std::move(decls)));
  if (spec.num_parameters != proto.num_parameters()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", proto.name(), ": tensors hold ", spec.num_parameters,
        " parameters but num_parameters says ", proto.num_parameters()));
  }
  return spec;
}

bool AllFinite(absl::Span<const float> values) {
  // A float is NaN or infinite exactly when its exponent bits are all ones. A
  // max over the exponent fields has no early exit, so the loop vectorises.
  uint32_t worst = 0;
  for (float v : values) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    worst = std::max(worst, bits & 0x7F800000u);
  }
  return worst != 0x7F800000u;
}

double SumOfSquares(absl::Span<const float> values) {
  // One running sum would make every add wait for the one before (the
  // compiler may not reorder floating-point adds); eight fill a vector
  // register.
  constexpr size_t kLanes = 8;
  double lanes[kLanes] = {};
  const float* x = values.data();
  const size_t n = values.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
    }
  }
  for (size_t l = 0; i < n; ++i, ++l) {
    lanes[l] += static_cast<double>(x[i]) * x[i];
  }
  double sum = 0;
  for (double lane : lanes) sum += lane;
  return sum;
}

namespace {

// Bytes of a tensor of `elements` floats in `encoding`'s payload.
uint64_t PayloadBytes(int64_t elements, v1::Encoding encoding) {
  const uint64_t n = static_cast<uint64_t>(elements);
  return encoding == v1::ENCODING_QUANTIZED ? sizeof(float) + n
                                            : n * sizeof(float);
}

// The quantized payload of `values` (see ENCODING_QUANTIZED in the header).
// A NaN or infinite value makes the scale NaN, which the receiver rejects as
// it rejects a non-finite dense value.
std::string Quantize(absl::Span<const float> values) {
  float largest = 0;
  for (float v : values) largest = std::max(largest, std::abs(v));
  const float scale = AllFinite(values)
                          ? largest / 127
                          : std::numeric_limits<float>::quiet_NaN();
  std::string payload(sizeof(float) + values.size(), '\0');
  std::memcpy(payload.data(), &scale, sizeof(float));
  if (scale > 0) {
    char* q = payload.data() + sizeof(float);
    for (size_t i = 0; i < values.size(); ++i) {
      const float level =
          std::clamp(std::nearbyint(values[i] / scale), -127.0f, 127.0f);
      q[i] = static_cast<char>(static_cast<int8_t>(level));
    }
  }
  return payload;
}

}  // namespace

v1::Encoding UpdateEncoding(v1::Encoding encoding) {
  return encoding == v1::ENCODING_QUANTIZED ? encoding : v1::ENCODING_DENSE;
}

int64_t PayloadBytes(const ModelSpec& spec, v1::Encoding encoding) {
  uint64_t total = 0;
  for (const TensorSpec& t : spec.tensors) {
    total += PayloadBytes(t.num_elements, UpdateEncoding(encoding));
  }
  return static_cast<int64_t>(total);
}

absl::StatusOr<v1::Encoding> ParseUpdateEncoding(absl::string_view name) {
  if (name == "dense") return v1::ENCODING_DENSE;
  if (name == "int8") return v1::ENCODING_QUANTIZED;
  return absl::InvalidArgumentError(
      absl::StrCat("\"", name, "\" is neither dense nor int8"));
}

ChunkWriter::ChunkWriter(const ModelSpec& spec, absl::Span<const float> values,
                         size_t chunk_bytes, v1::Encoding encoding)
    : spec_(spec),
      values_(values),
      chunk_bytes_(
          std::clamp<size_t>(chunk_bytes & ~size_t{3}, 4, kMaxChunkBytes)),
      encoding_(UpdateEncoding(encoding)),
      total_bytes_(PayloadBytes(spec, encoding_)) {}

bool ChunkWriter::Next(v1::TensorChunk* chunk) {
  absl::string_view data;
  if (!Next(chunk, &data)) return false;
  chunk->set_data(data.data(), data.size());
  return true;
}

bool ChunkWriter::Next(v1::TensorChunk* chunk, absl::string_view* data_view) {
  if (tensor_ == spec_.tensors.size()) return false;
  const TensorSpec& t = spec_.tensors[tensor_];
  const uint64_t total = PayloadBytes(t.num_elements, encoding_);
  const char* payload;
  if (encoding_ == v1::ENCODING_QUANTIZED) {
    if (offset_ == 0) {
      quantized_ = Quantize(values_.subspan(t.offset, t.num_elements));
    }
    payload = quantized_.data();
  } else {
    payload = reinterpret_cast<const char*>(values_.data() + t.offset);
  }
  const uint64_t n = std::min<uint64_t>(chunk_bytes_, total - offset_);
  const char* data = payload + offset_;

  chunk->Clear();
  chunk->set_name(t.name);
  for (int64_t d : t.shape) chunk->add_shape(d);
  chunk->set_dtype(v1::DTYPE_FLOAT32);
  chunk->set_encoding(encoding_);
  chunk->set_total_bytes(total);
  chunk->set_offset(offset_);
  *data_view = absl::string_view(data, n);
  const uint32_t crc = Crc32c(data, n);
  chunk->set_chunk_crc32c(crc);
  // CRC of the whole tensor, from its chunks' (no second pass over the data).
  tensor_crc_ = offset_ == 0 ? crc : ConcatCrc32c(tensor_crc_, crc, n);
  offset_ += n;
  if (offset_ == total) {
    chunk->set_last(true);
    chunk->set_tensor_crc32c(tensor_crc_);
    ++tensor_;
    offset_ = 0;
  }
  return true;
}

ChunkAssembler::ChunkAssembler(const ModelSpec& spec, absl::Span<float> out,
                               bool require_finite, size_t max_chunk_bytes,
                               v1::Encoding encoding)
    : spec_(spec),
      out_(out),
      require_finite_(require_finite),
      max_chunk_bytes_(max_chunk_bytes),
      encoding_(UpdateEncoding(encoding)) {}

absl::Status ChunkAssembler::Add(const v1::TensorChunk& chunk) {
  const absl::string_view data = chunk.data();
  return Add(chunk, absl::MakeConstSpan(&data, 1));
}

absl::Status ChunkAssembler::Add(const v1::TensorChunk& chunk,
                                 absl::Span<const absl::string_view> data) {
  if (!error_.ok()) return error_;
  error_ = AddChunk(chunk, data);
  return error_;
}

absl::Status ChunkAssembler::AddChunk(
    const v1::TensorChunk& chunk, absl::Span<const absl::string_view> pieces) {
  if (complete()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk for tensor ", chunk.name(),
                     " after the last tensor of ", spec_.name));
  }
  const TensorSpec& t = spec_.tensors[tensor_];
  if (chunk.name() != t.name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a chunk of tensor ", t.name, ", got ", chunk.name()));
  }
  if (!std::equal(chunk.shape().begin(), chunk.shape().end(), t.shape.begin(),
                  t.shape.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": shape ",
                     ShapeString({chunk.shape().data(),
                                  static_cast<size_t>(chunk.shape_size())}),
                     ", want ", ShapeString(t.shape)));
  }
  if (chunk.dtype() != v1::DTYPE_FLOAT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": dtype ",
                     v1::DType_Name(chunk.dtype()), ", want DTYPE_FLOAT32"));
  }
  if (chunk.encoding() != encoding_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": encoding ", v1::Encoding_Name(chunk.encoding()),
        ", want ", v1::Encoding_Name(encoding_), " (the update header's)"));
  }
  const bool quantized = encoding_ == v1::ENCODING_QUANTIZED;
  const uint64_t total = PayloadBytes(t.num_elements, encoding_);
  if (chunk.total_bytes() != total) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": expected ", total, " bytes, got ",
                     chunk.total_bytes()));
  }
  size_t size = 0;
  for (absl::string_view piece : pieces) size += piece.size();
  if (size > max_chunk_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tensor ", t.name, ": chunk of ", size, " bytes, limit ",
                     max_chunk_bytes_));
  }
  if (chunk.offset() != offset_) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": chunk at byte ", chunk.offset(),
                     ", expected ", offset_));
  }
  if (size == 0 || size > total - offset_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": chunk of ", size, " bytes at byte ", offset_,
        " does not fit its payload of ", total, " bytes"));
  }
  if (quantized && offset_ == 0 && size < sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name,
                     ": the first chunk of a quantized tensor must hold its "
                     "4-byte scale, got ",
                     size, " bytes"));
  }
  uint32_t crc = 0;  // Crc32c of no bytes
  for (absl::string_view piece : pieces) {
    crc = ExtendCrc32c(crc, piece.data(), piece.size());
  }
  if (crc != chunk.chunk_crc32c()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": checksum mismatch in chunk at byte ", offset_));
  }
  const bool ends = offset_ + size == total;
  if (ends != chunk.last()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": chunk at byte ", offset_,
                     ends ? " completes the tensor but is not marked last"
                          : " is marked last but the tensor is incomplete"));
  }
  const uint32_t tensor_crc =
      offset_ == 0 ? crc : ConcatCrc32c(tensor_crc_, crc, size);
  if (ends && tensor_crc != chunk.tensor_crc32c()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": whole-tensor checksum mismatch"));
  }
  float* dst;
  size_t decoded;
  if (quantized) {
    size_t skip = 0;  // payload bytes of this chunk before its first int8
    if (offset_ == 0) {
      CopyPrefix(pieces, reinterpret_cast<char*>(&scale_), sizeof(float));
      if (!(scale_ >= 0 && std::isfinite(scale_))) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", t.name, ": quantization scale ", scale_,
                         " is not a finite number >= 0"));
      }
      skip = sizeof(float);
    }
    // Element e sits at payload byte 4 + e.
    dst = out_.data() + t.offset + (offset_ + skip - sizeof(float));
    float* next = dst;
    const float scale = scale_;
    ForEachPiece(pieces, skip, [&next, scale](const char* q, size_t n) {
      for (size_t i = 0; i < n; ++i) {
        next[i] = scale * static_cast<float>(static_cast<int8_t>(q[i]));
      }
      next += n;
    });
    decoded = size - skip;
  } else {
    // Chunks may split the payload at any byte, a value across two chunks
    // included: the bytes land where they belong, and the values this chunk
    // completes are checked.
    char* next = reinterpret_cast<char*>(out_.data() + t.offset) + offset_;
    ForEachPiece(pieces, 0, [&next](const char* bytes, size_t n) {
      std::memcpy(next, bytes, n);
      next += n;
    });
    const size_t first = offset_ / sizeof(float);
    dst = out_.data() + t.offset + first;
    decoded = (offset_ + size) / sizeof(float) - first;
  }
  // The values this chunk completed, while they are in cache.
  const double squares = SumOfSquares({dst, decoded});
  if (require_finite_ && !std::isfinite(squares)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name,
                     ": NaN or infinite value in chunk at byte ", offset_));
  }
  sum_of_squares_ += squares;
  tensor_crc_ = tensor_crc;
  offset_ += size;
  bytes_received_ += static_cast<int64_t>(size);
  if (ends) {
    ++tensor_;
    offset_ = 0;
  }
  return absl::OkStatus();
}

absl::Status ChunkAssembler::Finish() const {
  if (!error_.ok()) return error_;
  if (complete()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("stream ended before tensor ", spec_.tensors[tensor_].name,
                   " was complete (", bytes_received_, " of ",
                   PayloadBytes(spec_, encoding_), " bytes)"));
}

}  // namespace fedlearn
