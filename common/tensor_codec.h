#ifndef FEDLEARN_COMMON_TENSOR_CODEC_H_
#define FEDLEARN_COMMON_TENSOR_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/model_spec.h"
#include "fedlearn/v1/coordinator.pb.h"

namespace fedlearn {

// The largest chunk payload either side sends or accepts (the wire contract's
// limit).
inline constexpr size_t kMaxChunkBytes = size_t{1} << 20;

// The payload per chunk a C++ client pushes unless told otherwise. Each message
// costs both ends a fixed share of CPU whatever its size, so larger chunks are
// received faster, up to a point, and make gRPC keep larger read buffers per
// connection: the measurements and the memory it costs are in the README, "How
// updates are received".
inline constexpr size_t kDefaultPushChunkBytes = size_t{256} << 10;
static_assert(kDefaultPushChunkBytes <= kMaxChunkBytes);

// Conversions between the model spec and its wire form. FromProto validates:
// every tensor float32, positive dimensions, unique names, num_parameters
// consistent.
v1::ModelSpec ToProto(const ModelSpec& spec);
absl::StatusOr<ModelSpec> FromProto(const v1::ModelSpec& proto);

// A tensor's payload in each encoding:
//  - ENCODING_DENSE: its float32 values, little endian, in row-major order
//    (4 bytes per element).
//  - ENCODING_QUANTIZED: a float32 scale s >= 0, then one int8 q per element;
//    the value is s * q (4 + 1 byte per element). The writer picks s =
//    max|x| / 127 and q = x / s rounded to nearest, so each value is within
//    s / 2 of the original (up to float rounding; a tensor whose max|x| / 127
//    underflows to 0 is sent as zeros).

// The encodings updates travel in: ENCODING_QUANTIZED stays, anything else is
// ENCODING_DENSE (what ChunkWriter and ChunkAssembler make of `encoding`).
v1::Encoding UpdateEncoding(v1::Encoding encoding);

// Payload bytes of all of `spec`'s tensors in UpdateEncoding(`encoding`): what
// a ChunkWriter sends, what a complete ChunkAssembler received.
int64_t PayloadBytes(const ModelSpec& spec, v1::Encoding encoding);

// --update_encoding's names: "dense" (ENCODING_DENSE), "int8"
// (ENCODING_QUANTIZED); INVALID_ARGUMENT for anything else.
absl::StatusOr<v1::Encoding> ParseUpdateEncoding(absl::string_view name);

// Splits a flat float32 parameter vector into TensorChunk messages of at most
// `chunk_bytes` payload each (rounded down to a multiple of 4 bytes, at least
// 4, at most kMaxChunkBytes), tensor by tensor in the spec's order, in
// `encoding` (ENCODING_DENSE or ENCODING_QUANTIZED). Dense reads `values` in
// place; quantized encodes one tensor at a time as it gets to it. The caller
// keeps `spec` and `values` alive while writing. Not thread-safe.
class ChunkWriter {
 public:
  ChunkWriter(const ModelSpec& spec, absl::Span<const float> values,
              size_t chunk_bytes, v1::Encoding encoding = v1::ENCODING_DENSE);

  // Fills `chunk` with the next chunk; returns false (leaving `chunk` alone)
  // when every tensor has been written.
  bool Next(v1::TensorChunk* chunk);
  // The same, but leaves the chunk's data empty and views it in `data`
  // instead, without a copy: in `values` for a dense chunk, in the writer's
  // own buffer (valid until the next call) for a quantized one.
  bool Next(v1::TensorChunk* chunk, absl::string_view* data);

  // Total payload bytes the writer produces.
  int64_t total_bytes() const { return total_bytes_; }
  // The encoding it writes: UpdateEncoding of the one it was given.
  v1::Encoding encoding() const { return encoding_; }

 private:
  const ModelSpec& spec_;
  absl::Span<const float> values_;
  size_t chunk_bytes_;
  v1::Encoding encoding_;
  int64_t total_bytes_;
  std::string quantized_;  // the current tensor's quantized payload
  size_t tensor_ = 0;      // index of the tensor being written
  uint64_t offset_ = 0;    // byte offset within it
  uint32_t tensor_crc_ = 0;
};

// Reassembles chunks into a flat float32 vector, verifying each chunk: the
// tensor's name and order, shape, dtype, encoding (every chunk in the one the
// assembler expects) and payload size against the spec, the byte offset (no
// gaps, no overlap), the chunk's and the tensor's CRC-32C and the chunk size
// limit before decoding it, a quantized tensor's scale (in its first chunk,
// finite and >= 0), and, when asked, that every value is finite as it is
// decoded. Errors are INVALID_ARGUMENT (RESOURCE_EXHAUSTED for an oversized
// chunk) with a message naming the tensor; after an error the assembler
// accepts nothing more and `out` holds whatever was decoded, so assemble into a
// scratch buffer. Not thread-safe.
class ChunkAssembler {
 public:
  // `out` must hold spec.num_parameters floats and outlive the assembler.
  // `encoding`: ENCODING_DENSE or ENCODING_QUANTIZED.
  ChunkAssembler(const ModelSpec& spec, absl::Span<float> out,
                 bool require_finite, size_t max_chunk_bytes = kMaxChunkBytes,
                 v1::Encoding encoding = v1::ENCODING_DENSE);

  absl::Status Add(const v1::TensorChunk& chunk);
  // The same with the payload given apart, in pieces (in their order), in
  // place of chunk.data(), which is not read: a chunk read in place
  // (ReadChunkInPlace).
  absl::Status Add(const v1::TensorChunk& chunk,
                   absl::Span<const absl::string_view> data);

  // OK once every tensor has arrived whole; INVALID_ARGUMENT naming the first
  // missing tensor otherwise.
  absl::Status Finish() const;

  bool complete() const { return tensor_ == spec_.tensors.size(); }
  int64_t bytes_received() const { return bytes_received_; }
  // The sum of the squares of the values decoded so far (SumOfSquares, chunk
  // by chunk): the update's L2 norm without another pass over it.
  double sum_of_squares() const { return sum_of_squares_; }

 private:
  absl::Status AddChunk(const v1::TensorChunk& chunk,
                        absl::Span<const absl::string_view> data);

  const ModelSpec& spec_;
  absl::Span<float> out_;
  bool require_finite_;
  size_t max_chunk_bytes_;
  v1::Encoding encoding_;
  float scale_ = 0;      // the quantized tensor's, once its first chunk is in
  size_t tensor_ = 0;    // index of the tensor expected next
  uint64_t offset_ = 0;  // bytes of it received so far
  uint32_t tensor_crc_ = 0;
  int64_t bytes_received_ = 0;
  double sum_of_squares_ = 0;
  absl::Status error_;
};

// True iff every value is finite (no NaN, no infinity).
bool AllFinite(absl::Span<const float> values);

// The sum of the squares of `values`, in double, in eight interleaved partial
// sums added in a fixed order: the same on every machine. Finite exactly when
// every value is (a float's square and a model's sum of them stay far below
// double's range), so one pass gives both the norm and the finiteness check.
double SumOfSquares(absl::Span<const float> values);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_TENSOR_CODEC_H_
