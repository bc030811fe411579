#include "server/run_controller.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/tensor_codec.h"
#include "server/async_scheduler.h"
#include "server/secrets.h"
#include "server/sync_scheduler.h"

namespace fedlearn {
namespace {

constexpr size_t kMaxDisplayName = 256;

// A held poll may be answered (WAIT) up to this much before its max_wait runs
// out, which the contract allows ("held open at most max_wait_ms"): the polls
// expiring within it are answered in one wakeup of the timer thread rather
// than one each. Idle clients renew their polls every max_wait, at times
// spread as their joins were: 10,000 of them, 10,000 wakeups per max_wait.
constexpr absl::Duration kPollExpirySlack = absl::Milliseconds(50);

std::unique_ptr<Scheduler> MakeScheduler(const CoordinatorOptions& o) {
  if (o.mode == Mode::kAsync) {
    AsyncScheduler::Options a;
    a.min_clients = o.min_clients;
    a.buffer = o.async_buffer;
    a.mixing = o.AsyncMixing();
    a.staleness_exponent = o.staleness_exponent;
    a.max_staleness = o.max_staleness;
    a.download_versions = o.download_versions;
    return std::make_unique<AsyncScheduler>(a);
  }
  SyncScheduler::Options s;
  s.min_clients = o.min_clients;
  s.clients_per_round = o.clients_per_round;
  s.fraction = o.fraction;
  s.over_selection = o.over_selection;
  s.tolerance = o.tolerance;
  s.round_timeout = o.round_timeout;
  s.rounds_between_validations = o.rounds_between_validations;
  return std::make_unique<SyncScheduler>(s);
}

std::string Megabytes(double bytes) {
  return absl::StrFormat("%.1f MB", bytes / 1e6);
}

int64_t WeightBytes(const Task& task) {
  return task.weights == nullptr
             ? 0
             : static_cast<int64_t>(task.weights->size() * sizeof(float));
}

}  // namespace

absl::Status CheckUpdateHeader(const v1::UpdateHeader& header) {
  // The metrics feed the history, /metrics and the convergence test: as for
  // an evaluation report, losses must be finite and accuracies fractions.
  auto fraction = [](double x) { return x >= 0 && x <= 1; };
  const bool metrics_ok = std::isfinite(header.train_loss()) &&
                          std::isfinite(header.validation_loss()) &&
                          fraction(header.train_accuracy()) &&
                          fraction(header.validation_accuracy());
  if (header.num_examples() <= 0 ||
      header.num_examples() > kMaxExamplesPerAnswer ||
      header.num_validation_examples() < 0 ||
      header.num_validation_examples() > kMaxExamplesPerAnswer || !metrics_ok ||
      (header.encoding() != v1::ENCODING_DENSE &&
       header.encoding() != v1::ENCODING_UNSPECIFIED &&
       header.encoding() != v1::ENCODING_QUANTIZED)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client ", header.client_id(),
        ": header needs num_examples in [1, 2^40] (validation: [0, 2^40]), "
        "finite losses, accuracies in [0, 1] and a dense or quantized "
        "encoding"));
  }
  return absl::OkStatus();
}

void RunController::Effects::Run() {
  for (TaskBoard::Delivery& d : deliveries) d.Run();
  for (auto& handle : cancels) handle->Cancel();
  if (save) save();
}

