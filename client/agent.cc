#include "client/agent.h"

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_interceptor.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/files.h"
#include "common/retry.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"

namespace fedlearn {

// Cancels the gRPC calls registered with it and, once cancelled, every call
// registered later. Calls register themselves (CancelInterceptor) when they are
// made over a MakeCoordinatorChannel channel from a thread that has a
// ScopedCanceller. Thread-safe.
class CallCanceller {
 public:
  void Add(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      context->TryCancel();
    } else {
      live_.insert(context);
    }
  }

  void Remove(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    live_.erase(context);
  }

  // TryCancel is called with the lock held on purpose: Remove (from the call's
  // own thread, before its context goes away) then waits, so no context is
  // cancelled after its end. TryCancel only flags the call; it never calls
  // back into us.
  void CancelAll() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* context : live_) context->TryCancel();
    live_.clear();
  }

 private:
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> live_ ABSL_GUARDED_BY(mu_);
};

namespace {

// The canceller of the calls this thread makes; null: calls are not tracked.
// gRPC's synchronous API creates a call, and so its interceptors, on the
// thread that makes it, which is how a call finds its canceller without the
// RPC layer (CoordinatorClient) knowing about any of this.
thread_local CallCanceller* t_canceller = nullptr;

// Makes `canceller` this thread's for its lifetime.
class ScopedCanceller {
 public:
  explicit ScopedCanceller(CallCanceller* canceller) : previous_(t_canceller) {
    t_canceller = canceller;
  }
  ~ScopedCanceller() { t_canceller = previous_; }
  ScopedCanceller(const ScopedCanceller&) = delete;
  ScopedCanceller& operator=(const ScopedCanceller&) = delete;

 private:
  CallCanceller* const previous_;
};

// Registers its call with the creating thread's canceller from creation until
// the call's status arrives (or the call is destroyed without one).
class CancelInterceptor : public grpc::experimental::Interceptor {
 public:
  CancelInterceptor(CallCanceller* canceller, grpc::ClientContext* context)
      : canceller_(canceller), context_(context) {
    if (canceller_ != nullptr) canceller_->Add(context_);
  }
  ~CancelInterceptor() override {
    if (canceller_ != nullptr) canceller_->Remove(context_);
  }

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (canceller_ != nullptr &&
        methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::POST_RECV_STATUS)) {
      canceller_->Remove(context_);
    }
    methods->Proceed();
  }

 private:
  CallCanceller* const canceller_;
  grpc::ClientContext* const context_;
};

class CancelInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* info) override {
    return new CancelInterceptor(t_canceller, info->client_context());
  }
};

// Sends heartbeats with the training progress from a thread of its own while
// one round trains. It speaks for the agent through a CoordinatorClient of its
// own (they are not thread-safe) carrying the agent's id and token over the
// agent's channel. A failed heartbeat is logged once and otherwise ignored:
// the push that follows finds out what is wrong. Destroying it stops the
// thread, cutting short a heartbeat in flight.
class HeartbeatLoop {
 public:
  HeartbeatLoop(std::shared_ptr<grpc::Channel> channel,
                const CoordinatorClient& identity, ProgressConsole* console,
                std::string name, int64_t round, absl::Duration interval,
                const std::atomic<int64_t>* done,
                const std::atomic<int64_t>* total)
      : client_(std::move(channel)),
        console_(console),
        name_(std::move(name)),
        round_(round),
        interval_(interval),
        done_(done),
        total_(total) {
    client_.set_client_id(identity.client_id());
    client_.set_session_token(identity.session_token());
    thread_ = std::thread([this] { Loop(); });
  }

  ~HeartbeatLoop() {
    stop_.Notify();
    canceller_.CancelAll();
    thread_.join();
  }

  HeartbeatLoop(const HeartbeatLoop&) = delete;
  HeartbeatLoop& operator=(const HeartbeatLoop&) = delete;

