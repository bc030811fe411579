#include "common/raw_message.h"

#include <utility>

#include "common/chunk_wire.h"

namespace fedlearn {

grpc::Slice SerializeToSlice(const google::protobuf::MessageLite& message) {
  grpc_slice slice = grpc_slice_malloc(message.ByteSizeLong());
  message.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(slice));
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
}

std::vector<grpc::Slice> SerializeChunkAround(
    int chunk_field, const v1::TensorChunk& chunk, absl::string_view payload,
    std::shared_ptr<const void> owner) {
  const ChunkAround around = WriteChunkAround(
      static_cast<uint32_t>(chunk_field), chunk, payload.size());
  std::vector<grpc::Slice> slices;
  slices.emplace_back(around.before);
  // gRPC only reads a slice it sends; the const_cast is its API's.
  slices.emplace_back(
      const_cast<char*>(payload.data()), payload.size(),
      [](void* held) {
        delete static_cast<std::shared_ptr<const void>*>(held);
      },
      new std::shared_ptr<const void>(std::move(owner)));
  if (!around.after.empty()) slices.emplace_back(around.after);
  return slices;
}

bool ViewMessage(const grpc::ByteBuffer& message,
                 std::vector<grpc::Slice>* slices,
                 std::vector<absl::string_view>* pieces) {
  slices->clear();
  pieces->clear();
  if (!message.Dump(slices).ok()) {
    slices->clear();
    return false;
  }
  for (const grpc::Slice& slice : *slices) {
    pieces->emplace_back(reinterpret_cast<const char*>(slice.begin()),
                         slice.size());
  }
  return true;
}

}  // namespace fedlearn
