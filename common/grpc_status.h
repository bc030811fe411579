#ifndef FEDLEARN_COMMON_GRPC_STATUS_H_
#define FEDLEARN_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace fedlearn {

// The one bridge between the inside's absl::Status and the RPC edge's
// grpc::Status. The canonical codes are the same numbers in both (checked at
// compile time in the .cc).
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_GRPC_STATUS_H_