RunController::RunController(CoordinatorOptions options, ModelSpec spec,
                             std::vector<float> initial, Strategy strategy,
                             std::unique_ptr<StateStore> store,
                             std::optional<SavedRun> resume)
    : options_(std::move(options)),
      spec_(std::move(spec)),
      spec_proto_(ToProto(spec_)),
      store_(std::move(store)),
      run_id_(RandomHex(8)),
      strategy_(std::move(strategy)),
      clients_({options_.max_clients, options_.client_timeout, options_.seed,
                2 * options_.heartbeat_interval, options_.ForgetAfter()}),
      scheduler_(MakeScheduler(options_)),
      stop_(options_.max_rounds, options_.convergence_threshold),
      evaluation_(options_.tolerance, options_.eval_timeout),
      history_(History::kDefaultIdBytes,
               static_cast<size_t>(options_.history_in_memory)),
      privacy_(strategy_.dp, options_.dp_delta, options_.dp_max_epsilon) {
  v1::TrainingPlan plan = options_.Plan();
  plan.set_proximal_mu(static_cast<float>(strategy_.config.proximal_mu()));
  plan_ = std::make_shared<const v1::TrainingPlan>(std::move(plan));
  absl::MutexLock lock(&mu_);
  global_ = std::make_shared<std::vector<float>>(std::move(initial));
  // The first step's output, made and touched now rather than under the lock
  // at the first close.
  retired_ = std::make_shared<std::vector<float>>(global_->size());
  if (resume.has_value()) {
    const v1::CoordinatorState& s = resume->state;
    run_id_ = s.run_id();
    // Into the reusable buffer (ReadSafetensors checked the size against the
    // spec), so that a resumed run reuses buffers like a fresh one.
    global_->assign(resume->weights->begin(), resume->weights->end());
    version_ = s.model_round();
    phase_ = s.phase() == v1::PHASE_EVALUATING || s.phase() == v1::PHASE_DONE
                 ? s.phase()
                 : v1::PHASE_WAITING_FOR_CLIENTS;
    history_.Restore({s.history().begin(), s.history().end()}, s.bytes_sent(),
                     s.bytes_received());
    // Attempts go on being numbered where the records stopped, so that no two
    // records share a round and an attempt.
    int training_attempts = 0, evaluation_attempts = 0;
    for (const v1::RoundRecord& r : s.history()) {
      if (r.evaluation()) {
        evaluation_attempts = std::max(evaluation_attempts, r.attempt());
      } else if (r.round() == version_ + 1) {
        training_attempts = std::max(training_attempts, r.attempt());
      }
    }
    scheduler_->ResumeAttempts(version_ + 1, training_attempts);
    evaluation_.ResumeAttempts(evaluation_attempts);
    // The privacy spent is the composition of the released rounds, each
    // record holding what it was charged.
    std::string restored;
    if (std::optional<double> clip = privacy_.Restore(
            s, phase_ == v1::PHASE_WAITING_FOR_CLIENTS, &restored)) {
      strategy_.dp_aggregator->RestoreClipNorm(*clip);
    }
    if (!restored.empty()) Logf("run %s: %s", run_id_, restored);
    resume_charge_unsaved_ = store_ != nullptr && privacy_.enabled() &&
                             phase_ == v1::PHASE_WAITING_FOR_CLIENTS;
    if (s.has_previous_train_loss()) stop_.Restore(s.previous_train_loss());
    stop_reason_ = s.stop_reason();
    if (s.has_final_evaluation()) final_evaluation_ = s.final_evaluation();
    clients_.ResumeNumbering(
        static_cast<size_t>(std::max<int64_t>(0, s.clients_joined())));
    if (absl::Status restored = clients_.RestoreSampler(s.sampler());
        !restored.ok()) {
      Logf("run %s: %s; sampling starts afresh", run_id_, restored.ToString());
    }
    Logf(
        "run %s resumed from %s: %s at round %d (%d rounds folded, %d "
        "records)",
        run_id_, store_ != nullptr ? store_->dir() : "a saved run",
        v1::Phase_Name(phase_), RoundLocked(), version_, history_.total());
  }
  // With a store, History's eviction mark is the records a save wrote: a
  // record leaves memory only once it is on disk (Save moves the mark), and
  // a snapshot passes only the records from the mark on. Those the history
  // file of a resumed run holds are on disk already.
  if (store_ != nullptr) {
    history_.AllowEvictionBefore(
        static_cast<size_t>(resume.has_value() ? resume->records_on_disk : 0));
  }
  Task initial_task = WaitTaskLocked();
  if (phase_ == v1::PHASE_DONE) initial_task.type = v1::TASK_TYPE_DONE;
  board_.SetDefault(std::move(initial_task));  // nobody polls yet
  timer_ = std::thread([this] { TimerLoop(); });
  Logf("run %s: model %s (%d parameters), strategy %s, waiting for %d clients",
       run_id_, spec_.name, spec_.num_parameters, strategy_.name,
       options_.min_clients);
}

absl::Status RunController::CheckStrategy(const CoordinatorOptions& options,
                                          const Strategy& strategy,
                                          const AggregationBudget& budget) {
  const Scheduler::StepBounds bounds =
      MakeScheduler(options)->UpdatesPerStep(options.max_clients);
  const std::string where =
      options.mode == Mode::kAsync
          ? absl::StrCat("--async_buffer=", options.async_buffer)
          : absl::StrCat(
                "the quorum of ", bounds.min,
                " from the smallest round (--min_clients=", options.min_clients,
                ", --clients_per_round=", options.clients_per_round,
                ", --fraction=", options.fraction,
                ", --tolerance=", options.tolerance, ")");
  if (bounds.min < strategy.min_updates) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--strategy=", strategy.name, " with ",
        strategy.config.ShortDebugString(), " needs at least ",
        strategy.min_updates,
        " updates per step, but a step may complete with ", bounds.min, " (",
        where, "): sample more clients or tolerate fewer Byzantine ones"));
  }
  const size_t per_update = strategy.aggregator->bytes_per_update();
  if (per_update == 0 || !budget.spill_dir.empty()) return absl::OkStatus();
  const double needed = static_cast<double>(per_update) * bounds.max;
  if (needed > static_cast<double>(budget.memory_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--strategy=", strategy.name, " keeps every update of a step: up to ",
        bounds.max, " updates (",
        options.mode == Mode::kAsync
            ? absl::StrCat("--async_buffer=", options.async_buffer)
            : absl::StrCat("--clients_per_round=", options.clients_per_round,
                           " or --fraction=", options.fraction, " of up to ",
                           options.max_clients, " clients, x --over_selection=",
                           options.over_selection),
        ") of ", Megabytes(static_cast<double>(per_update)), " = ",
        Megabytes(needed), ", over --aggregation_memory=",
        options.aggregation_memory, " (", Megabytes(budget.memory_bytes),
        ") with --aggregation_spill_dir=none: raise the budget, let it spill, "
        "or sample fewer clients"));
  }
  return absl::OkStatus();
}