 private:
  void Loop() {
    ScopedCanceller scope(&canceller_);
    bool reported = false;
    while (!stop_.WaitForNotificationWithTimeout(interval_)) {
      v1::HeartbeatRequest beat;
      beat.set_round(round_);
      beat.set_batches_done(done_->load(std::memory_order_relaxed));
      beat.set_batches_total(total_->load(std::memory_order_relaxed));
      absl::StatusOr<v1::HeartbeatResponse> answer = client_.Heartbeat(beat);
      if (!answer.ok() && !reported && !stop_.HasBeenNotified()) {
        ConsoleLogf(console_, "%s: round %d: heartbeat failed: %s", name_,
                    round_, answer.status().ToString());
        reported = true;
      }
    }
  }

  CoordinatorClient client_;
  ProgressConsole* const console_;
  const std::string name_;
  const int64_t round_;
  const absl::Duration interval_;
  const std::atomic<int64_t>* const done_;
  const std::atomic<int64_t>* const total_;
  CallCanceller canceller_;
  absl::Notification stop_;
  std::thread thread_;  // last: starts once everything above is ready
};

// How long a wait that cannot be woken (AwaitCoordinator's) may delay Stop().
constexpr absl::Duration kStopLatency = absl::Milliseconds(100);
// The shortest pause a WAIT task gets, whatever its retry_after_ms says.
constexpr int64_t kMinWaitMs = 10;
// How long past its round's deadline a push may go unanswered: the
// coordinator ends it at the round's close, so this is for a coordinator that
// stopped answering (a frozen process, a host gone without a reset).
constexpr absl::Duration kPushGrace = absl::Seconds(30);

// The answers to an evaluation report that only mean the attempt has moved on
// without it: not counted, nothing to fix. (A push's are told apart finer, in
// Push.)
bool RoundMovedOn(absl::StatusCode code) {
  return code == absl::StatusCode::kFailedPrecondition ||
         code == absl::StatusCode::kAlreadyExists ||
         code == absl::StatusCode::kCancelled;
}

// The answers that mean the coordinator does not know this identity (it
// restarted, forgot it, or retired it): join again.
bool MustJoinAgain(absl::StatusCode code) {
  return code == absl::StatusCode::kNotFound ||
         code == absl::StatusCode::kUnauthenticated ||
         code == absl::StatusCode::kPermissionDenied;
}

std::string Millis(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

std::string MegaBytes(int64_t bytes) {
  return absl::StrFormat("%.2f MB", static_cast<double>(bytes) / 1e6);
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(
    const std::string& address, absl::Duration max_backoff,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    const std::string& tls_server_name) {
  grpc::ChannelArguments args;
  if (!tls_server_name.empty()) {
    args.SetSslTargetNameOverride(tls_server_name);
  }
  // Redial a coordinator that went away soon and then at most every
  // max_backoff, in step with the agent's own retries: a call on a channel
  // waiting out its reconnect backoff fails at once without trying.
  const int64_t max_ms =
      std::clamp<int64_t>(absl::ToInt64Milliseconds(max_backoff), 100, INT_MAX);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(max_ms));
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<CancelInterceptorFactory>());
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, std::move(credentials), args, std::move(interceptors));
}

Agent::Agent(AgentOptions options, TrainerFactory trainer_factory)
    : options_(std::move(options)),
      trainer_factory_(std::move(trainer_factory)),
      console_(options_.progress.get()),
      name_(options_.display_name.empty() ? "agent" : options_.display_name),
      target_(options_.coordinator.empty() ? "the coordinator"
                                           : options_.coordinator),
      channel_(options_.channel != nullptr
                   ? options_.channel
                   : MakeCoordinatorChannel(options_.coordinator,
                                            options_.max_backoff)),
      canceller_(std::make_unique<CallCanceller>()),
      client_(channel_),
      jitter_(options_.jitter_seed != 0 ? options_.jitter_seed
                                        : std::random_device()()) {}

Agent::~Agent() = default;

void Agent::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    stopped_ = true;
  }
  canceller_->CancelAll();
}

