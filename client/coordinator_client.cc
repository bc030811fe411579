#include "client/coordinator_client.h"

#include <grpcpp/client_context.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace fedlearn {

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                     size_t chunk_bytes,
                                     absl::Duration call_timeout)
    : stub_(v1::Coordinator::NewStub(std::move(channel))),
      chunk_bytes_(chunk_bytes),
      call_timeout_(call_timeout) {}

void CoordinatorClient::SetCallDeadline(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
}

void CoordinatorClient::Authorize(grpc::ClientContext* context) const {
  if (!token_.empty())
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
}

absl::StatusOr<v1::JoinResponse> CoordinatorClient::Join(
    const v1::JoinRequest& request) {
  grpc::ClientContext context;
  SetCallDeadline(&context);
  v1::JoinResponse response;
  FEDLEARN_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->Join(&context, request, &response)));
  FEDLEARN_ASSIGN_OR_RETURN(spec_, FromProto(response.model()));
  client_id_ = response.client_id();
  token_ = response.session_token();
  return response;
}

absl::StatusOr<CoordinatorClient::ReceivedTask>
CoordinatorClient::RequestUpdate(absl::Duration max_wait) {
  grpc::ClientContext context;
  Authorize(&context);
  // The poll may be held `max_wait`, then the weights take their time: a
  // generous deadline still bounds a coordinator that stops answering.
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + max_wait + absl::Minutes(2)));
  v1::RequestUpdateRequest request;
  request.set_client_id(client_id_);
  request.set_max_wait_ms(absl::ToInt64Milliseconds(max_wait));
  std::unique_ptr<grpc::ClientReader<v1::TaskMessage>> reader =
      stub_->RequestUpdate(&context, request);

  ReceivedTask received;
  v1::TaskMessage message;
  bool have_header = false;
  std::optional<ChunkAssembler> assembler;
  absl::Status stream_error;
  while (reader->Read(&message)) {
    if (!have_header) {
      if (!message.has_task()) {
        stream_error =
            absl::InternalError("task stream did not start with a task");
        break;
      }
      received.task = message.task();
      received.header_received = absl::Now();
      have_header = true;
      if (received.task.num_tensors() > 0) {
        received.weights.resize(static_cast<size_t>(spec_.num_parameters));
        assembler.emplace(spec_, absl::MakeSpan(received.weights),
                          /*require_finite=*/true);
      }
      continue;
    }
    if (!message.has_chunk() || !assembler.has_value()) {
      stream_error =
          absl::InternalError("unexpected message in the task stream");
      break;
    }
    if (absl::Status s = assembler->Add(message.chunk()); !s.ok()) {
      stream_error = absl::DataLossError(
          absl::StrCat("weights from the coordinator: ", s.message()));
      break;
    }
  }
  if (!stream_error.ok()) {
    context.TryCancel();
    reader->Finish();
    return stream_error;
  }
  FEDLEARN_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  if (!have_header)
    return absl::InternalError("task stream ended without a task");
  if (assembler.has_value()) {
    if (absl::Status s = assembler->Finish(); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("weights from the coordinator: ", s.message()));
    }
  }
  return received;
}

absl::StatusOr<v1::PushGradientResponse> CoordinatorClient::PushMessages(
    const std::vector<v1::PushGradientRequest>& messages) {
  grpc::ClientContext context;
  Authorize(&context);
  v1::PushGradientResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientRequest>> writer =
      stub_->PushGradient(&context, &response);
  for (const v1::PushGradientRequest& message : messages) {
    if (!writer->Write(message))
      break;  // the coordinator ended the call; Finish says why
  }
  writer->WritesDone();
  FEDLEARN_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return response;
}

absl::StatusOr<v1::PushGradientResponse> CoordinatorClient::PushUpdate(
    v1::UpdateHeader header, absl::Span<const float> delta,
    absl::Time deadline) {
  if (delta.size() != static_cast<size_t>(spec_.num_parameters)) {
    return absl::InvalidArgumentError(absl::StrCat("update has ", delta.size(),
                                                   " values, model has ",
                                                   spec_.num_parameters));
  }
  ChunkWriter chunks(spec_, delta, chunk_bytes_, header.encoding());
  header.set_encoding(chunks.encoding());
  // One message, refilled chunk by chunk: the update is encoded as it goes.
  v1::PushGradientRequest message;
  return Push(
      std::move(header), deadline, [&]() -> const v1::PushGradientRequest* {
        return chunks.Next(message.mutable_chunk()) ? &message : nullptr;
      });
}

absl::StatusOr<v1::PushGradientResponse> CoordinatorClient::PushEncoded(
    v1::UpdateHeader header, absl::Span<const v1::PushGradientRequest> chunks,
    absl::Time deadline) {
  size_t next = 0;
  return Push(std::move(header), deadline,
              [&]() -> const v1::PushGradientRequest* {
                return next < chunks.size() ? &chunks[next++] : nullptr;
              });
}

absl::StatusOr<v1::PushGradientResponse> CoordinatorClient::Push(
    v1::UpdateHeader header, absl::Time deadline,
    absl::FunctionRef<const v1::PushGradientRequest*()> next_chunk) {
  grpc::ClientContext context;
  if (deadline != absl::InfiniteFuture()) {
    context.set_deadline(absl::ToChronoTime(deadline));
  }
  Authorize(&context);
  v1::PushGradientResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientRequest>> writer =
      stub_->PushGradient(&context, &response);
  header.set_client_id(client_id_);
  v1::PushGradientRequest first;
  *first.mutable_header() = std::move(header);
  bool open = writer->Write(first);
  // Wait for the go-ahead (the coordinator's initial metadata, sent once the
  // push is admitted and a receive buffer is free) so that a queued push holds
  // no data in the coordinator's transport buffers; a rejected push ends here
  // without sending its update.
  if (open) writer->WaitForInitialMetadata();
  while (open) {
    const v1::PushGradientRequest* chunk = next_chunk();
    if (chunk == nullptr) break;
    open = writer->Write(*chunk);
  }
  writer->WritesDone();
  FEDLEARN_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return response;
}

absl::Status CoordinatorClient::ReportEval(v1::ReportEvalRequest request) {
  grpc::ClientContext context;
  SetCallDeadline(&context);
  Authorize(&context);
  request.set_client_id(client_id_);
  v1::ReportEvalResponse response;
  return FromGrpcStatus(stub_->ReportEval(&context, request, &response));
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorClient::Heartbeat(
    v1::HeartbeatRequest request) {
  grpc::ClientContext context;
  SetCallDeadline(&context);
  Authorize(&context);
  request.set_client_id(client_id_);
  v1::HeartbeatResponse response;
  FEDLEARN_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->Heartbeat(&context, request, &response)));
  return response;
}

absl::StatusOr<v1::GetStatusResponse> CoordinatorClient::GetStatus() {
  grpc::ClientContext context;
  SetCallDeadline(&context);
  v1::GetStatusResponse response;
  FEDLEARN_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->GetStatus(&context, v1::GetStatusRequest(), &response)));
  return response;
}

}  // namespace fedlearn
