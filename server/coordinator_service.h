#ifndef FEDLEARN_SERVER_COORDINATOR_SERVICE_H_
#define FEDLEARN_SERVER_COORDINATOR_SERVICE_H_

#include <memory>

#include "fedlearn/v1/coordinator.grpc.pb.h"
#include "server/run_controller.h"
#include "server/staging_pool.h"

namespace fedlearn {

// The gRPC face of the coordinator (callback API): authenticates each call from
// its `authorization` metadata, turns wire messages into RunController calls
// and absl::Status into grpc::Status. RequestUpdate and PushGradient are one
// reactor per stream; no lock is held while a reactor starts a write or
// finishes. Thread-safe; `controller` must outlive it.
class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  explicit CoordinatorService(RunController* controller);
  ~CoordinatorService() override;

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override;
  grpc::ServerWriteReactor<v1::TaskMessage>* RequestUpdate(
      grpc::CallbackServerContext* context,
      const v1::RequestUpdateRequest* request) override;
  grpc::ServerReadReactor<v1::PushGradientRequest>* PushGradient(
      grpc::CallbackServerContext* context,
      v1::PushGradientResponse* response) override;
  grpc::ServerUnaryReactor* ReportEval(
      grpc::CallbackServerContext* context,
      const v1::ReportEvalRequest* request,
      v1::ReportEvalResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest* request,
                                      v1::GetStatusResponse* response) override;

 private:
  class TaskWriter;
  class UpdateReader;

  // Authorizes the call for `client_id` from its metadata.
  absl::Status Authorize(grpc::CallbackServerContext* context,
                         absl::string_view client_id);

  RunController* const controller_;
  StagingPool staging_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_COORDINATOR_SERVICE_H_