bool Agent::stopping() const {
  absl::MutexLock lock(&stop_mu_);
  return stopped_;
}

absl::Status Agent::Stopped() const {
  return absl::CancelledError(absl::StrCat(name_, ": stopped"));
}

absl::Status Agent::Pause(absl::Duration delay) {
  absl::MutexLock lock(&stop_mu_);
  if (stop_mu_.AwaitWithTimeout(absl::Condition(&stopped_), delay)) {
    return Stopped();
  }
  return absl::OkStatus();
}

absl::Status Agent::AwaitCoordinator(absl::Duration delay) {
  const absl::Time until = absl::Now() + delay;
  grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
  bool down = state != GRPC_CHANNEL_READY;
  for (;;) {
    if (stopping()) return Stopped();
    const absl::Time now = absl::Now();
    if (now >= until) return absl::OkStatus();
    if (down && state == GRPC_CHANNEL_READY) return absl::OkStatus();  // back
    const absl::Time slice = std::min(until, now + kStopLatency);
    if (channel_->WaitForStateChange(state, absl::ToChronoTime(slice))) {
      state = channel_->GetState(/*try_to_connect=*/true);
      down |= state != GRPC_CHANNEL_READY;
    }
  }
}

absl::Duration Agent::NextBackoff() { return BackoffAfter(failures_++); }

absl::Duration Agent::BackoffAfter(int failures) {
  return Backoff(failures, options_.initial_backoff, options_.max_backoff,
                 std::uniform_real_distribution<double>(0, 1)(jitter_));
}

void Agent::NoteContact(Op op) {
  failing_since_ = absl::InfiniteFuture();
  repeats_[op] = 0;
  if (op != Op::kJoin) {
    failures_ = 0;
    rejoined_ = false;
  }
}

absl::StatusOr<AgentSummary> Agent::Run() {
  const absl::Time start = absl::Now();
  ScopedCanceller scope(canceller_.get());
  FEDLEARN_RETURN_IF_ERROR(LockSession());
  FEDLEARN_RETURN_IF_ERROR(Join());
  for (;;) {
    if (stopping()) return Stopped();
    absl::StatusOr<CoordinatorClient::ReceivedTask> received =
        client_.RequestUpdate(options_.poll_wait);
    if (!received.ok()) {
      FEDLEARN_RETURN_IF_ERROR(Recover(Op::kPoll, received.status()));
      continue;
    }
    NoteContact(Op::kPoll);
    const v1::Task& task = received->task;
    switch (task.type()) {
      case v1::TASK_TYPE_WAIT:
        // Floored (as the Python SDK's): a coordinator that answered WAIT at
        // once with 0 would otherwise be polled in a hot loop.
        FEDLEARN_RETURN_IF_ERROR(Pause(absl::Milliseconds(
            std::max<int64_t>(kMinWaitMs, task.retry_after_ms()))));
        break;
      case v1::TASK_TYPE_TRAIN:
        summary_.bytes_received +=
            PayloadBytes(client_.spec(), v1::ENCODING_DENSE);
        FEDLEARN_RETURN_IF_ERROR(Train(*std::move(received)));
        break;
      case v1::TASK_TYPE_EVALUATE:
        DropKeptUpdate();  // training is over: it can no longer count
        summary_.bytes_received +=
            PayloadBytes(client_.spec(), v1::ENCODING_DENSE);
        FEDLEARN_RETURN_IF_ERROR(Evaluate(*received));
        break;
      case v1::TASK_TYPE_DONE:
        DropKeptUpdate();
        summary_.wall_time = absl::Now() - start;
        ConsoleLogf(console_, "%s: run %s done after %d rounds trained", name_,
                    summary_.run_id, summary_.rounds_trained);
        return summary_;
      default:
        FEDLEARN_RETURN_IF_ERROR(
            Recover(Op::kPoll, absl::InternalError(absl::StrCat(
                                   "task of unknown type ", task.type()))));
        break;
    }
  }
}

