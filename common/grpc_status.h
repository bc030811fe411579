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

// What a RequestUpdate that ends CANCELLED says when the run moved past its
// task before the weights were all sent (README, "Slow clients"); a client
// that tells it from a stalled download's cut-off looks for these words.
inline constexpr char kMovedOnBeforeWeightsSent[] =
    "moved on before its weights were all sent";

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_GRPC_STATUS_H_
