#ifndef FEDLEARN_COMMON_CHUNK_WIRE_H_
#define FEDLEARN_COMMON_CHUNK_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "fedlearn/v1/coordinator.pb.h"

namespace fedlearn {

// A chunk message read in place. Protobuf copies a bytes field out of the
// buffers a message arrived in; a chunk's payload is most of every byte an
// update brings, so the receiver leaves it where gRPC put it and parses only
// the chunk's other fields: the payload is then copied once, from gRPC's
// buffers into the staging buffer (ChunkAssembler::Add), and no chunk-sized
// string is allocated per push.
struct ChunkInPlace {
  v1::TensorChunk fields;               // every field but `data` (left empty)
  std::vector<absl::string_view> data;  // the payload, in order, in place
  size_t data_bytes = 0;                // their total size

 private:
  friend bool ReadChunkInPlace(absl::Span<const absl::string_view>, uint32_t,
                               ChunkInPlace*);
  std::string fields_wire_;  // the other fields' bytes, reused between reads
};

// Reads `message`, the wire bytes of one protobuf message in pieces as they
// lie in memory (gRPC's slices), when all it holds is field number `field`, a
// TensorChunk: true, and `out` holds what protobuf would have parsed, the
// payload as views into `message`. False for anything else (another field, the
// chunk or its payload given twice, malformed bytes): the caller then parses
// the message with protobuf. The in-place read is a faster way to the same
// result, never a different one (fuzz/chunk_wire_fuzzer.cc holds it to that).
bool ReadChunkInPlace(absl::Span<const absl::string_view> message,
                      uint32_t field, ChunkInPlace* out);

// The sender's side: the wire bytes of a message whose field `field` is
// `chunk` with a payload of `payload_bytes` as its data, but for the payload
// itself. `before` + the payload + `after` is byte for byte what protobuf
// writes, so a sender can send the payload from where it lies. `chunk` must
// have no data of its own, and `payload_bytes` must not be 0.
struct ChunkAround {
  std::string before;
  std::string after;
};
ChunkAround WriteChunkAround(uint32_t field, const v1::TensorChunk& chunk,
                             size_t payload_bytes);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_CHUNK_WIRE_H_
