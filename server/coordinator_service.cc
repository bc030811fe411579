#include "server/coordinator_service.h"

#include <atomic>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tensor_codec.h"

namespace fedlearn {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// The session token from "authorization: Bearer <token>"; empty when absent.
absl::string_view BearerToken(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return {};
  absl::string_view value(it->second.data(), it->second.size());
  if (value.size() < kBearer.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
    return {};
  }
  return value.substr(kBearer.size());
}

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

// RequestUpdate: waits (through RunController::Poll) for the client's task,
// then writes the task header and, for TRAIN and EVALUATE, the weights chunk by
// chunk from the task's immutable snapshot. One message in flight at a time
// bounds memory per stream.
class CoordinatorService::TaskWriter final
    : public grpc::ServerWriteReactor<v1::TaskMessage> {
 public:
  TaskWriter(CoordinatorService* service, grpc::CallbackServerContext* context,
             const v1::RequestUpdateRequest& request)
      : controller_(service->controller_) {
    if (absl::Status s = service->Authorize(context, request.client_id());
        !s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    poll_id_ = controller_->Poll(
        request.client_id(), absl::Milliseconds(request.max_wait_ms()),
        [this](absl::StatusOr<Task> task) { Start(std::move(task)); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client went away mid-stream; it will poll again and get the task
      // again.
      Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                          "stream closed by the client"));
      return;
    }
    if (chunks_.has_value() && chunks_->Next(message_.mutable_chunk())) {
      StartWrite(&message_);
      return;
    }
    Finish(grpc::Status::OK);
  }

  void OnCancel() override { controller_->CancelPoll(poll_id_.load()); }

  void OnDone() override { delete this; }

 private:
  void Start(absl::StatusOr<Task> task) {
    if (!task.ok()) {
      Finish(ToGrpcStatus(task.status()));
      return;
    }
    task_ = *std::move(task);
    v1::Task* header = message_.mutable_task();
    header->set_type(task_.type);
    header->set_round(task_.round);
    header->set_run_validation(task_.run_validation);
    header->set_retry_after_ms(absl::ToInt64Milliseconds(task_.retry_after));
    if (task_.deadline != absl::InfiniteFuture()) {
      header->set_deadline_ms(std::max<int64_t>(
          0, absl::ToInt64Milliseconds(task_.deadline - absl::Now())));
    }
    if (task_.weights != nullptr) {
      const ModelSpec& spec = controller_->spec();
      chunks_.emplace(spec, absl::MakeConstSpan(*task_.weights),
                      static_cast<size_t>(controller_->chunk_bytes()));
      header->set_num_tensors(static_cast<int32_t>(spec.tensors.size()));
      header->set_payload_bytes(chunks_->total_bytes());
    }
    if (task_.plan != nullptr) *header->mutable_plan() = *task_.plan;
    StartWrite(&message_);
  }

  RunController* const controller_;
  std::atomic<uint64_t> poll_id_{0};
  Task task_;  // keeps the weights alive while they are written
  std::optional<ChunkWriter> chunks_;
  v1::TaskMessage message_;
};

// PushGradient: reads the header, admits it (so a push that cannot count is
// turned away before its update is read), waits for a staging buffer, then
// verifies and copies each chunk into it. Only a complete, verified update is
// aggregated (RunController::CommitUpdate); anything else is rejected whole and
// leaves the round's aggregate untouched.
class CoordinatorService::UpdateReader final
    : public grpc::ServerReadReactor<v1::PushGradientRequest> {
 public:
  UpdateReader(CoordinatorService* service,
               grpc::CallbackServerContext* context,
               v1::PushGradientResponse* response)
      : service_(service), context_(context), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      EndOfStream();
    } else if (!header_.has_value()) {
      OnHeader();
    } else if (!request_.has_chunk()) {
      Reject(Rejection::kInvalid,
             absl::InvalidArgumentError(
                 "after the header a push carries only chunks"));
    } else if (absl::Status s = assembler_->Add(request_.chunk()); !s.ok()) {
      Reject(s.code() == absl::StatusCode::kResourceExhausted
                 ? Rejection::kTooLarge
                 : Rejection::kInvalid,
             s);
    } else {
      StartRead(&request_);
    }
  }

  void OnCancel() override { service_->staging_.Cancel(waiter_id_.load()); }

  void OnDone() override { delete this; }

 private:
  void OnHeader() {
    if (!request_.has_header()) {
      FinishWith(absl::InvalidArgumentError(
          "the first message of a push must be its header"));
      return;
    }
    header_ = request_.header();
    if (absl::Status s = service_->Authorize(context_, header_->client_id());
        !s.ok()) {
      FinishWith(s);
      return;
    }
    auto ticket = service_->controller_->AdmitUpdate(*header_, [this] {
      closed_by_round_.store(true);
      context_->TryCancel();
    });
    if (!ticket.ok()) {
      FinishWith(ticket.status());
      return;
    }
    ticket_ = *std::move(ticket);
    waiter_id_ = service_->staging_.Acquire(
        [this](StagingPool::Buffer buffer) { OnBuffer(std::move(buffer)); });
  }

  void OnBuffer(StagingPool::Buffer buffer) {
    if (buffer == nullptr) {
      FinishWith(
          absl::CancelledError("push cancelled while waiting to be received"));
      return;
    }
    buffer_ = std::move(buffer);
    assembler_.emplace(service_->controller_->spec(), absl::MakeSpan(*buffer_),
                       /*require_finite=*/true, kMaxChunkBytes,
                       header_->encoding());
    // Initial metadata is the go-ahead: a client that waits for it before
    // sending its chunks (CoordinatorClient does) has nothing but its header in
    // flight while queued.
    StartSendInitialMetadata();
    StartRead(&request_);
  }

  void EndOfStream() {
    if (!header_.has_value()) {
      FinishWith(absl::InvalidArgumentError("empty push: no header"));
      return;
    }
    if (context_->IsCancelled()) {
      if (!closed_by_round_.load())
        service_->controller_->RecordRejection(Rejection::kIncomplete);
      FinishWith(absl::CancelledError(
          closed_by_round_.load() ? "round closed before the update arrived"
                                  : "push cancelled"));
      return;
    }
    if (absl::Status s = assembler_->Finish(); !s.ok()) {
      Reject(Rejection::kIncomplete, s);
      return;
    }
    // From here the push no longer needs cutting off: if its round closes
    // first, the commit itself rejects it, and closing the round on this very
    // update must not cancel the call that carries the reply.
    ticket_->cancel->Disarm();
    auto result = service_->controller_->CommitUpdate(
        *ticket_, *header_, absl::MakeSpan(*buffer_),
        assembler_->bytes_received());
    if (result.ok()) *response_ = *std::move(result);
    FinishWith(result.status());
  }

  void Reject(Rejection reason, const absl::Status& status) {
    service_->controller_->RecordRejection(reason);
    FinishWith(absl::Status(
        status.code(),
        absl::StrCat("client ", header_->client_id(), ": ", status.message())));
  }

  // Gives back what the push holds before finishing, so the next push can
  // proceed.
  void FinishWith(const absl::Status& status) {
    if (ticket_.has_value()) ticket_->cancel->Disarm();
    assembler_.reset();
    if (buffer_ != nullptr) service_->staging_.Release(std::move(buffer_));
    Finish(ToGrpcStatus(status));
  }

  CoordinatorService* const service_;
  grpc::CallbackServerContext* const context_;
  v1::PushGradientResponse* const response_;
  v1::PushGradientRequest request_;
  std::optional<v1::UpdateHeader> header_;
  std::optional<Ticket> ticket_;  // once the header is admitted
  std::atomic<uint64_t> waiter_id_{0};
  std::atomic<bool> closed_by_round_{false};
  StagingPool::Buffer buffer_;
  std::optional<ChunkAssembler> assembler_;
};

