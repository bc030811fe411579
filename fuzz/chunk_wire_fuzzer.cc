// The in-place chunk reader against protobuf: for any bytes, cut into pieces
// anywhere, ReadChunkInPlace either declines (the receiver then parses with
// protobuf) or gives exactly what protobuf parses from the same bytes as a
// PushGradientRequest: its chunk's fields, the payload in order, and views
// that point into the pieces. And WriteChunkAround, the sender's side, writes
// that chunk again as protobuf would.
//
// Input: one byte that seeds where the message is cut, then the message.

#include <cstdlib>
#include <string>
#include <vector>

#include "common/chunk_wire.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlearn;
  if (size == 0) return 0;
  const absl::string_view message(reinterpret_cast<const char*>(data) + 1,
                                  size - 1);
  // Pieces of 1 to 16 bytes, from a generator seeded by the first byte; an
  // empty piece at the front and back, as a slice buffer may hold.
  std::vector<absl::string_view> pieces = {message.substr(0, 0)};
  uint32_t state = data[0] * 2654435761u + 1;
  for (size_t at = 0; at < message.size();) {
    state = state * 1103515245u + 12345u;
    const size_t n = 1 + (state >> 16) % 16;
    pieces.push_back(message.substr(at, n));
    at += pieces.back().size();
  }
  pieces.push_back(message.substr(message.size()));

  ChunkInPlace chunk;
  if (!ReadChunkInPlace(pieces, v1::PushGradientRequest::kChunkFieldNumber,
                        &chunk)) {
    return 0;
  }
  v1::PushGradientRequest parsed;
  if (!parsed.ParseFromArray(message.data(),
                             static_cast<int>(message.size())) ||
      !parsed.has_chunk() || !chunk.fields.data().empty()) {
    std::abort();
  }
  std::string payload;
  for (absl::string_view piece : chunk.data) {
    if (piece.data() < message.data() ||
        piece.data() + piece.size() > message.data() + message.size()) {
      std::abort();
    }
    payload.append(piece.data(), piece.size());
  }
  if (payload.size() != chunk.data_bytes) std::abort();
  v1::TensorChunk read = chunk.fields;
  read.set_data(payload);
  if (read.SerializeAsString() != parsed.chunk().SerializeAsString()) {
    std::abort();
  }
  // The sender's side: the bytes around the payload, with it, are what
  // protobuf writes for the chunk read.
  if (!payload.empty()) {
    const ChunkAround around =
        WriteChunkAround(v1::PushGradientRequest::kChunkFieldNumber,
                         chunk.fields, payload.size());
    v1::PushGradientRequest written;
    *written.mutable_chunk() = read;
    if (around.before + payload + around.after != written.SerializeAsString()) {
      std::abort();
    }
  }
  return 0;
}