RunController::~RunController() {
  Shutdown();
  timer_.join();
}

int64_t RunController::RoundLocked() const {
  return phase_ == v1::PHASE_EVALUATING || phase_ == v1::PHASE_DONE
             ? version_
             : version_ + 1;
}

Task RunController::WaitTaskLocked() const {
  Task wait;
  wait.type = v1::TASK_TYPE_WAIT;
  wait.round = RoundLocked();
  wait.retry_after = kWaitRetryAfter;
  return wait;
}

void RunController::Shutdown() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    timer_dirty_ = true;
    effects.deliveries = board_.CloseAll(CheckRunningLocked(""));
    effects.cancels = scheduler_->Stop();
  }
  effects.Run();
}

absl::Status RunController::CheckRunningLocked(
    absl::string_view client_id) const {
  if (!shutting_down_) return absl::OkStatus();
  if (client_id.empty()) {
    return absl::UnavailableError("coordinator is shutting down");
  }
  return absl::UnavailableError(
      absl::StrCat("client ", client_id, ": coordinator is shutting down"));
}

void RunController::NoteSentLocked(const std::string& client_id, Task* sent) {
  // Only TRAIN and EVALUATE tasks carry weights.
  if (sent->weights != nullptr) sent->retire = std::make_shared<CancelHandle>();
  const Task& task = *sent;
  if (task.type == v1::TASK_TYPE_DONE) {
    if (absl::StatusOr<Client*> c = clients_.Get(client_id); c.ok()) {
      (*c)->told_done = true;
    }
  }
  const int64_t bytes = WeightBytes(task);
  history_.AddBytesSent(bytes);
  if (task.type == v1::TASK_TYPE_EVALUATE) {
    evaluation_.NoteSent(task, bytes);
  } else {
    scheduler_->NoteSent(client_id, task, bytes);
  }
}

void RunController::AbsorbLocked(TaskBoard::Deliveries deliveries,
                                 absl::Time now, Effects* effects) {
  for (TaskBoard::Delivery& d : deliveries) {
    absl::StatusOr<Client*> client = clients_.Get(d.client_id);
    if (client.ok()) {
      if (absl::IsCancelled(d.task.status())) {
        clients_.PollCancelled(*client);
      } else {
        clients_.PollAnswered(*client, now);
      }
    }
    if (d.task.ok()) NoteSentLocked(d.client_id, &*d.task);
    effects->deliveries.push_back(std::move(d));
  }
}

void RunController::SetDefaultLocked(Task task, absl::Time now,
                                     Effects* effects) {
  AbsorbLocked(board_.SetDefault(std::move(task)), now, effects);
}

