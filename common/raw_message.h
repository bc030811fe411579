#ifndef FEDLEARN_COMMON_RAW_MESSAGE_H_
#define FEDLEARN_COMMON_RAW_MESSAGE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <vector>

#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"

namespace fedlearn {

// Messages as gRPC's raw methods carry them (grpc::ByteBuffer), for callers
// that write bytes serialized once or read a chunk where it arrived
// (ReadChunkInPlace).

// `message`'s wire bytes in a slice of their own: a ByteBuffer made from it
// holds a reference, so any number of streams can write it without a copy.
grpc::Slice SerializeToSlice(const google::protobuf::MessageLite& message);

// A received message's bytes as they lie in gRPC's buffers: `slices` holds
// references to them (valid while it does), `pieces` views them in order.
// Both are cleared first; false (both empty) when gRPC cannot give them.
bool ViewMessage(const grpc::ByteBuffer& message,
                 std::vector<grpc::Slice>* slices,
                 std::vector<absl::string_view>* pieces);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_RAW_MESSAGE_H_
