#ifndef FEDLEARN_SERVER_RUN_CONTROLLER_H_
#define FEDLEARN_SERVER_RUN_CONTROLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model_spec.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "server/client_manager.h"
#include "server/evaluation_phase.h"
#include "server/history.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/privacy/privacy_ledger.h"
#include "server/scheduler.h"
#include "server/state_store.h"
#include "server/stop_condition.h"
#include "server/strategy/strategy.h"
#include "server/task.h"
#include "server/task_board.h"

namespace fedlearn {

// Which clients a status lists: `size` of those remembered, in join order,
// from join index `first_index` on (a page token is that index, so clients
// forgotten between two pages make neither skip nor repeat one).
struct ClientPage {
  size_t first_index = 0;
  int size = 100;
};

// How many of the latest history records a status carries by default, and
// at most.
inline constexpr size_t kDefaultHistory = 100;
inline constexpr size_t kMaxHistory = 10000;
// And at most this many bytes of them, as they travel (client ids included
// when asked for): the newest records that fit. A status reply must stay
// under the largest message the coordinator sends (kMaxChunkBytes + 64 KiB,
// coordinator_server.cc), and a round of 10,000 clients' ids is 240 KB.
inline constexpr size_t kMaxStatusHistoryBytes = size_t{512} << 10;

// What a GetStatusRequest asks a status to show: a page of clients (size 0 is
// 100, above 1000 is 1000; the token one a status gave, next_client_page_token)
// and the latest `history` records (0 is kDefaultHistory, above kMaxHistory is
// kMaxHistory), with their client ids or not. INVALID_ARGUMENT for a negative
// size or a token no status gave.
struct StatusQuery {
  ClientPage page;
  size_t history = kDefaultHistory;
  bool client_ids = false;
};
absl::StatusOr<StatusQuery> ParseStatusRequest(
    const v1::GetStatusRequest& request);

// Runs one federated training run: owns the one mutex, the phase machine
//   WAITING_FOR_CLIENTS -> TRAINING -> ... -> EVALUATING -> DONE,
// the deadline timer and the global model and its version; asks its parts for
// decisions and carries them out after unlocking (poll answers, push
// cancellations, saves). The parts, none of which calls back up:
//   ClientManager    join, tokens, liveness, seeded sampling
//   TaskBoard        posted tasks and held polls
//   Scheduler        when steps open and close, who may push, how an update
//                    weighs (SyncScheduler, AsyncScheduler)
//   Strategy         update transforms, aggregator, server optimizer
//   StopCondition    max rounds, convergence
//   EvaluationPhase  the final evaluation
//   History          records, counters, rejections
//   PrivacyLedger    epsilon spent under central DP, and its budget
//   StateStore       the run on disk
// One push walks a straight line: AdmitUpdate (header: metrics, then the
// scheduler's admission) -> the caller receives the update into its private
// buffer -> CommitUpdate (transforms outside the lock, then the scheduler's
// acceptance and the aggregator's fold under it) -> at a step's close the
// optimizer makes the next model version and the board hands it out.
// Every method is thread-safe; callbacks handed in are always run without the
// lock held. Errors carry the status codes of the wire contract
// (proto/fedlearn/v1/coordinator.proto).
class RunController {
 public:
  // `initial` holds spec.num_parameters() floats; `options` must be valid and
  // `strategy` made for this model (its optimizer already restored on resume).
  // With a `store`, the run is saved there after every aggregation step and
  // evaluation attempt; with `resume` (a run loaded from it), the run goes on
  // from there: its weights replace `initial`, training resumes at the saved
  // round (clients join anew), an evaluation phase starts over, a finished run
  // stays DONE.
  RunController(CoordinatorOptions options, ModelSpec spec,
                std::vector<float> initial, Strategy strategy,
                std::unique_ptr<StateStore> store = nullptr,
                std::optional<SavedRun> resume = std::nullopt);
  ~RunController();  // Shuts down.

  // Whether `strategy` can aggregate every step these options allow, checked
  // before a run starts so that it never fails mid-round: its rule's fewest
  // updates (Krum's 2f + 3) within the quorum of the smallest sample, and, for
  // an aggregator that keeps every update, the largest step within `budget`
  // unless it may spill. INVALID_ARGUMENT saying the numbers otherwise.
  static absl::Status CheckStrategy(const CoordinatorOptions& options,
                                    const Strategy& strategy,
                                    const AggregationBudget& budget);

  RunController(const RunController&) = delete;
  RunController& operator=(const RunController&) = delete;

  // Stops the run: pending polls and every later call fail with UNAVAILABLE;
  // pushes in flight are cancelled. Idempotent.
  void Shutdown();

  // A private run resumed in training has charged a round for a release its
  // crash may have left unrecorded. Writes that charge to the state
  // directory, to be called before the run serves: else a second crash
  // before the next save would find the first charge missing and charge one
  // round for two releases. OK at once for any other run; the store's error
  // otherwise.
  absl::Status SaveResumeCharge();

  // Registers a client. UNAUTHENTICATED for a wrong join token,
  // RESOURCE_EXHAUSTED at --max_clients, INVALID_ARGUMENT for a malformed
  // request, UNAVAILABLE when shutting down.
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request);