absl::StatusOr<v1::JoinResponse> RunController::Join(
    const v1::JoinRequest& request) {
  if (request.display_name().size() > kMaxDisplayName) {
    return absl::InvalidArgumentError(
        absl::StrCat("display_name longer than ", kMaxDisplayName, " bytes"));
  }
  if (request.num_train_examples() < 0 || request.num_test_examples() < 0) {
    return absl::InvalidArgumentError("negative example count");
  }
  if (!options_.join_token.empty() &&
      !SecretEquals(request.join_token(), options_.join_token)) {
    return absl::UnauthenticatedError("wrong or missing join token");
  }
  v1::JoinResponse response;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckRunningLocked(""); !s.ok()) return s;
    const absl::Time now = absl::Now();
    absl::StatusOr<const Client*> client =
        clients_.Register(request.display_name(), now,
                          clients_.Retirable(request.previous_client_id(),
                                             request.previous_session_token()),
                          /*evaluates=*/!request.no_evaluation());
    if (!client.ok()) return client.status();
    response.set_client_id((*client)->id);
    response.set_session_token((*client)->token);
    Logf("round %d: %s joined (%s), %d clients", RoundLocked(), (*client)->id,
         request.display_name().empty() ? "unnamed" : request.display_name(),
         clients_.joined());
    if (clients_.Retire(request.previous_client_id(),
                        request.previous_session_token(), **client)) {
      // Its process is gone: whatever it was asked stays unanswered. It is
      // not waited for, sampled or counted from now on.
      const std::string& previous = request.previous_client_id();
      response.set_retired_client_id(previous);
      board_.Retract(previous);
      AbsorbLocked(board_.CloseClient(
                       previous, absl::NotFoundError(absl::StrCat(
                                     "client ", previous, " joined again as ",
                                     (*client)->id))),
                   now, &effects);
      // Restarted while it was asked to train or evaluate: it takes its own
      // place, so the attempt is not one client short.
      std::optional<Task> takeover =
          evaluation_.is_open() ? evaluation_.Replace(previous, (*client)->id)
                                : scheduler_->Replace(previous, (*client)->id);
      Logf("round %d: %s retired: it joined again as %s%s", RoundLocked(),
           previous, (*client)->id,
           takeover.has_value() ? ", which takes its place" : "");
      if (takeover.has_value()) {
        AbsorbLocked(board_.Post((*client)->id, *std::move(takeover)), now,
                     &effects);
      }
    }
    MaybeStartLocked(now, &effects);
  }
  effects.Run();
  response.set_run_id(run_id_);
  *response.mutable_model() = spec_proto_;
  *response.mutable_plan() = *plan_;
  response.set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::Status RunController::Authorize(absl::string_view client_id,
                                      absl::string_view token) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRunningLocked(client_id); !s.ok()) return s;
  return clients_.Authorize(client_id, token, absl::Now());
}

std::string RunController::CallerName(absl::string_view token,
                                      absl::string_view peer) const {
  absl::MutexLock lock(&mu_);
  const Client* client = clients_.FindByToken(token);
  return client != nullptr ? absl::StrCat("client ", client->id)
                           : absl::StrCat("unauthenticated caller ", peer);
}

uint64_t RunController::Poll(absl::string_view client_id,
                             absl::Duration max_wait, PollCallback done) {
  absl::StatusOr<Task> answer;
  bool answer_now = true;
  uint64_t id = 0;
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Client*> client = clients_.Get(client_id);
    if (absl::Status s = CheckRunningLocked(client_id); !s.ok()) {
      answer = s;
    } else if (!client.ok()) {
      answer = client.status();
    } else {
      if (max_wait <= absl::ZeroDuration() ||
          max_wait > options_.poll_timeout) {
        max_wait = options_.poll_timeout;
      }
      const absl::Time now = absl::Now();
      TaskBoard::PollResult result =
          board_.Poll((*client)->id, now + max_wait, std::move(done));
      id = result.poll_id;
      if (result.displaced.has_value()) {
        TaskBoard::Deliveries displaced;
        displaced.push_back(*std::move(result.displaced));
        AbsorbLocked(std::move(displaced), now, &effects);
      }
      if (!result.now.has_value()) {
        answer_now = false;
        clients_.PollStarted(*client);
        // A poll expires later than those held before it, as a rule: the
        // timer thread is woken only for one that expires before it would
        // wake anyway (every idle client renews a poll every max_wait).
        if (now + max_wait < timer_wakes_at_) timer_dirty_ = true;
        // A client that waits for work is ready: a run short of ready
        // clients may start now, this poll answered by the opening.
        if (phase_ == v1::PHASE_WAITING_FOR_CLIENTS) {
          MaybeStartLocked(now, &effects);
        }
      } else {
        NoteSentLocked(result.now->client_id, &*result.now->task);
        done = std::move(result.now->done);
        answer = std::move(result.now->task);
      }
    }
  }
  effects.Run();
  if (answer_now) done(std::move(answer));
  return id;
}

void RunController::CancelPoll(uint64_t poll_id) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    std::optional<TaskBoard::Delivery> d = board_.Cancel(poll_id);
    if (!d.has_value()) return;
    TaskBoard::Deliveries deliveries;
    deliveries.push_back(*std::move(d));
    AbsorbLocked(std::move(deliveries), absl::Now(), &effects);
  }
  effects.Run();
}

