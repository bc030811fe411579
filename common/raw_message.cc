#include "common/raw_message.h"

#include <cassert>
#include <cstdint>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace fedlearn {
namespace {

// A length-delimited field's key (wire type 2).
uint32_t LengthDelimitedKey(int field) {
  return (static_cast<uint32_t>(field) << 3) | 2;
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

}  // namespace

grpc::Slice SerializeToSlice(const google::protobuf::MessageLite& message) {
  grpc_slice slice = grpc_slice_malloc(message.ByteSizeLong());
  message.SerializeWithCachedSizesToArray(GRPC_SLICE_START_PTR(slice));
  return grpc::Slice(slice, grpc::Slice::STEAL_REF);
}

std::vector<grpc::Slice> SerializeChunkAround(
    int chunk_field, const v1::TensorChunk& chunk, absl::string_view payload,
    std::shared_ptr<const void> owner) {
  assert(chunk.data().empty() && !payload.empty());
  // Protobuf writes a message's fields in field number order: those before
  // the data go before it, the rest after.
  v1::TensorChunk before = chunk, after = chunk;
  const google::protobuf::Descriptor* d = chunk.GetDescriptor();
  const google::protobuf::Reflection* r = chunk.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    r->ClearField(
        f->number() < v1::TensorChunk::kDataFieldNumber ? &after : &before, f);
  }
  const std::string head = before.SerializeAsString();
  const std::string tail = after.SerializeAsString();
  std::string data_key;
  AppendVarint(LengthDelimitedKey(v1::TensorChunk::kDataFieldNumber),
               &data_key);
  AppendVarint(payload.size(), &data_key);
  std::string prefix;
  AppendVarint(LengthDelimitedKey(chunk_field), &prefix);
  AppendVarint(head.size() + data_key.size() + payload.size() + tail.size(),
               &prefix);
  prefix += head;
  prefix += data_key;
  std::vector<grpc::Slice> slices;
  slices.emplace_back(prefix);
  // gRPC only reads a slice it sends; the const_cast is its API's.
  slices.emplace_back(
      const_cast<char*>(payload.data()), payload.size(),
      [](void* held) {
        delete static_cast<std::shared_ptr<const void>*>(held);
      },
      new std::shared_ptr<const void>(std::move(owner)));
  if (!tail.empty()) slices.emplace_back(tail);
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
