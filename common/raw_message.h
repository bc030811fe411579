#ifndef FEDLEARN_COMMON_RAW_MESSAGE_H_
#define FEDLEARN_COMMON_RAW_MESSAGE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "google/protobuf/message_lite.h"

namespace fedlearn {

// Messages as gRPC's raw methods carry them (grpc::ByteBuffer), for callers
// that write bytes serialized once or read a chunk where it arrived
// (ReadChunkInPlace).

// `message`'s wire bytes in a slice of their own: a ByteBuffer made from it
// holds a reference, so any number of streams can write it without a copy.
grpc::Slice SerializeToSlice(const google::protobuf::MessageLite& message);

// The wire bytes of a message whose field `chunk_field` is `chunk` with
// `payload` as its data, byte for byte as protobuf serializes it, but with
// `payload` referenced rather than copied: a slice of the bytes before it, a
// slice over `payload` itself and a slice of the bytes after it. `chunk` must
// have no data of its own, and `payload` must not be empty. The payload slice
// holds `owner`, which keeps `payload`'s memory alive, until gRPC lets go of
// it, even after the caller's own references are gone.
std::vector<grpc::Slice> SerializeChunkAround(
    int chunk_field, const v1::TensorChunk& chunk, absl::string_view payload,
    std::shared_ptr<const void> owner);

// A received message's bytes as they lie in gRPC's buffers: `slices` holds
// references to them (valid while it does), `pieces` views them in order.
// Both are cleared first; false (both empty) when gRPC cannot give them.
bool ViewMessage(const grpc::ByteBuffer& message,
                 std::vector<grpc::Slice>* slices,
                 std::vector<absl::string_view>* pieces);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_RAW_MESSAGE_H_