void RunController::MaybeStartLocked(absl::Time now, Effects* effects) {
  if (shutting_down_ || phase_ == v1::PHASE_DONE) return;
  if (phase_ == v1::PHASE_EVALUATING) {
    if (evaluation_.is_open()) return;
    // As a round does, an attempt waits for --min_clients ready clients: a
    // run resumed in this phase would otherwise evaluate on whichever client
    // joined again first, and report one partition's accuracy as the run's.
    const int num_ready = clients_.CountReady(now);
    if (num_ready < options_.min_clients) return;  // at least 1 (Validate)
    std::vector<std::string> ready = clients_.Ready(now);
    ready.erase(std::remove_if(ready.begin(), ready.end(),
                               [this](const std::string& id)
                                   ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                     return !clients_.Find(id)->evaluates;
                                   }),
                ready.end());
    if (ready.empty()) {
      // Nobody here can evaluate: waiting would not change that, and an
      // attempt would only wait out its deadline, again and again.
      FinishLocked(
          absl::StrCat("run done: ", version_, " rounds (", stop_reason_,
                       "), no final evaluation: none of the ", num_ready,
                       " ready clients evaluates (JoinRequest.no_evaluation)"),
          now, effects);
      return;
    }
    // Every ready client that evaluates the final weights, or a sample of
    // --eval_clients of them.
    if (options_.eval_clients > 0 &&
        static_cast<int>(ready.size()) > options_.eval_clients) {
      ready = clients_.Sample(std::move(ready), options_.eval_clients);
    }
    auto posts = evaluation_.Open(version_, std::move(ready), global_, now);
    history_.OpenAttempt();
    board_.RetractAll();
    for (auto& [client_id, task] : posts) {
      AbsorbLocked(board_.Post(client_id, std::move(task)), now, effects);
    }
    timer_dirty_ = true;
    const Cohort& c = *evaluation_.cohort();
    Logf(
        "round %d: evaluation attempt %d started with %d clients (quorum %d), "
        "deadline in %s",
        c.round(), c.number(), c.selected().size(), c.quorum(),
        absl::FormatDuration(c.deadline() - now));
    return;
  }
  if (scheduler_->is_open()) return;
  // Rounds sample the ready clients only: a client that joined again under a
  // new id, hung up its poll or missed its heartbeats is not asked, so a
  // round is not left waiting for the dead.
  // A count first: async mode reopens after every version and samples
  // nobody, so it never builds the list.
  const int num_ready = clients_.CountReady(now);
  const std::optional<int> wanted = scheduler_->WantClients(num_ready);
  if (!wanted.has_value()) {
    phase_ = v1::PHASE_WAITING_FOR_CLIENTS;
    return;
  }
  std::vector<std::string> sampled;
  if (*wanted > 0) sampled = clients_.Sample(clients_.Ready(now), *wanted);
  if (std::optional<std::string> refused =
          privacy_.Open(static_cast<int>(sampled.size()), num_ready)) {
    // A round that would take epsilon past the budget is never opened.
    Logf("round %d: %s", version_ + 1, *refused);
    StopTrainingLocked("privacy_budget", now, effects);
    MaybeStartLocked(now, effects);
    return;
  }
  if (strategy_.dp.enabled()) {
    strategy_.aggregator->BeginStep(static_cast<int>(sampled.size()));
  }
  Opening opening =
      scheduler_->Open(std::move(sampled), global_, plan_, version_, now);
  phase_ = v1::PHASE_TRAINING;
  history_.OpenAttempt();
  board_.RetractAll();
  for (auto& [client_id, task] : opening.posts) {
    AbsorbLocked(board_.Post(client_id, std::move(task)), now, effects);
  }
  SetDefaultLocked(std::move(opening.default_task), now, effects);
  timer_dirty_ = true;
  if (!opening.log.empty()) Logf("round %d: %s", version_ + 1, opening.log);
}

absl::StatusOr<Ticket> RunController::AdmitUpdate(
    const v1::UpdateHeader& header, std::function<void()> cancel) {
  const absl::Status checked = CheckUpdateHeader(header);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRunningLocked(header.client_id()); !s.ok())
    return s;
  if (phase_ != v1::PHASE_TRAINING || !scheduler_->is_open()) {
    history_.Reject(Rejection::kStaleRound);
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", header.client_id(), ": training is not running (phase ",
        v1::Phase_Name(phase_), ")"));
  }
  if (!checked.ok()) {
    history_.Reject(Rejection::kInvalid);
    return checked;
  }
  Rejection why = Rejection::kInvalid;
  absl::StatusOr<Ticket> ticket = scheduler_->Admit(
      header, std::make_shared<CancelHandle>(std::move(cancel)), version_,
      &why);
  if (!ticket.ok()) history_.Reject(why);
  return ticket;
}

