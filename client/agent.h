#ifndef FEDLEARN_CLIENT_AGENT_H_
#define FEDLEARN_CLIENT_AGENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/progress.h"
#include "client/trainer.h"
#include "common/files.h"
#include "fedlearn/v1/coordinator.pb.h"

namespace fedlearn {

class CallCanceller;

// How an agent reaches the coordinator and how patient it is.
struct AgentOptions {
  // "HOST:PORT" of the coordinator; when `channel` is set, only named in
  // messages.
  std::string coordinator = "localhost:50051";
  // A channel to use instead of dialling `coordinator`. Make it with
  // MakeCoordinatorChannel so that Stop() can cut calls in flight short; on any
  // other channel Stop() waits for the call in flight (a poll: at most
  // `poll_wait`).
  std::shared_ptr<grpc::Channel> channel;

  std::string join_token;  // the coordinator's join secret, if it has one
  // Where the agent keeps its client id and session token (empty: nowhere).
  // An agent restarted after a crash presents them at its first Join, so the
  // coordinator retires its old identity at once instead of counting it alive
  // (and sampling it) until --client_timeout. Written mode 0600 after every
  // join; a file that does not parse is ignored and rewritten. Run() locks it
  // (an flock on "<session_file>.lock", released when the agent ends, however
  // it ends): two live agents sharing it would retire each other at every
  // re-join, so a second one is refused at once.
  std::string session_file;
  std::string display_name;  // for the coordinator's logs and dashboard; also
                             // the prefix of this agent's log lines
  int64_t num_train_examples = 0;  // told at Join, for information only
  int64_t num_test_examples = 0;
  // Whether the trainer can evaluate (it has test data); false asks the
  // coordinator never to send EVALUATE (JoinRequest.no_evaluation).
  bool evaluates = true;

  // Reconnecting: after a call fails UNAVAILABLE, DEADLINE_EXCEEDED or
  // CANCELLED, wait initial_backoff, doubling per failure up to max_backoff,
  // each wait jittered by +-20%.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  // Give up (UNAVAILABLE) once the coordinator has not answered for this long.
  absl::Duration reconnect_timeout = absl::Minutes(10);

  // How long the coordinator may hold a poll open (it caps this with its
  // --poll_timeout).
  absl::Duration poll_wait = absl::Seconds(30);
  // Send heartbeats with training progress at the interval the coordinator
  // suggests at Join.
  bool heartbeat = true;
  // An error that no retry or re-join can fix (INVALID_ARGUMENT on our own
  // push, say) is logged and the agent polls on; the same kind of call failing
  // this many times in a row ends Run with that error. An update refused "not
  // now" (RESOURCE_EXHAUSTED) this many times in a row is dropped.
  int max_repeated_errors = 3;
  // Seed of the backoff jitter (0: unpredictable).
  uint64_t jitter_seed = 0;
  // How updates travel: ENCODING_DENSE (float32) or ENCODING_QUANTIZED (int8
  // with a scale per tensor: a quarter of the bytes; see tensor_codec.h).
  v1::Encoding update_encoding = v1::ENCODING_DENSE;

  // Where the agent shows its training progress and writes its log lines
  // (--progress); may be shared by the agents of a process, each with its own
  // `progress_slot`. Null: log lines go to Logf and nothing shows progress
  // (as --progress=plain).
  std::shared_ptr<ProgressConsole> progress;
  int progress_slot = 0;
};

// What one agent did over a run, returned by Agent::Run.
struct AgentSummary {
  std::string client_id;  // the id of the last join
  std::string run_id;
  int joins = 0;               // 1 + re-joins after the coordinator forgot us
  int rounds_trained = 0;      // updates the coordinator accepted
  int updates_rejected = 0;    // updates turned away (round moved on, ...)
  TrainMetrics last_train;     // of the last accepted update
  bool evaluated = false;      // whether an evaluation report was accepted
  EvalMetrics last_eval;       // of the last accepted evaluation report
  int64_t bytes_sent = 0;      // update payload bytes accepted
  int64_t bytes_received = 0;  // weight payload bytes received
  absl::Duration wall_time;    // from Run's start to DONE
};

// Builds the agent's trainer from what Join returned (the model spec and the
// plan). Called after the first Join and again after a re-join only if the
// model changed.
using TrainerFactory = std::function<absl::StatusOr<std::unique_ptr<Trainer>>(
    const v1::JoinResponse&)>;

// A channel to the coordinator at `address` ("HOST:PORT") for agents: calls
// made over it can be cut short by Agent::Stop, and it redials a restarted
// coordinator at least every `max_backoff` (gRPC's own default waits up to two
// minutes). Several agents may share one. `credentials` null: insecure;
// `tls_server_name` overrides the name the coordinator's certificate must
// carry (default: the host of `address`).
std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(
    const std::string& address, absl::Duration max_backoff,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
    const std::string& tls_server_name = "");

// One federated client: joins the coordinator, then polls for tasks, trains
// and evaluates with its Trainer, and pushes its updates until the run is
// DONE. Survives a coordinator that goes away (retries with capped exponential
// backoff) or restarts and forgets it (joins again). Owns its trainer and its
// connection identity. Run() is called once, from one thread; Stop() may be
// called from any thread at any time.
class Agent {
 public:
  Agent(AgentOptions options, TrainerFactory trainer_factory);
  ~Agent();

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the client until the coordinator says DONE; returns what it did.
  // Errors: CANCELLED after Stop(); FAILED_PRECONDITION when another running
  // agent holds the session file; UNAUTHENTICATED for a wrong join token and
  // PERMISSION_DENIED or INVALID_ARGUMENT for a join the coordinator refuses;
  // UNAVAILABLE when the coordinator stays unreachable for reconnect_timeout;
  // the trainer factory's or the trainer's error; the error of a call that
  // failed max_repeated_errors times in a row. Messages name the agent.
  absl::StatusOr<AgentSummary> Run();

