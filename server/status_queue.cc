#include "server/status_queue.h"

#include <grpcpp/server_context.h>
#include <grpcpp/support/async_unary_call.h>

#include <utility>

#include "common/grpc_status.h"
#include "server/coordinator_service.h"
#include "server/run_controller.h"

namespace fedlearn {

// One GetStatus call, from its request to its answer; the tag of both events.
struct StatusQueue::Call {
  grpc::ServerContext context;
  v1::GetStatusRequest request;
  grpc::ServerAsyncResponseWriter<v1::GetStatusResponse> writer{&context};
  bool answered = false;
};

StatusQueue::StatusQueue(CoordinatorService* service,
                         const RunController* controller,
                         std::unique_ptr<grpc::ServerCompletionQueue> queue)
    : service_(service), controller_(controller), queue_(std::move(queue)) {}

StatusQueue::~StatusQueue() { Stop(); }

void StatusQueue::Start() {
  for (int i = 0; i < kOutstanding; ++i) Request();
  thread_ = std::thread([this] { Run(); });
}

void StatusQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  queue_->Shutdown();
  if (thread_.joinable()) {
    thread_.join();
    return;
  }
  // Never started: drained here, as gRPC wants of a queue it destroys.
  void* tag;
  bool ok;
  while (queue_->Next(&tag, &ok)) delete static_cast<Call*>(tag);
}

void StatusQueue::Request() {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  auto* call = new Call;
  service_->RequestGetStatus(&call->context, &call->request, &call->writer,
                             queue_.get(), queue_.get(), call);
}

void StatusQueue::Run() {
  void* tag;
  bool ok;
  // Next returns false once the queue is shut down and drained.
  while (queue_->Next(&tag, &ok)) {
    auto* call = static_cast<Call*>(tag);
    // An answer sent (or not: the client left), or a request failed because
    // the server is shutting down: that call is over.
    if (call->answered || !ok) {
      delete call;
      continue;
    }
    Request();  // the next caller's, before this one is answered
    call->answered = true;
    grpc::Status status;
    v1::GetStatusResponse response;
    if (absl::StatusOr<StatusQuery> query = ParseStatusRequest(call->request);
        query.ok()) {
      response = controller_->GetStatus(query->page, nullptr, query->history,
                                        query->client_ids);
    } else {
      status = ToGrpcStatus(query.status());
    }
    // An answer starts an operation on the queue, which must not be shut
    // down by then: once Stop began, the call is let go of unanswered (gRPC
    // cancels it; the server has shut down anyway).
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      delete call;
    } else if (status.ok()) {
      call->writer.Finish(response, status, call);
    } else {
      call->writer.FinishWithError(status, call);
    }
  }
}

}  // namespace fedlearn
