#include "common/grpc_status.h"

#include <string>

namespace fedlearn {
namespace {

#define FEDLEARN_SAME_CODE_(name)                                              \
  static_assert(static_cast<int>(absl::StatusCode::k##name) ==                 \
                    static_cast<int>(grpc::StatusCode::FEDLEARN_UPPER_##name), \
                "absl and grpc disagree on " #name)
#define FEDLEARN_UPPER_Ok OK
#define FEDLEARN_UPPER_Cancelled CANCELLED
#define FEDLEARN_UPPER_Unknown UNKNOWN
#define FEDLEARN_UPPER_InvalidArgument INVALID_ARGUMENT
#define FEDLEARN_UPPER_DeadlineExceeded DEADLINE_EXCEEDED
#define FEDLEARN_UPPER_NotFound NOT_FOUND
#define FEDLEARN_UPPER_AlreadyExists ALREADY_EXISTS
#define FEDLEARN_UPPER_PermissionDenied PERMISSION_DENIED
#define FEDLEARN_UPPER_ResourceExhausted RESOURCE_EXHAUSTED
#define FEDLEARN_UPPER_FailedPrecondition FAILED_PRECONDITION
#define FEDLEARN_UPPER_Aborted ABORTED
#define FEDLEARN_UPPER_OutOfRange OUT_OF_RANGE
#define FEDLEARN_UPPER_Unimplemented UNIMPLEMENTED
#define FEDLEARN_UPPER_Internal INTERNAL
#define FEDLEARN_UPPER_Unavailable UNAVAILABLE
#define FEDLEARN_UPPER_DataLoss DATA_LOSS
#define FEDLEARN_UPPER_Unauthenticated UNAUTHENTICATED
FEDLEARN_SAME_CODE_(Ok);
FEDLEARN_SAME_CODE_(Cancelled);
FEDLEARN_SAME_CODE_(Unknown);
FEDLEARN_SAME_CODE_(InvalidArgument);
FEDLEARN_SAME_CODE_(DeadlineExceeded);
FEDLEARN_SAME_CODE_(NotFound);
FEDLEARN_SAME_CODE_(AlreadyExists);
FEDLEARN_SAME_CODE_(PermissionDenied);
FEDLEARN_SAME_CODE_(ResourceExhausted);
FEDLEARN_SAME_CODE_(FailedPrecondition);
FEDLEARN_SAME_CODE_(Aborted);
FEDLEARN_SAME_CODE_(OutOfRange);
FEDLEARN_SAME_CODE_(Unimplemented);
FEDLEARN_SAME_CODE_(Internal);
FEDLEARN_SAME_CODE_(Unavailable);
FEDLEARN_SAME_CODE_(DataLoss);
FEDLEARN_SAME_CODE_(Unauthenticated);

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace fedlearn
