#include "server/coordinator_service.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/chunk_wire.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/raw_message.h"
#include "common/tensor_codec.h"
#include "server/happens_before.h"

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
// bounds memory per stream: a client reading at a trickle holds one chunk
// (--chunk_bytes) and gRPC's flow-control window of its own stream, and keeps
// its task's weights snapshot alive (shared with every stream of that model
// version); a download that moves nothing for --stall_timeout is cut off
// (the service's watchdog), which lets go of the snapshot too.
class CoordinatorService::TaskWriter final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  TaskWriter(CoordinatorService* service, grpc::CallbackServerContext* context,
             const grpc::ByteBuffer& raw_request)
      : service_(service),
        context_(context),
        controller_(service->controller_) {
    v1::RequestUpdateRequest request;
    grpc::ByteBuffer copy = raw_request;  // Deserialize consumes its input
    if (!grpc::SerializationTraits<v1::RequestUpdateRequest>::Deserialize(
             &copy, &request)
             .ok()) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "RequestUpdate: the request is not a "
                       "fedlearn.v1.RequestUpdateRequest"));
      return;
    }
    client_id_ = request.client_id();
    if (absl::Status s = service->Authorize(context, request.client_id());
        !s.ok()) {
      End(ToGrpcStatus(s));
      return;
    }
    poll_id_ = controller_->Poll(
        request.client_id(), absl::Milliseconds(request.max_wait_ms()),
        [this](absl::StatusOr<Task> task) { Start(std::move(task)); });
  }

  void OnWriteDone(bool ok) override {
    HappensAfter(this);
    if (!ok) {
      // The client went away mid-stream (or stalled and was cut off); it will
      // poll again and get the task again.
      service_->Unwatch(this);
      End(grpc::Status(grpc::StatusCode::CANCELLED,
                       absl::StrCat("client ", client_id_,
                                    ": stream closed by the client")));
      return;
    }
    if (encoded_ != nullptr && next_chunk_ < encoded_->chunks.size()) {
      if (retired_.load(std::memory_order_relaxed)) {
        // Counted here unless the watchdog cut it off, and counted it, first.
        if (service_->Unwatch(this)) {
          service_->downloads_moved_on_.fetch_add(1, std::memory_order_relaxed);
        }
        End(Retired());
        return;
      }
      service_->Watch(this, absl::Now());
      // A reference to the version's serialized chunk, not a copy.
      const std::vector<grpc::Slice>& chunk = encoded_->chunks[next_chunk_++];
      out_ = grpc::ByteBuffer(chunk.data(), chunk.size());
      Write(&out_);
      return;
    }
    service_->Unwatch(this);
    End(grpc::Status::OK);
  }

  // From the watchdog, while this stream is watched: no write completed for
  // --stall_timeout.
  void CutOff() { context_->TryCancel(); }
  const std::string& client_id() const { return client_id_; }
  bool retired() const { return retired_.load(std::memory_order_relaxed); }
  // The weights being written; null for a task without any. Set before the
  // stream is first watched, so readable under the watch's lock.
  const EncodedWeights* encoding() const { return encoded_.get(); }

  void OnCancel() override {
    controller_->CancelPoll(poll_id_.load());
    HappensBefore(this);
  }

  void OnDone() override {
    HappensAfter(this);
    delete this;
  }

 private:
  // StartWrite and Finish, with the ordering gRPC gives the callbacks after
  // them marked for TSan (happens_before.h).
  void Write(const grpc::ByteBuffer* message) {
    HappensBefore(this);
    StartWrite(message);
  }
  // Disarms the retire handle first: once End is called, nothing else may
  // touch this stream, which OnDone deletes.
  void End(const grpc::Status& status) {
    if (retire_ != nullptr) retire_->Disarm();
    HappensBefore(this);
    Finish(status);
  }

  grpc::Status Retired() const {
    return grpc::Status(
        grpc::StatusCode::CANCELLED,
        absl::StrCat("client ", client_id_, ": round ", round_, " ",
                     kMovedOnBeforeWeightsSent, ": poll again"));
  }

  void Start(absl::StatusOr<Task> task) {
    if (!task.ok()) {
      End(ToGrpcStatus(task.status()));
      return;
    }
    const Task& t = *task;
    round_ = t.round;
    if (t.retire != nullptr) {
      retire_ = t.retire;
      retire_->Arm([this] { retired_.store(true, std::memory_order_relaxed); });
      if (retired_.load(std::memory_order_relaxed)) {
        service_->downloads_moved_on_.fetch_add(1, std::memory_order_relaxed);
        End(Retired());
        return;
      }
    }
    v1::TaskMessage message;
    v1::Task* header = message.mutable_task();
    header->set_type(t.type);
    header->set_round(t.round);
    header->set_run_validation(t.run_validation);
    header->set_retry_after_ms(absl::ToInt64Milliseconds(t.retry_after));
    if (t.deadline != absl::InfiniteFuture()) {
      // At least 1: 0 (the field's default) means no deadline.
      header->set_deadline_ms(std::max<int64_t>(
          1, absl::ToInt64Milliseconds(t.deadline - absl::Now())));
    }
    if (t.weights != nullptr) {
      encoded_ = service_->Encode(t.weights);
      header->set_num_tensors(
          static_cast<int32_t>(controller_->spec().tensors.size()));
      header->set_payload_bytes(encoded_->payload_bytes);
    }
    if (t.plan != nullptr) *header->mutable_plan() = *t.plan;
    const grpc::Slice serialized = SerializeToSlice(message);
    out_ = grpc::ByteBuffer(&serialized, 1);
    service_->Watch(this, absl::Now());
    Write(&out_);
  }

  CoordinatorService* const service_;
  grpc::CallbackServerContext* const context_;
  RunController* const controller_;
  std::string client_id_;  // set once, in the constructor
  std::atomic<uint64_t> poll_id_{0};
  int64_t round_ = 0;  // the task's, once it came
  // A TRAIN task's (Task::retire): when the run can no longer use it, the
  // download ends at its next chunk (or at once, before its header).
  std::shared_ptr<CancelHandle> retire_;
  std::atomic<bool> retired_{false};
  // The weights' chunks (holding the snapshot), kept alive while they are
  // written.
  std::shared_ptr<const EncodedWeights> encoded_;
  size_t next_chunk_ = 0;
  grpc::ByteBuffer out_;  // the message being written
};