CoordinatorService::CoordinatorService(RunController* controller)
    : controller_(controller),
      staging_(controller->options().max_concurrent_updates,
               static_cast<size_t>(controller->spec().num_parameters)) {}

CoordinatorService::~CoordinatorService() = default;

absl::Status CoordinatorService::Authorize(grpc::CallbackServerContext* context,
                                           absl::string_view client_id) {
  if (client_id.empty())
    return absl::InvalidArgumentError("client_id is empty");
  return controller_->Authorize(client_id, BearerToken(*context));
}

grpc::ServerUnaryReactor* CoordinatorService::Join(
    grpc::CallbackServerContext* context, const v1::JoinRequest* request,
    v1::JoinResponse* response) {
  absl::StatusOr<v1::JoinResponse> result = controller_->Join(*request);
  if (result.ok()) *response = *std::move(result);
  return FinishUnary(context, result.status());
}

grpc::ServerWriteReactor<v1::TaskMessage>* CoordinatorService::RequestUpdate(
    grpc::CallbackServerContext* context,
    const v1::RequestUpdateRequest* request) {
  return new TaskWriter(this, context, *request);
}

grpc::ServerReadReactor<v1::PushGradientRequest>*
CoordinatorService::PushGradient(grpc::CallbackServerContext* context,
                                 v1::PushGradientResponse* response) {
  return new UpdateReader(this, context, response);
}

grpc::ServerUnaryReactor* CoordinatorService::ReportEval(
    grpc::CallbackServerContext* context, const v1::ReportEvalRequest* request,
    v1::ReportEvalResponse* /*response*/) {
  absl::Status s = Authorize(context, request->client_id());
  if (s.ok()) s = controller_->ReportEval(*request);
  return FinishUnary(context, s);
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  absl::Status s = Authorize(context, request->client_id());
  if (s.ok()) {
    absl::StatusOr<v1::HeartbeatResponse> result =
        controller_->Heartbeat(*request);
    if (result.ok()) *response = *std::move(result);
    s = result.status();
  }
  return FinishUnary(context, s);
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(
    grpc::CallbackServerContext* context,
    const v1::GetStatusRequest* /*request*/, v1::GetStatusResponse* response) {
  *response = controller_->GetStatus();
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace fedlearn