absl::StatusOr<v1::PushGradientResponse> RunController::CommitUpdate(
    const Ticket& ticket, const v1::UpdateHeader& header,
    absl::Span<float> delta, int64_t bytes, double norm) {
  if (delta.size() != static_cast<size_t>(spec_.num_parameters)) {
    RecordRejection(Rejection::kInvalid);
    return absl::InvalidArgumentError(
        absl::StrCat("client ", ticket.client_id, ": expected ",
                     spec_.num_parameters, " floats, got ", delta.size()));
  }
  // Outside the lock, on the push's own buffer: the strategy's transforms.
  for (const auto& transform : strategy_.transforms) transform->Apply(delta);
  // A stored aggregator copies the update into its store here (memory, or a
  // spill file): dropped, unfolded, if the update is not accepted below.
  absl::StatusOr<Aggregator::Staged> staged =
      strategy_.aggregator->Stage(delta);
  if (!staged.ok()) {
    RecordRejection(Rejection::kTooLarge);
    return absl::Status(staged.status().code(),
                        absl::StrCat("client ", ticket.client_id, ": ",
                                     staged.status().message()));
  }

  Effects effects;
  v1::PushGradientResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckRunningLocked(ticket.client_id); !s.ok())
      return s;
    const absl::Time now = absl::Now();
    Rejection why = Rejection::kInvalid;
    absl::StatusOr<Acceptance> accepted =
        scheduler_->Accept(ticket, header, bytes, version_, now, &why);
    if (!accepted.ok()) {
      history_.Reject(why);
      return accepted.status();
    }
    const absl::Time fold_start = absl::Now();
    strategy_.aggregator->FoldStaged(accepted->weight, accepted->scale, delta,
                                     *std::move(staged));
    RunCounters& counters = history_.counters();
    counters.aggregation_latency.Observe(
        absl::ToDoubleSeconds(absl::Now() - fold_start));
    ++counters.updates_accepted;
    history_.AddBytesReceived(bytes);
    board_.Retract(ticket.client_id);
    if (accepted->wait_for_next_step) {
      // A WAIT posted for it holds its polls until the step closes (which
      // retracts every post and hands out the next version).
      AbsorbLocked(board_.Post(ticket.client_id, WaitTaskLocked()), now,
                   &effects);
    }
    if (absl::StatusOr<Client*> c = clients_.Get(ticket.client_id); c.ok()) {
      ++(*c)->rounds_contributed;
      (*c)->last_update_norm = norm;
      (*c)->last_update_round = accepted->round;
      clients_.Seen(*c, now);
    }
    response.set_round(accepted->round);
    response.set_accepted_this_round(accepted->accepted);
    Logf(
        "round %d: update from %s accepted (%d in this step, %d examples, "
        "scale %.3g, loss %.4f)",
        accepted->round, ticket.client_id, accepted->accepted,
        header.num_examples(), accepted->scale, header.train_loss());
    if (!accepted->outcome.empty()) {
      CloseStepLocked(accepted->outcome, now, &effects);
    }
  }
  effects.Run();
  return response;
}

void RunController::RecordRejection(Rejection reason) {
  absl::MutexLock lock(&mu_);
  history_.Reject(reason);
}

void RunController::CloseStepLocked(absl::string_view outcome, absl::Time now,
                                    Effects* effects) {
  // The aggregate first: a stored aggregator that cannot finish (a spill file
  // lost, too few updates for its rule) abandons the step, which is retried.
  absl::StatusOr<absl::Span<const double>> delta;
  std::string why_abandoned = "at its deadline";
  if (outcome != "abandoned") {
    delta = strategy_.aggregator->Finish();
    if (!delta.ok()) {
      why_abandoned = absl::StrCat("(", delta.status().ToString(), ")");
      outcome = "abandoned";
    }
  }
  Closing closing =
      scheduler_->Close(outcome, version_, clients_.CountAlive(now), now);
  v1::RoundRecord& record = closing.record;
  *record.mutable_rejected() = history_.attempt_rejections();
  for (auto& handle : closing.cancel) effects->cancels.push_back(handle);
  board_.RetractAll();
  RunCounters& counters = history_.counters();
  counters.round_duration.Observe(record.duration_seconds());
  bool stopped = false;
  if (outcome == "abandoned") {
    strategy_.aggregator->Reset();
    ++counters.rounds_abandoned;
    Logf("round %d: attempt %d abandoned %s with %d of %d updates",
         record.round(), record.attempt(), why_abandoned, record.responded(),
         record.selected());
  } else {
    // Step writes every parameter of `next`, so a reused buffer's old values
    // never show through.
    std::shared_ptr<std::vector<float>> next = std::move(retired_);
    if (next == nullptr || next.use_count() > 1) {
      next = std::make_shared<std::vector<float>>(global_->size());
    } else {
      // use_count is a relaxed load: order the last holder's reads (it let go
      // with an acq_rel decrement) before the writes below.
      std::atomic_thread_fence(std::memory_order_acquire);
    }
    strategy_.optimizer->Step(*delta, *global_, absl::MakeSpan(*next));
    strategy_.aggregator->Reset();
    retired_ = std::move(global_);
    global_ = std::move(next);
    ++version_;
    ++counters.rounds_completed;
    const std::string privacy =
        strategy_.dp.enabled()
            ? privacy_.Charge(strategy_.dp_aggregator->finished_clip_norm(),
                              strategy_.dp_aggregator->clip_norm(), &record)
            : "";
    const StopCondition::Verdict verdict =
        stop_.Observe(version_, closing.loss);
    if (verdict.improvement.has_value()) {
      record.set_relative_improvement(*verdict.improvement);
    }
    const v1::RoundMetrics& m = record.metrics();
    Logf(
        "round %d: closed (%s) with %d of %d updates in %.2fs: train loss %.4f "
        "accuracy %.4f%s%s",
        record.round(), outcome, record.responded(), record.selected(),
        record.duration_seconds(), m.train_loss(), m.train_accuracy(),
        m.has_validation()
            ? absl::StrFormat(", validation loss %.4f accuracy %.4f",
                              m.validation_loss(), m.validation_accuracy())
            : "",
        privacy);
    if (verdict.stop) {
      StopTrainingLocked(verdict.reason, now, effects);
      stopped = true;
    }
  }
  history_.Append(std::move(record));
  // The run as this close leaves it, before the next round draws from the
  // sampler; run last, since the next round's tasks should not wait for the
  // disk.
  if (closing.save || stopped) effects->save = SaveLocked();
  timer_dirty_ = true;
  MaybeStartLocked(now, effects);
}

