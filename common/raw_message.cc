#include "common/raw_message.h"

namespace fedlearn {

grpc::Slice SerializeToSlice(const google::protobuf::MessageLite& message) {
  grpc_slice slice = grpc_slice_malloc(message.ByteSizeLong());
  message.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(slice));
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
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