// PushGradient: reads the header, admits it (so a push that cannot count is
// turned away before its update is read), waits for a staging buffer, then
// verifies and copies each chunk into it. Only a complete, verified update is
// aggregated (RunController::CommitUpdate); anything else is rejected whole and
// leaves the round's aggregate untouched. The staging pool may take the buffer
// back from an upload that stalls or trickles (Preempt, from the service's
// watchdog thread): the push then ends RESOURCE_EXHAUSTED, its read still
// outstanding completes with ok = false, and only then is the buffer given
// back. mu_ orders Preempt against the reactor's own callbacks; a buffer is
// given back only after mu_ is released (Release may hand it to another
// reactor, whose lock is then taken: never two reactors' locks at once). The
// watchdog decides to preempt under the pool's lock and calls Preempt after
// releasing it, when the push may have finished on its own: Preempt runs
// under the reactor's PreemptGuard, which OnDone closes (waiting for a
// Preempt under way) before the reactor is deleted.
class CoordinatorService::UpdateReader final
    : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  UpdateReader(CoordinatorService* service,
               grpc::CallbackServerContext* context, grpc::ByteBuffer* response)
      : service_(service), context_(context), response_(response) {
    HappensBefore(this);  // the members above, for the first OnReadDone
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    HappensAfter(this);
    Locked([this, ok]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (finished_) {
        // Preempted while this read was outstanding: the call is over.
        ReleaseLocked();
      } else if (!ok) {
        EndOfStreamLocked();
      } else if (!header_.has_value()) {
        OnHeaderLocked();
      } else {
        OnChunkLocked();
      }
    });
  }

  void OnCancel() override {
    service_->staging_.Cancel(lease_.load());
    HappensBefore(this);
  }

  void OnDone() override {
    HappensAfter(this);
    Locked([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ReleaseLocked(); });
    {
      absl::MutexLock lock(&guard_->mu);
      guard_->alive = false;
    }
    delete this;
  }

 private:
  // Outlives the reactor in the preempt callback the pool holds.
  struct PreemptGuard {
    absl::Mutex mu;
    bool alive ABSL_GUARDED_BY(mu) = true;
  };

  // Runs `body` under mu_, then gives back the staging buffer it released, if
  // any, with mu_ released (and without touching `this`, which another thread
  // may delete as soon as mu_ is free).
  template <typename Body>
  void Locked(Body body) {
    StagingPool* const pool = &service_->staging_;
    StagingPool::Buffer back;
    uint64_t lease;
    bool cancel_wait;
    {
      absl::MutexLock lock(&mu_);
      body();
      back = std::move(returning_);
      lease = lease_.load();
      cancel_wait = std::exchange(cancel_wait_, false);
    }
    if (back != nullptr) pool->Release(lease, std::move(back), absl::Now());
    // A waiting push has not finished, so `this` lives until this ends it.
    if (cancel_wait) pool->Cancel(lease);
  }

  // `message_` parsed by protobuf into `request_`; false if it is not a
  // PushGradientRequest.
  bool ParseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return grpc::SerializationTraits<v1::PushGradientRequest>::Deserialize(
               &message_, &request_)
        .ok();
  }

  void OnHeaderLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!ParseLocked() || !request_.has_header()) {
      FinishLocked(absl::InvalidArgumentError(
          absl::StrCat(CallerName(),
                       ": the first message of a push must be "
                       "its header")));
      return;
    }
    header_ = request_.header();
    if (absl::Status s = service_->Authorize(context_, header_->client_id());
        !s.ok()) {
      FinishLocked(s);
      return;
    }
    auto ticket = service_->controller_->AdmitUpdate(*header_, [this] {
      closed_by_round_.store(true);
      context_->TryCancel();
    });
    if (!ticket.ok()) {
      FinishLocked(ticket.status());
      return;
    }
    ticket_ = *std::move(ticket);
    StagingPool::Lease lease = service_->staging_.Acquire(
        [this](StagingPool::Buffer buffer) {
          Locked([this, &buffer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            OnBufferLocked(std::move(buffer));
          });
        },
        [this, guard = guard_](const std::string& reason) {
          absl::MutexLock lock(&guard->mu);
          if (guard->alive) Preempt(reason);
        },
        absl::Now());
    lease_ = lease.id;
    if (lease.buffer != nullptr) {
      OnBufferLocked(std::move(lease.buffer));
    } else if (context_->IsCancelled()) {
      // Cancelled as it joined the queue: OnCancel may have read lease_
      // before it was set and found nothing to take out. Locked takes it out
      // once mu_ is free (which ends the call, under mu_).
      cancel_wait_ = true;
    }
    // Else the buffer comes later, from the thread that frees one.
  }

  void OnBufferLocked(StagingPool::Buffer buffer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (buffer == nullptr) {
      FinishLocked(absl::CancelledError(
          absl::StrCat("client ", header_->client_id(),
                       ": push cancelled while waiting to be received")));
      return;
    }
    buffer_ = std::move(buffer);
    if (finished_) {
      ReleaseLocked();
      return;
    }
    assembler_.emplace(service_->controller_->spec(), absl::MakeSpan(*buffer_),
                       /*require_finite=*/true, kMaxChunkBytes,
                       header_->encoding());
    // Initial metadata is the go-ahead: a client that waits for it before
    // sending its chunks (CoordinatorClient does) has nothing but its header in
    // flight while queued.
    StartSendInitialMetadata();
    StartRead(&message_);
  }

  // A chunk message: verified and copied into the staging buffer from where
  // gRPC received it; protobuf parses only a message of another shape (which
  // no client of ours sends).
  void OnChunkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ViewMessage(message_, &slices_, &pieces_);
    const bool in_place = ReadChunkInPlace(
        pieces_, v1::PushGradientRequest::kChunkFieldNumber, &chunk_);
    if (!in_place && (!ParseLocked() || !request_.has_chunk())) {
      RejectLocked(Rejection::kInvalid,
                   absl::InvalidArgumentError(
                       "after the header a push carries only chunks"));
      return;
    }
    const v1::TensorChunk& fields = in_place ? chunk_.fields : request_.chunk();
    const absl::string_view parsed = request_.chunk().data();
    const absl::Span<const absl::string_view> data =
        in_place ? absl::MakeConstSpan(chunk_.data)
                 : absl::MakeConstSpan(&parsed, 1);
    int64_t bytes = 0;
    for (absl::string_view piece : data) bytes += piece.size();
    if (absl::Status s = assembler_->Add(fields, data); !s.ok()) {
      RejectLocked(s.code() == absl::StatusCode::kResourceExhausted
                       ? Rejection::kTooLarge
                       : Rejection::kInvalid,
                   s);
      return;
    }
    // gRPC's buffers are let go before the next read.
    pieces_.clear();
    slices_.clear();
    message_.Clear();
    service_->staging_.Progress(lease_, bytes, absl::Now());
    StartRead(&message_);
  }

  // From the watchdog thread: the pool takes the buffer back. The read still
  // outstanding writes into it; OnReadDone gives it back.
  void Preempt(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    service_->controller_->RecordRejection(Rejection::kTooSlow);
    const std::string message =
        absl::StrCat("client ", header_->client_id(), ": ", reason,
                     "; the update was dropped whole, push it again");
    Logf("%s", message);
    FinishLocked(absl::ResourceExhaustedError(message),
                 /*release=*/false);  // the outstanding read still uses it
  }

  void EndOfStreamLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!header_.has_value()) {
      FinishLocked(absl::InvalidArgumentError(
          absl::StrCat(CallerName(), ": empty push, no header")));
      return;
    }
    if (context_->IsCancelled()) {
      if (!closed_by_round_.load())
        service_->controller_->RecordRejection(Rejection::kIncomplete);
      FinishLocked(absl::CancelledError(absl::StrCat(
          "client ", header_->client_id(), ": ",
          closed_by_round_.load() ? "round closed before the update arrived"
                                  : "push cancelled")));
      return;
    }
    if (absl::Status s = assembler_->Finish(); !s.ok()) {
      RejectLocked(Rejection::kIncomplete, s);
      return;
    }
    // From here the push no longer needs cutting off: if its round closes
    // first, the commit itself rejects it, and closing the round on this very
    // update must not cancel the call that carries the reply.
    ticket_->cancel->Disarm();
    auto result = service_->controller_->CommitUpdate(
        *ticket_, *header_, absl::MakeSpan(*buffer_),
        assembler_->bytes_received(), std::sqrt(assembler_->sum_of_squares()));
    if (result.ok()) {
      const grpc::Slice reply = SerializeToSlice(*result);
      *response_ = grpc::ByteBuffer(&reply, 1);
    }
    FinishLocked(result.status());
  }

  // Who is pushing, before a header names them.
  std::string CallerName() const {
    return service_->controller_->CallerName(BearerToken(*context_),
                                             context_->peer());
  }

  void RejectLocked(Rejection reason, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    service_->controller_->RecordRejection(reason);
    FinishLocked(absl::Status(
        status.code(),
        absl::StrCat("client ", header_->client_id(), ": ", status.message())));
  }

  // Gives the staging buffer back (once mu_ is released: Locked), so the
  // next push can proceed.
  void ReleaseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    assembler_.reset();
    if (buffer_ != nullptr) returning_ = std::move(buffer_);
  }

  // Finishes the call once; gives back what the push holds first unless a
  // read still writes into it.
  void FinishLocked(const absl::Status& status, bool release = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    if (ticket_.has_value()) ticket_->cancel->Disarm();
    if (release) ReleaseLocked();
    Finish(ToGrpcStatus(status));
  }

  CoordinatorService* const service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ByteBuffer message_;  // the message being read
  // The header, and any message ReadChunkInPlace leaves to protobuf.
  v1::PushGradientRequest request_;
  // A chunk read in place, and what it is read from: message_'s slices.
  ChunkInPlace chunk_;
  std::vector<grpc::Slice> slices_;
  std::vector<absl::string_view> pieces_;
  std::optional<v1::UpdateHeader> header_;
  std::optional<Ticket> ticket_;  // once the header is admitted
  std::atomic<uint64_t> lease_{0};
  std::atomic<bool> closed_by_round_{false};
  const std::shared_ptr<PreemptGuard> guard_ = std::make_shared<PreemptGuard>();
  StagingPool::Buffer buffer_ ABSL_GUARDED_BY(mu_);
  StagingPool::Buffer returning_ ABSL_GUARDED_BY(mu_);  // see Locked
  bool cancel_wait_ ABSL_GUARDED_BY(mu_) = false;       // see OnHeaderLocked
  std::optional<ChunkAssembler> assembler_ ABSL_GUARDED_BY(mu_);
};