absl::Status Agent::LockSession() {
  if (options_.session_file.empty() || session_lock_.has_value()) {
    return absl::OkStatus();
  }
  // The session file itself is replaced by a rename at every join, so the
  // lock is on a file beside it that stays.
  const std::string path = absl::StrCat(options_.session_file, ".lock");
  absl::StatusOr<int> fd = LockFileExclusively(path, /*mode=*/0600);
  if (!fd.ok()) {
    if (fd.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, ": session file ", options_.session_file,
          " is in use by another running agent (", path,
          " is locked); give each agent its own name or session directory"));
    }
    return absl::Status(
        fd.status().code(),
        absl::StrCat(name_, ": session file: ", fd.status().message()));
  }
  session_lock_.emplace(*fd);
  return absl::OkStatus();
}

absl::Status Agent::Join() {
  v1::JoinRequest request;
  request.set_join_token(options_.join_token);
  request.set_display_name(options_.display_name);
  request.set_num_train_examples(options_.num_train_examples);
  request.set_num_test_examples(options_.num_test_examples);
  request.set_no_evaluation(!options_.evaluates);
  if (!options_.session_file.empty()) {
    // "<client id>\n<session token>\n" of this agent's last join, if any.
    absl::StatusOr<std::string> saved = ReadFileToString(options_.session_file);
    std::vector<std::string> lines;
    if (saved.ok()) lines = absl::StrSplit(*saved, '\n', absl::SkipEmpty());
    if (lines.size() == 2) {
      request.set_previous_client_id(lines[0]);
      request.set_previous_session_token(lines[1]);
    }
  }
  absl::StatusOr<v1::JoinResponse> joined;
  for (;;) {
    if (stopping()) return Stopped();
    joined = client_.Join(request);
    if (joined.ok()) break;
    const absl::Status& error = joined.status();
    switch (error.code()) {
      case absl::StatusCode::kUnauthenticated:
        return absl::UnauthenticatedError(absl::StrCat(
            name_, ": ", target_, " refused the join: ", error.message(),
            " (check --join_token)"));
      case absl::StatusCode::kPermissionDenied:
      case absl::StatusCode::kInvalidArgument:
        return absl::Status(
            error.code(), absl::StrCat(name_, ": ", target_,
                                       " refused the join: ", error.message()));
      default:
        FEDLEARN_RETURN_IF_ERROR(Recover(Op::kJoin, error));
    }
  }
  NoteContact(Op::kJoin);
  // The trainer is kept across a re-join to the same run (its optimizer state
  // and data order go on). A new run (a coordinator restarted without its
  // state) may have another plan, and the trainer takes its input scaling and
  // seed from the join's plan: it is built afresh, as for a new client.
  const bool same_model = trainer_ != nullptr &&
                          joined_.run_id() == joined->run_id() &&
                          google::protobuf::util::MessageDifferencer::Equals(
                              joined_.model(), joined->model());
  joined_ = *std::move(joined);
  ++summary_.joins;
  summary_.client_id = joined_.client_id();
  summary_.run_id = joined_.run_id();
  const v1::TrainingPlan& plan = joined_.plan();
  ConsoleLogf(console_,
              "%s: joined %s as %s (run %s): model %s, %d parameters; plan %d "
              "epoch(s), batch %d, %s",
              name_, target_, joined_.client_id(), joined_.run_id(),
              joined_.model().name(), joined_.model().num_parameters(),
              plan.epochs(), plan.batch_size(), plan.optimizer());
  if (!joined_.retired_client_id().empty()) {
    ConsoleLogf(console_, "%s: the coordinator retired %s, our identity before",
                name_, joined_.retired_client_id());
  }
  if (!options_.session_file.empty()) {
    const std::string session =
        absl::StrCat(joined_.client_id(), "\n", joined_.session_token(), "\n");
    absl::Status saved =
        WriteFileAtomically(options_.session_file, {session}, /*mode=*/0600);
    if (!saved.ok()) {
      ConsoleLogf(console_, "%s: session not saved: %s", name_,
                  saved.ToString());
    }
  }
  if (same_model) return absl::OkStatus();
  trainer_.reset();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = trainer_factory_(joined_);
  if (!trainer.ok()) {
    return absl::Status(
        trainer.status().code(),
        absl::StrCat(name_, ": building the trainer for model ",
                     joined_.model().name(), ": ", trainer.status().message()));
  }
  if (*trainer == nullptr) {
    return absl::InternalError(
        absl::StrCat(name_, ": the trainer factory returned no trainer"));
  }
  trainer_ = *std::move(trainer);
  return absl::OkStatus();
}