  // Whether any value of the last trained update is still held. An update is
  // held only until its push is settled (accepted, or refused for good), then
  // wiped: what a client's data taught its model lives no longer than it must.
  // For tests; call when Run() is not running.
  bool HoldsUpdateValues() const;

  // Makes Run() return CANCELLED soon: at once from a poll, a backoff or any
  // call over a MakeCoordinatorChannel channel; a round being trained is
  // finished first (Trainer has no way to be interrupted). Idempotent.
  void Stop();

 private:
  // The kinds of call whose repeated failures are counted separately.
  enum class Op { kJoin, kPoll, kPush, kReport };

  // The last update trained. Its buffers are kept across rounds so that their
  // pages are touched once. While `pending`, its push failed for want of a
  // coordinator, was refused by one that no longer knew this identity (a
  // restart), or was cut off (CANCELLED): it is pushed again, without
  // retraining, if the same run's same round comes back with the same
  // weights, and dropped as rejected at any other task.
  struct Update {
    std::string run_id;  // of the join it was trained under
    int64_t round = 0;
    std::vector<float> weights;  // the task's weights the update started from
    std::vector<float> delta;    // trained weights minus `weights`
    v1::UpdateHeader header;
    TrainMetrics metrics;
    absl::Duration train_time;
    int epochs = 1;  // local epochs of the plan: each saw every example
    // When its push gives up unanswered: the round's deadline as the task
    // gave it plus kPushGrace (the coordinator cuts off a push whose round
    // closed, so only a coordinator that stopped answering gets there);
    // never when the task had no deadline (async mode).
    absl::Time push_deadline = absl::InfiniteFuture();
    bool pending = false;
  };

  // Takes options_.session_file's lock for the agent's lifetime.
  absl::Status LockSession();
  absl::Status Join();
  // Decides what a failed call means: waits and returns OK to go on (after a
  // backoff, or a re-join), or returns the error that ends Run.
  absl::Status Recover(Op op, const absl::Status& error);
  absl::Status Train(CoordinatorClient::ReceivedTask task);
  // Pushes update_: again, without training it again, while the coordinator
  // answers "not now" or comes back from a failure as the same coordinator;
  // one cut off is kept for the next task to decide.
  absl::Status Push();
  // What a push the coordinator took leaves: the summary and its log line
  // (its place in the round; nullopt when an attempt whose reply was lost
  // was the one taken).
  void NotePushed(std::optional<int> accepted_this_round);
  // Wipes update_, not counted (`why`, the coordinator's `error`).
  void DropUpdate(absl::string_view why, const absl::Status& error);
  // Drops update_ if it is kept (pending) and counts it rejected: the task
  // that came is not its round (another round or run, EVALUATE, DONE).
  void DropKeptUpdate();
  // The last update's push is settled: it is no longer pending and its values
  // are zeroed (the buffer is kept, its pages touched once).
  void ForgetUpdate();
  absl::Status Evaluate(const CoordinatorClient::ReceivedTask& task);
  // Waits `delay` unless stopped first; CANCELLED if stopped.
  absl::Status Pause(absl::Duration delay);
  // Like Pause after a call failed for want of a coordinator, but also drives
  // the channel's reconnection (with the synchronous API nothing else polls a
  // channel whose calls fail fast, and gRPC would notice a coordinator that
  // came back only every 5s), and returns as soon as a new connection is up.
  // Stop() takes effect within 100 ms (kStopLatency).
  absl::Status AwaitCoordinator(absl::Duration delay);
  // The jittered backoff after failures_ failures in a row, counting one more.
  absl::Duration NextBackoff();
  // The jittered backoff after `failures` in a row (common/retry.h).
  absl::Duration BackoffAfter(int failures);
  // A call got an answer: the coordinator is there.
  void NoteContact(Op op);
  absl::Status Stopped() const;
  bool stopping() const;

  const AgentOptions options_;
  const TrainerFactory trainer_factory_;
  ProgressConsole* const console_;  // options_.progress; may be null
  const std::string name_;          // for log lines and messages
  const std::string target_;        // the coordinator, for messages
  std::shared_ptr<grpc::Channel> channel_;
  // Cuts short calls the Run thread makes (over a MakeCoordinatorChannel
  // channel) once Stop() is called. Thread-safe.
  std::unique_ptr<CallCanceller> canceller_;
  mutable absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;

  // Owned by the thread in Run().
  std::optional<ScopedFd> session_lock_;  // while Run() holds session_file
  CoordinatorClient client_;
  std::unique_ptr<Trainer> trainer_;
  v1::JoinResponse joined_;
  AgentSummary summary_;
  Update update_;
  int failures_ = 0;           // consecutive failed calls, for the backoff
  bool rejoined_ = false;      // joined again since the last answered call
  std::map<Op, int> repeats_;  // consecutive non-retryable errors per Op
  // When the calls began to fail, none answered since (InfiniteFuture while
  // the last call was answered): reconnect_timeout counts from here.
  absl::Time failing_since_ = absl::InfiniteFuture();
  std::mt19937_64 jitter_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_AGENT_H_