namespace {

StagingPool::Policy UploadPolicy(const CoordinatorOptions& options) {
  StagingPool::Policy policy;
  policy.idle_timeout = options.stall_timeout;
  policy.min_rate = options.min_upload_rate;
  return policy;
}

// How often the watchdog looks: the slack on --stall_timeout, on the
// one-second grace of --min_upload_rate and on kRetiredGrace.
constexpr absl::Duration kWatchdogPeriod = absl::Milliseconds(100);

// How long a retired download (Task::retire) may take to reach its next chunk
// before it is cut off: a slow reader's chunk in flight waits for it to take
// the ones buffered before it (seconds at a trickle), and the version it holds
// is one the run has moved past.
constexpr absl::Duration kRetiredGrace = absl::Seconds(1);

}  // namespace

CoordinatorService::CoordinatorService(RunController* controller)
    : controller_(controller),
      staging_(controller->options().max_concurrent_updates,
               static_cast<size_t>(controller->spec().num_parameters),
               UploadPolicy(controller->options())),
      watchdog_([this] { WatchdogLoop(); }) {}

CoordinatorService::~CoordinatorService() {
  stop_.Notify();
  watchdog_.join();
}

std::shared_ptr<const CoordinatorService::EncodedWeights>
CoordinatorService::Encode(const Weights& weights) {
  absl::MutexLock lock(&encoded_mu_);
  if (encoded_ != nullptr && encoded_->weights == weights) return encoded_;
  auto encoded = std::make_shared<EncodedWeights>();
  encoded->weights = weights;
  ChunkWriter writer(controller_->spec(), absl::MakeConstSpan(*weights),
                     static_cast<size_t>(controller_->chunk_bytes()));
  encoded->payload_bytes = writer.total_bytes();
  // Dense chunks' data lie in the snapshot itself: each message references
  // them (and holds the snapshot while gRPC does) instead of copying them.
  v1::TensorChunk chunk;
  absl::string_view data;
  while (writer.Next(&chunk, &data)) {
    encoded->chunks.push_back(SerializeChunkAround(
        v1::TaskMessage::kChunkFieldNumber, chunk, data, weights));
  }
  encoded_ = encoded;
  return encoded;
}