void RunController::StopTrainingLocked(const std::string& reason,
                                       absl::Time now, Effects* effects) {
  stop_reason_ = reason;
  phase_ = v1::PHASE_EVALUATING;
  // Updates still uploading can no longer count: stop receiving them.
  for (auto& handle : scheduler_->Stop()) effects->cancels.push_back(handle);
  board_.RetractAll();
  SetDefaultLocked(WaitTaskLocked(), now, effects);
  Logf("round %d: training stopped (%s); evaluating", version_, reason);
}

void RunController::CloseEvaluationLocked(absl::string_view outcome,
                                          absl::Time now, Effects* effects) {
  EvaluationPhase::Closed closed = evaluation_.Close(outcome, now);
  for (auto& handle : closed.cancel) effects->cancels.push_back(handle);
  *closed.record.mutable_rejected() = history_.attempt_rejections();
  board_.RetractAll();
  if (!closed.result.has_value()) {
    ++history_.counters().evaluations_abandoned;
    Logf(
        "round %d: evaluation attempt %d abandoned at its deadline with %d of "
        "%d reports",
        closed.record.round(), closed.record.attempt(),
        closed.record.responded(), closed.record.selected());
  } else {
    const v1::EvaluationResult& result = *closed.result;
    final_evaluation_ = result;
    Logf(
        "round %d: evaluation closed (%s): test loss %.4f accuracy %.4f over "
        "%d examples",
        closed.record.round(), outcome, result.test_loss(),
        result.test_accuracy(), result.num_examples());
    history_.Append(std::move(closed.record));
    FinishLocked(
        absl::StrFormat("run done: %d rounds (%s), final test "
                        "accuracy %.2f%%",
                        version_, stop_reason_, 100 * result.test_accuracy()),
        now, effects);
    return;
  }
  history_.Append(std::move(closed.record));
  effects->save = SaveLocked();
  timer_dirty_ = true;
  MaybeStartLocked(now, effects);
}

void RunController::FinishLocked(const std::string& summary, absl::Time now,
                                 Effects* effects) {
  phase_ = v1::PHASE_DONE;
  Task done;
  done.type = v1::TASK_TYPE_DONE;
  done.round = version_;
  SetDefaultLocked(std::move(done), now, effects);
  Logf("%s, %.1f MB received, %.1f MB sent", summary,
       history_.bytes_received() / 1e6, history_.bytes_sent() / 1e6);
  effects->save = SaveLocked();
  timer_dirty_ = true;
}

absl::Status RunController::ReportEval(const v1::ReportEvalRequest& request) {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckRunningLocked(request.client_id()); !s.ok())
      return s;
    if (phase_ != v1::PHASE_EVALUATING || !evaluation_.is_open()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "client ", request.client_id(), ": no evaluation is open (phase ",
          v1::Phase_Name(phase_), ")"));
    }
    absl::StatusOr<absl::string_view> outcome = evaluation_.Report(request);
    if (!outcome.ok()) return outcome.status();
    ++history_.counters().evaluations_accepted;
    const absl::Time now = absl::Now();
    if (absl::StatusOr<Client*> c = clients_.Get(request.client_id()); c.ok()) {
      clients_.Seen(*c, now);
    }
    board_.Retract(request.client_id());
    const Cohort& c = *evaluation_.cohort();
    Logf(
        "round %d: evaluation from %s (%d/%d): loss %.4f accuracy %.4f on %d "
        "examples",
        c.round(), request.client_id(), c.answered(), c.selected().size(),
        request.test_loss(), request.test_accuracy(), request.num_examples());
    if (!outcome->empty()) CloseEvaluationLocked(*outcome, now, &effects);
  }
  effects.Run();
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> RunController::Heartbeat(
    const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRunningLocked(request.client_id()); !s.ok())
    return s;
  absl::StatusOr<Client*> client = clients_.Get(request.client_id());
  if (!client.ok()) return client.status();
  if (request.batches_done() < 0 || request.batches_total() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("client ", request.client_id(), ": negative progress"));
  }
  clients_.Seen(*client, absl::Now());
  (*client)->batches_done = request.batches_done();
  (*client)->batches_total = request.batches_total();
  v1::HeartbeatResponse response;
  response.set_phase(phase_);
  response.set_round(RoundLocked());
  return response;
}

