// The update receiver: any sequence of TensorChunk messages, dense or int8,
// into ChunkAssembler. It must never crash, write outside its buffer or accept
// a stream that does not re-encode to itself: a dense stream it accepts is
// re-encoded by ChunkWriter and assembled again to the same bits, and with
// require_finite every accepted value is finite.
//
// The payload goes in as three pieces (ChunkAssembler::Add's form for a chunk
// read in place); the re-encoded stream, in one.
//
// Input: one byte of options (bit 0: quantized, bit 1: require finite, bits
// 2-7: the chunk size limit in 16-byte steps), then length-prefixed serialized
// TensorChunk messages (fuzz_util.h).

#include <cstring>
#include <vector>

#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlearn;
  const ModelSpec& spec = fuzz::TinySpec();
  fuzz::Bytes in(data, size);
  const uint8_t options = in.Byte();
  const v1::Encoding encoding =
      options & 1 ? v1::ENCODING_QUANTIZED : v1::ENCODING_DENSE;
  const bool require_finite = options & 2;
  const size_t max_chunk = 16 * (1 + (options >> 2));
  std::vector<float> out(spec.num_parameters, 0.f);
  ChunkAssembler assembler(spec, absl::MakeSpan(out), require_finite, max_chunk,
                           encoding);
  absl::Status status;
  while (!in.empty() && status.ok()) {
    const absl::string_view piece = in.Piece();
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(piece.data(), static_cast<int>(piece.size()))) {
      continue;
    }
    // The payload in three pieces, as a chunk read in place arrives.
    const absl::string_view payload = chunk.data();
    const size_t third = payload.size() / 3;
    const absl::string_view pieces[] = {payload.substr(0, third),
                                        payload.substr(third, third),
                                        payload.substr(2 * third)};
    status = assembler.Add(chunk, pieces);
  }
  if (!status.ok() || !assembler.Finish().ok()) return 0;
  if (require_finite && !AllFinite(out)) std::abort();
  if (encoding == v1::ENCODING_DENSE) {
    std::vector<float> again(spec.num_parameters, 1.f);
    ChunkAssembler reader(spec, absl::MakeSpan(again), require_finite,
                          kMaxChunkBytes, encoding);
    ChunkWriter writer(spec, out, 64);
    v1::TensorChunk chunk;
    while (writer.Next(&chunk)) {
      if (!reader.Add(chunk).ok()) std::abort();
    }
    if (!reader.Finish().ok() || std::memcmp(again.data(), out.data(),
                                             out.size() * sizeof(float)) != 0) {
      std::abort();
    }
  }
  return 0;
}
