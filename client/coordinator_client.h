#ifndef FEDLEARN_CLIENT_COORDINATOR_CLIENT_H_
#define FEDLEARN_CLIENT_COORDINATOR_CLIENT_H_

#include <grpcpp/channel.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_spec.h"
#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"

namespace fedlearn {

// A client's side of fedlearn.v1.Coordinator: one joined client, its session
// token and the model spec, over a channel it shares with others if the caller
// wants. Chunks updates on the way out and verifies and reassembles weights on
// the way in. Every call blocks and returns the coordinator's status as an
// absl::Status. Not thread-safe: one client, one thread (use one object per
// agent).
class CoordinatorClient {
 public:
  // `chunk_bytes`: payload per pushed chunk (kDefaultPushChunkBytes: why).
  // `call_timeout`: how long Join, ReportEval, Heartbeat and GetStatus wait
  // for their answer (DEADLINE_EXCEEDED after it, which callers retry): a
  // coordinator that took the connection but does not answer cannot hold the
  // client forever. A poll waits its max_wait plus two minutes; a push is not
  // bounded by call_timeout (it may queue for a receive buffer; the
  // coordinator cuts off a push whose round closed): its caller gives it a
  // deadline, the round's plus a grace (Agent does), for a coordinator that
  // stops answering.
  explicit CoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                             size_t chunk_bytes = kDefaultPushChunkBytes,
                             absl::Duration call_timeout = absl::Seconds(30));

  // Joins and keeps the id, token and model spec for later calls.
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request);

  // A task with its weights (TRAIN and EVALUATE; empty otherwise).
  struct ReceivedTask {
    v1::Task task;
    std::vector<float> weights;
    // When the task's header arrived: the poll was held until then, and the
    // weights' transfer followed it.
    absl::Time header_received;
  };
  // Polls for the next task, letting the coordinator hold the poll up to
  // `max_wait`. The weights are verified (shape, dtype, checksums, all values
  // finite).
  absl::StatusOr<ReceivedTask> RequestUpdate(absl::Duration max_wait);

  // Pushes `delta` (num_parameters floats) as the update described by `header`,
  // int8-quantized when the header says ENCODING_QUANTIZED and dense otherwise
  // (the header's encoding is set to match); its client_id is filled in.
  // DEADLINE_EXCEEDED if it has not been answered by `deadline`.
  absl::StatusOr<v1::PushGradientResponse> PushUpdate(
      v1::UpdateHeader header, absl::Span<const float> delta,
      absl::Time deadline = absl::InfiniteFuture());

  // Pushes an update already cut into chunk messages (each with its `chunk`
  // set, as PushUpdate cuts it; `header`'s encoding must match them): for a
  // caller that sends the same update many times, such as a load generator,
  // which encodes it once. The messages are sent as they are, not checked.
  absl::StatusOr<v1::PushGradientResponse> PushEncoded(
      v1::UpdateHeader header, absl::Span<const v1::PushGradientRequest> chunks,
      absl::Time deadline = absl::InfiniteFuture());

  // Sends a push made of exactly these messages, for tests that need malformed
  // pushes.
  absl::StatusOr<v1::PushGradientResponse> PushMessages(
      const std::vector<v1::PushGradientRequest>& messages);

  absl::Status ReportEval(v1::ReportEvalRequest request);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(v1::HeartbeatRequest request);
  absl::StatusOr<v1::GetStatusResponse> GetStatus();

  const std::string& client_id() const { return client_id_; }
  const std::string& session_token() const { return token_; }
  const ModelSpec& spec() const { return spec_; }

  // Overrides what is sent as the session token and the client id (tests of
  // misuse).
  void set_session_token(std::string token) { token_ = std::move(token); }
  void set_client_id(std::string id) { client_id_ = std::move(id); }

 private:
  void Authorize(grpc::ClientContext* context) const;
  // Sends `header` (its client id filled in), waits for the go-ahead, then
  // the messages `next_chunk` returns until it returns nullptr; all by
  // `deadline`.
  absl::StatusOr<v1::PushGradientResponse> Push(
      v1::UpdateHeader header, absl::Time deadline,
      absl::FunctionRef<const v1::PushGradientRequest*()> next_chunk);
  // Sets the unary calls' deadline (call_timeout_ from now).
  void SetCallDeadline(grpc::ClientContext* context) const;

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  size_t chunk_bytes_;
  absl::Duration call_timeout_;
  std::string client_id_;
  std::string token_;
  ModelSpec spec_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_COORDINATOR_CLIENT_H_