absl::Status Agent::Recover(Op op, const absl::Status& error) {
  static constexpr const char* kOpNames[] = {"join", "poll", "push", "report"};
  const char* what = kOpNames[static_cast<int>(op)];
  if (stopping()) return Stopped();
  const absl::StatusCode code = error.code();
  if (IsRetryable(code)) {
    if (code == absl::StatusCode::kCancelled) {
      // The coordinator cut the call off (a download that stalled or went
      // too stale, a round that closed): it is there, so this is not
      // silence. A client on a link too slow for every download is cut off
      // again and again; it backs off and goes on rather than give up after
      // reconnect_timeout saying nobody answered.
      failing_since_ = absl::InfiniteFuture();
    } else {
      // Counted from the first call that failed, not from the last answered
      // one: a round may train for longer than reconnect_timeout (heartbeats
      // answered meanwhile), and its push's first failure is not silence.
      const absl::Time now = absl::Now();
      failing_since_ = std::min(failing_since_, now);
      const absl::Duration silent = now - failing_since_;
      if (silent >= options_.reconnect_timeout) {
        return absl::UnavailableError(absl::StrCat(
            name_, ": no answer from ", target_, " for ", Millis(silent),
            ", giving up; last error: ", error.ToString()));
      }
    }
    const absl::Duration delay = NextBackoff();
    ConsoleLogf(console_, "%s: %s failed (%s); retrying in %s", name_, what,
                error.ToString(), Millis(delay));
    return AwaitCoordinator(delay);
  }
  if (op == Op::kJoin && code == absl::StatusCode::kResourceExhausted) {
    // At --max_clients. Slots free as gone clients time out: a fleet
    // restarted at once finds its old identities holding them for
    // --client_timeout. Tried again after a backoff, for as long as a silent
    // coordinator would be.
    const absl::Time now = absl::Now();
    failing_since_ = std::min(failing_since_, now);
    const absl::Duration refused = now - failing_since_;
    if (refused >= options_.reconnect_timeout) {
      return absl::ResourceExhaustedError(
          absl::StrCat(name_, ": ", target_, " refused the join for ",
                       Millis(refused), ": ", error.message()));
    }
    const absl::Duration delay = NextBackoff();
    ConsoleLogf(console_, "%s: join refused (%s); trying again in %s", name_,
                error.ToString(), Millis(delay));
    return Pause(delay);
  }
  if (op != Op::kJoin && MustJoinAgain(code)) {
    // The coordinator restarted and forgot us (or never knew this identity):
    // join again. Join keeps the trainer if the run (a resumed one keeps its
    // id) and the model are the same.
    ConsoleLogf(console_, "%s: %s as %s failed (%s); joining again", name_,
                what, client_.client_id(), error.ToString());
    // It answered, so it is there; but a coordinator that forgets us again
    // right after each join must not be hammered.
    if (rejoined_) {
      FEDLEARN_RETURN_IF_ERROR(Pause(NextBackoff()));
    } else {
      failures_ = 0;
    }
    rejoined_ = true;
    return Join();
  }
  const int repeats = ++repeats_[op];
  if (repeats >= options_.max_repeated_errors) {
    return absl::Status(code,
                        absl::StrCat(name_, ": ", what, " failed ", repeats,
                                     " times in a row: ", error.message()));
  }
  const absl::Duration delay = NextBackoff();
  ConsoleLogf(console_, "%s: %s failed (%s, %d in a row); going on in %s",
              name_, what, error.ToString(), repeats, Millis(delay));
  return Pause(delay);
}