  // Checks that `token` is `client_id`'s session token, and notes that the
  // client is alive. UNAUTHENTICATED for a missing or unknown token, NOT_FOUND
  // for an unknown client, PERMISSION_DENIED for another client's token.
  absl::Status Authorize(absl::string_view client_id, absl::string_view token);

  // Who presents `token`, for the errors of a call that names no client
  // (a push without its header): "client ID", or `peer` when the token is
  // nobody's.
  std::string CallerName(absl::string_view token, absl::string_view peer) const;

  // Long poll for `client_id`'s next task (the client must be authorized).
  // `done` is called exactly once, never under the lock: with the task as soon
  // as there is one, with WAIT when `max_wait` (capped by --poll_timeout)
  // passes, with UNAVAILABLE at shutdown, or with CANCELLED after CancelPoll.
  // Returns an id for CancelPoll.
  uint64_t Poll(absl::string_view client_id, absl::Duration max_wait,
                PollCallback done);
  void CancelPoll(uint64_t poll_id);

  // Admits the header of a push before its chunks are read, so a push that
  // cannot count is turned away without reading the update. The ticket it
  // returns goes with the update to CommitUpdate; `cancel` is run (once, never
  // under the lock) if the push can no longer count while it streams, until
  // the ticket's handle is disarmed. FAILED_PRECONDITION for a wrong phase, a
  // stale round or an unselected client; ALREADY_EXISTS for a second update;
  // INVALID_ARGUMENT for bad metadata. Rejections are counted in the history.
  absl::StatusOr<Ticket> AdmitUpdate(const v1::UpdateHeader& header,
                                     std::function<void()> cancel);

  // Aggregates a complete, verified update (a delta of num_parameters floats
  // on the caller's private buffer, which the strategy's transforms rewrite in
  // place) admitted with `ticket`; `bytes` came over the wire, and `norm` is
  // the update's L2 norm as sent (the dashboard's; the receiver has it from
  // ChunkAssembler::sum_of_squares without another pass). Closes the step
  // when it completes it. Same errors as AdmitUpdate for a push that can no
  // longer count; a rejected update changes nothing.
  absl::StatusOr<v1::PushGradientResponse> CommitUpdate(
      const Ticket& ticket, const v1::UpdateHeader& header,
      absl::Span<float> delta, int64_t bytes, double norm);

  // Counts a push that failed while streaming (bad chunk, stream cut short).
  void RecordRejection(Rejection reason);

  // Accepts an evaluation report. FAILED_PRECONDITION outside EVALUATING or for
  // a client not asked to evaluate or a wrong round, ALREADY_EXISTS for a
  // second report, INVALID_ARGUMENT for non-finite or out-of-range metrics.
  absl::Status ReportEval(const v1::ReportEvalRequest& request);

  // Records liveness and progress.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& request);

  // The run as GetStatus reports it, listing the clients of `page` (and
  // counting every one) and the latest `history` records that fit in
  // `history_bytes` (and counting every one), the records' client ids only
  // when `client_ids` (as GetStatusRequest.client_ids). With `counters`, also
  // the run's counters of the same moment (one lock), for /metrics. The lock
  // is held for the page and a pointer per record; the records are copied
  // after it is released.
  v1::GetStatusResponse GetStatus(
      const ClientPage& page = ClientPage(), RunCounters* counters = nullptr,
      size_t history = kDefaultHistory, bool client_ids = false,
      size_t history_bytes = kMaxStatusHistoryBytes) const;

  // The current global weights; with `rounds`, also the number of model
  // versions made (rounds folded into them).
  Weights global_weights(int64_t* rounds = nullptr) const;

  v1::Phase phase() const;

  // Waits until the run reaches `phase` (or a later one) or `timeout` passes;
  // returns whether it did.
  bool AwaitPhase(v1::Phase phase, absl::Duration timeout) const;

  // After DONE: waits until every live client has been told DONE (or `timeout`
  // passes), so that the coordinator can exit without leaving agents polling.
  // Returns whether all were told.
  bool AwaitClientsDone(absl::Duration timeout) const;

  // Waits until `n` polls are being held open (or `timeout` passes).
  bool AwaitPendingPolls(size_t n, absl::Duration timeout) const;

  // Waits until `n` rounds or evaluation attempts (closed or abandoned) are in
  // the history, or `timeout` passes; returns whether they are.
  bool AwaitHistory(size_t n, absl::Duration timeout) const;

  const ModelSpec& spec() const { return spec_; }
  const CoordinatorOptions& options() const { return options_; }
  const std::string& strategy_name() const { return strategy_.name; }
  const std::string& run_id() const { return run_id_; }
  int64_t chunk_bytes() const {
    return static_cast<int64_t>(options_.chunk_bytes);
  }

 private:
  // What a call decided to do once the lock is released, in this order: poll
  // answers, push cancellations, then the save (so that the next round's tasks
  // do not wait for the disk).
  struct Effects {
    TaskBoard::Deliveries deliveries;
    std::vector<std::shared_ptr<CancelHandle>> cancels;
    std::function<void()> save;
    void Run();
  };