void CoordinatorService::Watch(TaskWriter* writer, absl::Time now) {
  absl::MutexLock lock(&downloads_mu_);
  downloads_[writer].progress = now;
}

bool CoordinatorService::Unwatch(TaskWriter* writer) {
  absl::MutexLock lock(&downloads_mu_);
  return downloads_.erase(writer) > 0;
}

void CoordinatorService::WatchdogLoop() {
  const absl::Duration stall = controller_->options().stall_timeout;
  while (!stop_.WaitForNotificationWithTimeout(kWatchdogPeriod)) {
    const absl::Time now = absl::Now();
    for (const StagingPool::Reclaimed& reclaimed : staging_.Reclaim(now)) {
      reclaimed.Run();
    }
    absl::MutexLock lock(&downloads_mu_);
    for (auto it = downloads_.begin(); it != downloads_.end();) {
      // Watched means not finished, so the writer is alive while the lock is
      // held; it finishes once the cancelled write completes.
      TaskWriter* writer = it->first;
      Download& d = it->second;
      if (writer->retired() && d.retired_seen == absl::InfiniteFuture()) {
        d.retired_seen = now;
      }
      if (now - d.progress >= stall) {
        Logf("client %s: download stalled for %s, cut off (--stall_timeout)",
             writer->client_id(), absl::FormatDuration(now - d.progress));
        downloads_stalled_.fetch_add(1, std::memory_order_relaxed);
      } else if (now - d.retired_seen >= kRetiredGrace) {
        downloads_moved_on_.fetch_add(1, std::memory_order_relaxed);
        Logf(
            "client %s: the run moved past its task, and its download did "
            "not reach its next chunk within %s: cut off",
            writer->client_id(), absl::FormatDuration(kRetiredGrace));
      } else {
        ++it;
        continue;
      }
      writer->CutOff();
      downloads_.erase(it++);
    }
  }
}

TransferStats CoordinatorService::transfers() const {
  TransferStats stats;
  {
    absl::MutexLock lock(&downloads_mu_);
    absl::flat_hash_set<const EncodedWeights*> versions;
    for (const auto& [writer, download] : downloads_) {
      // Watched means not finished: the writer is alive while the lock is
      // held.
      const EncodedWeights* e = writer->encoding();
      if (e == nullptr) continue;
      ++stats.downloads;
      if (versions.insert(e).second) {
        ++stats.download_versions;
        stats.download_version_bytes +=
            static_cast<int64_t>(e->weights->size() * sizeof(float));
      }
    }
  }
  stats.downloads_stalled = downloads_stalled_.load(std::memory_order_relaxed);
  stats.downloads_moved_on =
      downloads_moved_on_.load(std::memory_order_relaxed);
  stats.receive_buffers = controller_->options().max_concurrent_updates;
  stats.receive_buffers_in_use = staging_.in_use();
  stats.uploads_waiting = staging_.waiting();
  return stats;
}

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

grpc::ServerWriteReactor<grpc::ByteBuffer>* CoordinatorService::RequestUpdate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new TaskWriter(this, context, *request);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* CoordinatorService::PushGradient(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
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

}  // namespace fedlearn