absl::Status Agent::Train(CoordinatorClient::ReceivedTask received) {
  const v1::Task& task = received.task;
  const int64_t round = task.round();
  Update& update = update_;
  // By this task's deadline: a kept update pushed again answers this task,
  // whose deadline may be long after the one it was trained for.
  const absl::Time push_deadline =
      task.deadline_ms() > 0
          ? received.header_received + absl::Milliseconds(task.deadline_ms()) +
                kPushGrace
          : absl::InfiniteFuture();
  if (update.pending && update.run_id == joined_.run_id() &&
      update.round == round && update.weights == received.weights) {
    ConsoleLogf(console_,
                "%s: round %d: pushing again the update kept from before (its "
                "push was cut off, or the coordinator went away)",
                name_, round);
    update.push_deadline = push_deadline;
    return Push();
  }
  DropKeptUpdate();  // this task is not its round
  const v1::TrainingPlan& plan = task.has_plan() ? task.plan() : joined_.plan();
  update.delta.assign(received.weights.begin(), received.weights.end());

  std::atomic<int64_t> batches_done{0};
  std::atomic<int64_t> batches_total{0};
  const bool bars = console_ != nullptr && console_->bars();
  const int slot = options_.progress_slot;
  const ProgressFn progress = [&batches_done, &batches_total, bars, slot,
                               this](const TrainProgress& p) {
    batches_done.store(p.done, std::memory_order_relaxed);
    batches_total.store(p.total, std::memory_order_relaxed);
    if (bars) console_->Update(slot, p);
  };
  const absl::Time started = absl::Now();
  absl::StatusOr<TrainMetrics> metrics;
  {
    std::optional<HeartbeatLoop> heartbeat;
    if (options_.heartbeat && joined_.heartbeat_interval_ms() > 0) {
      heartbeat.emplace(channel_, client_, console_, name_, round,
                        absl::Milliseconds(joined_.heartbeat_interval_ms()),
                        &batches_done, &batches_total);
    }
    if (bars) console_->StartRound(slot, name_, round);
    metrics = trainer_->Train(absl::MakeSpan(update.delta), plan,
                              task.run_validation(), progress);
    if (bars) console_->EndRound(slot);
  }
  update.train_time = absl::Now() - started;
  update.epochs = std::max(1, plan.epochs());
  if (!metrics.ok()) {
    return absl::Status(metrics.status().code(),
                        absl::StrCat(name_, ": round ", round, ": training: ",
                                     metrics.status().message()));
  }
  if (stopping()) return Stopped();

  update.weights = std::move(received.weights);
  float* delta = update.delta.data();
  const float* weights = update.weights.data();
  for (size_t i = 0; i < update.delta.size(); ++i) delta[i] -= weights[i];
  update.run_id = joined_.run_id();
  update.round = round;
  update.push_deadline = push_deadline;
  update.metrics = *metrics;
  update.header.Clear();
  update.header.set_round(round);
  update.header.set_num_examples(metrics->num_examples);
  update.header.set_train_loss(metrics->loss);
  update.header.set_train_accuracy(metrics->accuracy);
  update.header.set_encoding(options_.update_encoding);
  if (metrics->num_validation > 0) {
    update.header.set_validation_loss(metrics->validation_loss);
    update.header.set_validation_accuracy(metrics->validation_accuracy);
    update.header.set_num_validation_examples(metrics->num_validation);
  }
  update.pending = true;
  return Push();
}