Weights RunController::global_weights(int64_t* rounds) const {
  absl::MutexLock lock(&mu_);
  if (rounds != nullptr) *rounds = version_;
  return global_;
}

v1::Phase RunController::phase() const {
  absl::MutexLock lock(&mu_);
  return phase_;
}

bool RunController::AwaitPhase(v1::Phase phase, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  // The phase enum is ordered along the lifecycle, except that an abandoned
  // round may send TRAINING back to WAITING_FOR_CLIENTS; "reached" means now at
  // or past `phase`.
  auto reached = [this, phase]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return phase_ >= phase;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

bool RunController::AwaitClientsDone(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto all_told = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != v1::PHASE_DONE) return false;
    const absl::Time now = absl::Now();
    for (const auto& [index, client] : clients_.clients()) {
      if (!client->told_done && clients_.IsAlive(*client, now)) return false;
    }
    return true;
  };
  // Checked every 50 ms rather than as a Condition, which the mutex would
  // evaluate, scanning every client, at each unlock by any call.
  for (;;) {
    if (all_told()) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    auto never = [] { return false; };
    mu_.AwaitWithDeadline(absl::Condition(&never),
                          std::min(deadline, now + absl::Milliseconds(50)));
  }
}

bool RunController::AwaitPendingPolls(size_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return board_.held() >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

bool RunController::AwaitHistory(size_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return history_.total() >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

absl::Time RunController::NextTimerLocked(absl::Time now) const {
  // Gone clients are noticed within a second.
  absl::Time next = now + absl::Seconds(1);
  next = std::min(next, scheduler_->deadline());
  next = std::min(next, evaluation_.deadline());
  next = std::min(next, board_.NextExpiry());
  return next;
}

void RunController::RunTimersLocked(absl::Time now, Effects* effects) {
  AbsorbLocked(board_.Expire(now + kPollExpirySlack), now, effects);
  if (const std::vector<std::string> forgotten = clients_.Forget(now);
      !forgotten.empty()) {
    for (const std::string& id : forgotten) scheduler_->Forget(id);
    Logf("round %d: forgot %zu client%s gone for %s or longer", RoundLocked(),
         forgotten.size(), forgotten.size() == 1 ? "" : "s",
         absl::FormatDuration(options_.forget_after));
  }
  if (scheduler_->is_open() && now >= scheduler_->deadline()) {
    CloseStepLocked("abandoned", now, effects);
  }
  // Clients that died since the step's updates came in are noticed here.
  if (scheduler_->is_open()) {
    const int alive = clients_.CountAlive(now);
    // Called by Stranded, under mu_ (which the analysis cannot see).
    auto is_alive = [this, now](const std::string& id)
                        ABSL_NO_THREAD_SAFETY_ANALYSIS {
                          absl::StatusOr<Client*> c = clients_.Get(id);
                          return c.ok() && clients_.IsAlive(**c, now);
                        };
    const absl::string_view outcome =
        scheduler_->Stranded(strategy_.min_updates, alive, is_alive);
    if (!outcome.empty()) {
      Logf(
          "round %d: no other client alive to add an update (%d alive): "
          "made from the updates in",
          RoundLocked(), alive);
      CloseStepLocked(outcome, now, effects);
    }
  }
  if (evaluation_.is_open() && now >= evaluation_.deadline()) {
    CloseEvaluationLocked("abandoned", now, effects);
  }
  // Clients may have come back (or enough may be alive after a timeout).
  MaybeStartLocked(now, effects);
}

void RunController::TimerLoop() {
  for (;;) {
    Effects effects;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      const absl::Time next = NextTimerLocked(absl::Now());
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return timer_dirty_;
      };
      timer_wakes_at_ = next;
      mu_.AwaitWithDeadline(absl::Condition(&woken), next);
      timer_wakes_at_ = absl::InfinitePast();
      timer_dirty_ = false;
      if (shutting_down_) return;
      RunTimersLocked(absl::Now(), &effects);
    }
    effects.Run();
  }
}

}  // namespace fedlearn