  // Everything of a status but its history.
  void StatusLocked(const ClientPage& page, RunCounters* counters,
                    bool client_ids, v1::GetStatusResponse* status) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The round being (or to be) trained; once training stopped, the last one.
  int64_t RoundLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // UNAVAILABLE once shutting down, naming `client_id` (the caller's; empty
  // for a caller not known yet).
  absl::Status CheckRunningLocked(absl::string_view client_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notes what a client is about to be sent (bytes, a DONE), and gives a
  // TRAIN or EVALUATE task its retire handle (Task::retire), tracked by the
  // scheduler or the evaluation phase.
  void NoteSentLocked(const std::string& client_id, Task* sent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes answers of held polls into `effects`, noting what each was sent.
  void AbsorbLocked(TaskBoard::Deliveries deliveries, absl::Time now,
                    Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetDefaultLocked(Task task, absl::Time now, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Task WaitTaskLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens a training step or evaluation attempt when the phase wants one and
  // enough clients are alive.
  void MaybeStartLocked(absl::Time now, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the open training step with `outcome`: steps the model through the
  // strategy's optimizer (unless "abandoned"), records it, asks the stop
  // condition, starts what comes next.
  void CloseStepLocked(absl::string_view outcome, absl::Time now,
                       Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopTrainingLocked(const std::string& reason, absl::Time now,
                          Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseEvaluationLocked(absl::string_view outcome, absl::Time now,
                             Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The run as it is now, for the store: its records from the first one no
  // save is known to have written (History's eviction mark), so that what is
  // taken under the lock does not grow with the run.
  SavedRun SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Saves `run` to the store (outside the lock), and notes what it wrote.
  absl::Status Save(const SavedRun& run) ABSL_LOCKS_EXCLUDED(mu_);
  // With a store, the save of the run as it is now (to run outside the lock);
  // null without one. A private run whose save fails stops training
  // (StopAfterAFailedSave).
  std::function<void()> SaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under central DP a round is released before its save, and a restart
  // charges one round for a release it may have missed; a second release
  // with the first still unsaved would be under-charged. So a private run
  // whose save failed releases nothing more: training stops (stop_reason
  // "state_not_saved") and the evaluation phase runs.
  void StopAfterAFailedSave();
  // The run is DONE: every poll is answered DONE from now on, `summary`
  // (with the byte totals) is logged and the run saved.
  void FinishLocked(const std::string& summary, absl::Time now,
                    Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();
  void RunTimersLocked(absl::Time now, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time NextTimerLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const ModelSpec spec_;
  const v1::ModelSpec spec_proto_;
  const std::unique_ptr<StateStore> store_;  // null: nothing is saved
  std::string run_id_;                       // set once, in the constructor
  std::shared_ptr<const v1::TrainingPlan> plan_;  // set once, likewise

  mutable absl::Mutex mu_;
  // The strategy's transforms are immutable and run outside the lock; so does
  // its aggregator's Stage, which is thread-safe (aggregator.h). Every other
  // aggregator call, and the optimizer, only under it.
  Strategy strategy_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool timer_dirty_ ABSL_GUARDED_BY(mu_) = false;  // wakes the timer thread
  // When the timer thread, waiting, wakes on its own (InfinitePast while it
  // runs): what needs it sooner sets timer_dirty_, and nothing else does.
  absl::Time timer_wakes_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  v1::Phase phase_ ABSL_GUARDED_BY(mu_) = v1::PHASE_WAITING_FOR_CLIENTS;
  // The global model, handed out as a read-only `Weights` snapshot, and the
  // one before it: the next model is computed into `retired_` when nothing
  // else holds it any more (a task's snapshot, a save), instead of into a
  // fresh model-sized block, which costs a page fault per 4 KiB page under the
  // lock (on the VMs this runs on, more than the step itself). At most two
  // model buffers beyond the snapshots. Only the close writes either.
  std::shared_ptr<std::vector<float>> global_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<std::vector<float>> retired_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // model versions made
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::EvaluationResult> final_evaluation_ ABSL_GUARDED_BY(mu_);
  ClientManager clients_ ABSL_GUARDED_BY(mu_);
  TaskBoard board_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Scheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  StopCondition stop_ ABSL_GUARDED_BY(mu_);
  EvaluationPhase evaluation_ ABSL_GUARDED_BY(mu_);
  History history_ ABSL_GUARDED_BY(mu_);
  // Under central DP (strategy_.dp): the privacy spent and its budget.
  PrivacyLedger privacy_ ABSL_GUARDED_BY(mu_);
  // A resumed private run's charge for a release its crash may have left
  // unrecorded is not on disk yet (SaveResumeCharge).
  bool resume_charge_unsaved_ ABSL_GUARDED_BY(mu_) = false;

  std::thread timer_;
};

// Checks the metadata of a push header that every mode needs: num_examples >
// 0, finite losses, accuracies in [0, 1], a dense or quantized encoding.
// INVALID_ARGUMENT naming the client otherwise.
absl::Status CheckUpdateHeader(const v1::UpdateHeader& header);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_RUN_CONTROLLER_H_