absl::Status Agent::Push() {
  Update& update = update_;
  // Answers of "not now" in a row: a push preempted as too slow while others
  // waited for a receive buffer, or a limit of the moment (RESOURCE_EXHAUSTED).
  int refusals = 0;
  // Whether an attempt went unanswered: it may have arrived all the same.
  bool unanswered = false;
  for (;;) {
    // Never unbounded: a task without a deadline (async mode) gets
    // reconnect_timeout, so a push queued at a coordinator whose host
    // vanished (no reset, nothing unacknowledged for TCP to notice) ends and
    // is retried; as the Python SDK's push.
    const absl::Time deadline = update.push_deadline != absl::InfiniteFuture()
                                    ? update.push_deadline
                                    : absl::Now() + options_.reconnect_timeout;
    absl::StatusOr<v1::PushGradientResponse> pushed =
        client_.PushUpdate(update.header, update.delta, deadline);
    if (pushed.ok()) {
      NoteContact(Op::kPush);
      NotePushed(pushed->accepted_this_round());
      return absl::OkStatus();
    }
    if (stopping()) return Stopped();
    const absl::Status& error = pushed.status();
    const absl::StatusCode code = error.code();
    if (code == absl::StatusCode::kAlreadyExists && unanswered) {
      // An earlier attempt arrived though its reply did not: counted.
      NoteContact(Op::kPush);
      NotePushed(std::nullopt);
      return absl::OkStatus();
    }
    if (code == absl::StatusCode::kFailedPrecondition ||
        code == absl::StatusCode::kAlreadyExists) {
      // The round moved on without it (or already has it): nothing to fix.
      NoteContact(Op::kPush);
      DropUpdate("the round moved on", error);
      return absl::OkStatus();
    }
    if (code == absl::StatusCode::kCancelled) {
      // Cut off by the coordinator: its round closed without it (at quorum,
      // most often), or the coordinator is shutting down and, resumed, may ask
      // for this round again. The update is kept, and the next task says
      // which (Train pushes it again for the same round and weights).
      NoteContact(Op::kPush);
      ConsoleLogf(console_,
                  "%s: round %d: push cut off (%s); the update is kept should "
                  "the round be asked for again",
                  name_, update.round, error.ToString());
      return absl::OkStatus();
    }
    if (code == absl::StatusCode::kResourceExhausted) {
      // The coordinator answered "not now" (a push preempted as too slow
      // while others waited for a receive buffer, a limit of the moment): the
      // same update is pushed again after a backoff, without training it
      // again or polling (a poll could hand out a newer task, for which this
      // update no longer counts). A round that closed meanwhile answers
      // FAILED_PRECONDITION.
      NoteContact(Op::kPush);
      const absl::Duration delay = BackoffAfter(refusals++);
      const bool round_over =
          update.push_deadline != absl::InfiniteFuture() &&
          absl::Now() + delay >= update.push_deadline - kPushGrace;
      if (refusals >= options_.max_repeated_errors || round_over) {
        DropUpdate(round_over
                       ? "its round's deadline came"
                       : absl::StrCat("refused ", refusals, " times in a row"),
                   error);
        return absl::OkStatus();
      }
      ConsoleLogf(console_,
                  "%s: round %d: update not taken now (%s); pushing it again "
                  "in %s",
                  name_, update.round, error.ToString(), Millis(delay));
      FEDLEARN_RETURN_IF_ERROR(Pause(delay));
      continue;
    }
    if (!IsRetryable(code) && !MustJoinAgain(code)) {
      // Anything else it refused would be refused again.
      ForgetUpdate();
      ++summary_.updates_rejected;
      return Recover(Op::kPush, error);
    }
    // Unanswered, or answered by a coordinator that does not know us: the
    // update is kept for a coordinator that comes back, and for one that came
    // back without knowing us (a restart resumed from its state directory
    // asks the new identity for the same round, and Train pushes it again).
    const int joins = summary_.joins;
    // UNAVAILABLE or DEADLINE_EXCEEDED (CANCELLED returned above).
    unanswered = unanswered || IsRetryable(code);
    FEDLEARN_RETURN_IF_ERROR(Recover(Op::kPush, error));
    if (summary_.joins != joins ||
        (update.push_deadline != absl::InfiniteFuture() &&
         absl::Now() >= update.push_deadline)) {
      return absl::OkStatus();  // the next task says whether it is wanted
    }
    // The same coordinator is back (or answers again): pushed again at once,
    // before a poll could hand out a newer task.
  }
}

void Agent::NotePushed(std::optional<int> accepted_this_round) {
  Update& update = update_;
  ForgetUpdate();
  // As it travelled: int8 updates are a quarter of the floats' bytes.
  const int64_t bytes = PayloadBytes(client_.spec(), update.header.encoding());
  ++summary_.rounds_trained;
  summary_.bytes_sent += bytes;
  summary_.last_train = update.metrics;
  if (console_ != nullptr && !console_->round_lines()) return;
  const TrainMetrics& m = update.metrics;
  const double seconds =
      std::max(absl::ToDoubleSeconds(update.train_time), 1e-9);
  ConsoleLogf(
      console_,
      "%s: round %d: loss %.4f accuracy %.4f%s; %d examples x %d "
      "epochs in %.2fs (%.0f samples/s); sent %s (%s)",
      name_, update.round, m.loss, m.accuracy,
      m.num_validation > 0
          ? absl::StrFormat(", validation loss %.4f accuracy %.4f",
                            m.validation_loss, m.validation_accuracy)
          : "",
      m.num_examples, update.epochs, seconds,
      static_cast<double>(m.num_examples) * update.epochs / seconds,
      MegaBytes(bytes),
      accepted_this_round.has_value()
          ? absl::StrFormat("update %d of the round", *accepted_this_round)
          : std::string("an earlier attempt's, whose reply was lost"));
}

void Agent::DropUpdate(absl::string_view why, const absl::Status& error) {
  ForgetUpdate();
  ++summary_.updates_rejected;
  ConsoleLogf(console_, "%s: round %d: update not counted, %s (%s)", name_,
              update_.round, why, error.ToString());
}

void Agent::DropKeptUpdate() {
  if (!update_.pending) return;
  DropUpdate("its round is not asked for again",
             absl::CancelledError("kept after its push was cut off or lost"));
}

void Agent::ForgetUpdate() {
  update_.pending = false;
  std::fill(update_.delta.begin(), update_.delta.end(), 0.0f);
}

bool Agent::HoldsUpdateValues() const {
  return std::any_of(update_.delta.begin(), update_.delta.end(),
                     [](float v) { return v != 0.0f; });
}

absl::Status Agent::Evaluate(const CoordinatorClient::ReceivedTask& received) {
  const int64_t attempt = received.task.round();
  absl::StatusOr<EvalMetrics> metrics = trainer_->Evaluate(received.weights);
  if (!metrics.ok()) {
    return absl::Status(metrics.status().code(),
                        absl::StrCat(name_, ": evaluation ", attempt, ": ",
                                     metrics.status().message()));
  }
  if (stopping()) return Stopped();
  v1::ReportEvalRequest report;
  report.set_round(attempt);
  report.set_test_loss(metrics->loss);
  report.set_test_accuracy(metrics->accuracy);
  report.set_num_examples(metrics->num_examples);
  const absl::Status reported = client_.ReportEval(report);
  if (reported.ok()) {
    NoteContact(Op::kReport);
    summary_.evaluated = true;
    summary_.last_eval = *metrics;
    ConsoleLogf(
        console_,
        "%s: evaluation %d: test loss %.4f accuracy %.4f on %d examples", name_,
        attempt, metrics->loss, metrics->accuracy, metrics->num_examples);
    return absl::OkStatus();
  }
  if (stopping()) return Stopped();
  if (RoundMovedOn(reported.code())) {
    NoteContact(Op::kReport);
    ConsoleLogf(console_, "%s: evaluation %d: report not counted (%s)", name_,
                attempt, reported.ToString());
    return absl::OkStatus();
  }
  return Recover(Op::kReport, reported);
}

}  // namespace fedlearn
