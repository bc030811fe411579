#include "server/round_manager.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/tensor_codec.h"

namespace fedlearn {

struct RoundManager::Client {
  std::string id;
  std::string token;
  std::string display_name;
  absl::Time last_seen;
  int active_polls = 0;
  int rounds_contributed = 0;
  int64_t batches_done = 0;
  int64_t batches_total = 0;
  bool told_done = false;
  double last_update_norm = 0;  // L2 norm of its latest accepted delta
  int64_t last_update_round = 0;
  // Async mode: the round of the TRAIN task it was last sent (0: none), and
  // of its last accepted update.
  int64_t task_round = 0;
  int64_t pushed_round = 0;
};

// One training round attempt or one evaluation attempt.
struct RoundManager::Attempt {
  bool evaluation = false;
  int64_t round = 0;
  int number = 0;
  absl::Time start;
  absl::Time deadline;
  bool run_validation = false;
  Weights weights;  // what the selected clients were sent
  std::vector<std::string> selected;
  absl::flat_hash_set<std::string> selected_set;
  absl::flat_hash_set<std::string> accepted;
  v1::RejectionCounts rejected;
  WeightedMean loss, accuracy, validation_loss, validation_accuracy;
  int64_t num_examples = 0;
  int64_t bytes_received = 0;
  int64_t bytes_sent = 0;
  std::vector<std::shared_ptr<CancelHandle>> in_flight;
};

namespace {

// Minimum time between two polls of a client that got WAIT.
constexpr absl::Duration kRetryAfter = absl::Milliseconds(200);
constexpr size_t kMaxDisplayName = 256;

std::string RandomHex(int bytes) {
  std::random_device device;  // getrandom(2) on Linux: unpredictable
  std::string out;
  out.reserve(bytes * 2);
  for (int i = 0; i < bytes; i += 4) {
    absl::StrAppendFormat(&out, "%08x", device());
  }
  return out.substr(0, bytes * 2);
}

// Compares secrets in time independent of where they first differ.
bool SecretEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool Finite(double v) { return std::isfinite(v); }

void Count(Rejection reason, v1::RejectionCounts* r) {
  switch (reason) {
    case Rejection::kStaleRound:
      r->set_stale_round(r->stale_round() + 1);
      break;
    case Rejection::kDuplicate:
      r->set_duplicate(r->duplicate() + 1);
      break;
    case Rejection::kNotSelected:
      r->set_not_selected(r->not_selected() + 1);
      break;
    case Rejection::kInvalid:
      r->set_invalid(r->invalid() + 1);
      break;
    case Rejection::kTooLarge:
      r->set_too_large(r->too_large() + 1);
      break;
    case Rejection::kIncomplete:
      r->set_incomplete(r->incomplete() + 1);
      break;
  }
}

double L2Norm(absl::Span<const float> v) {
  double sum = 0;
  for (float x : v) sum += double{x} * x;
  return std::sqrt(sum);
}

}  // namespace

RoundManager::RoundManager(CoordinatorOptions options, ModelSpec spec,
                           std::vector<float> initial,
                           std::unique_ptr<StateStore> store,
                           std::optional<SavedRun> resume)
    : options_(std::move(options)),
      spec_(std::move(spec)),
      spec_proto_(ToProto(spec_)),
      store_(std::move(store)),
      run_id_(RandomHex(8)),
      global_(std::make_shared<const std::vector<float>>(std::move(initial))),
      accumulator_(static_cast<size_t>(spec_.num_parameters)),
      sampler_(options_.seed) {
  if (resume.has_value()) {
    absl::MutexLock lock(&mu_);
    const v1::CoordinatorState& s = resume->state;
    run_id_ = s.run_id();
    global_ = std::move(resume->weights);
    model_round_ = s.model_round();
    round_ = s.round();
    phase_ = s.phase() == v1::PHASE_EVALUATING || s.phase() == v1::PHASE_DONE
                 ? s.phase()
                 : v1::PHASE_WAITING_FOR_CLIENTS;
    history_.assign(s.history().begin(), s.history().end());
    if (s.has_previous_train_loss())
      previous_train_loss_ = s.previous_train_loss();
    stop_reason_ = s.stop_reason();
    if (s.has_final_evaluation()) final_evaluation_ = s.final_evaluation();
    bytes_received_ = s.bytes_received();
    bytes_sent_ = s.bytes_sent();
    std::istringstream sampler(s.sampler());
    sampler >> sampler_;
    Logf(
        "run %s resumed from %s: %s at round %d (%d rounds folded, %d "
        "records)",
        run_id_, store_ != nullptr ? store_->dir() : "a saved run",
        v1::Phase_Name(phase_), round_, model_round_, history_.size());
  }
  timer_ = std::thread([this] { TimerLoop(); });
  Logf("run %s: model %s (%d parameters), waiting for %d clients", run_id_,
       spec_.name, spec_.num_parameters, options_.min_clients);
}

std::function<void()> RoundManager::SaveLocked() {
  if (store_ == nullptr) return nullptr;
  SavedRun run;
  v1::CoordinatorState& s = run.state;
  s.set_run_id(run_id_);
  s.set_phase(phase_);
  s.set_round(round_);
  s.set_model_round(model_round_);
  s.set_mode(std::string(ModeName(options_.mode)));
  for (const v1::RoundRecord& record : history_) *s.add_history() = record;
  if (previous_train_loss_.has_value()) {
    s.set_has_previous_train_loss(true);
    s.set_previous_train_loss(*previous_train_loss_);
  }
  s.set_stop_reason(stop_reason_);
  if (final_evaluation_.has_value())
    *s.mutable_final_evaluation() = *final_evaluation_;
  s.set_bytes_received(bytes_received_);
  s.set_bytes_sent(bytes_sent_);
  std::ostringstream sampler;
  sampler << sampler_;
  s.set_sampler(sampler.str());
  run.weights = global_;
  return [this, run = std::move(run)] {
    if (absl::Status saved = store_->Save(spec_, run); !saved.ok()) {
      Logf("round %d: the run could not be saved: %s", run.state.round(),
           saved.ToString());
    }
  };
}

RoundManager::~RoundManager() {
  Shutdown();
  timer_.join();
}

void RoundManager::Shutdown() {
  Callbacks callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    timer_dirty_ = true;
    for (auto& [id, waiter] : waiters_) {
      callbacks.push_back([done = std::move(waiter.done)] {
        done(absl::UnavailableError("coordinator is shutting down"));
      });
    }
    waiters_.clear();
    if (attempt_ != nullptr) {
      for (auto& handle : attempt_->in_flight) {
        callbacks.push_back([handle] { handle->Cancel(); });
      }
      attempt_->in_flight.clear();
    }
    for (auto& handle : async_in_flight_) {
      callbacks.push_back([handle] { handle->Cancel(); });
    }
    async_in_flight_.clear();
  }
  for (auto& callback : callbacks) callback();
}

absl::Status RoundManager::CheckRunningLocked() const {
  if (shutting_down_)
    return absl::UnavailableError("coordinator is shutting down");
  return absl::OkStatus();
}

absl::StatusOr<v1::JoinResponse> RoundManager::Join(
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
  Callbacks callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckRunningLocked(); !s.ok()) return s;
    if (static_cast<int>(clients_.size()) >= options_.max_clients) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "coordinator has its maximum of ", options_.max_clients, " clients"));
    }
    auto client = std::make_unique<Client>();
    client->id = absl::StrCat("client-", join_order_.size() + 1);
    client->token = RandomHex(16);
    client->display_name = request.display_name();
    client->last_seen = absl::Now();
    response.set_client_id(client->id);
    response.set_session_token(client->token);
    client_by_token_[client->token] = client->id;
    join_order_.push_back(client->id);
    Logf("round %d: %s joined (%s), %d clients", round_, client->id,
         client->display_name.empty() ? "unnamed" : client->display_name,
         clients_.size() + 1);
    clients_[client->id] = std::move(client);
    MaybeStartAttemptLocked(absl::Now(), &callbacks);
  }
  for (auto& callback : callbacks) callback();

  response.set_run_id(run_id_);
  *response.mutable_model() = spec_proto_;
  *response.mutable_plan() = options_.Plan();
  response.set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::Status RoundManager::Authorize(absl::string_view client_id,
                                     absl::string_view token) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRunningLocked(); !s.ok()) return s;
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "missing session token (authorization: Bearer ...)");
  }
  auto it = clients_.find(client_id);
  if (it == clients_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown client \"", client_id, "\"; join again"));
  }
  Client& client = *it->second;
  if (SecretEquals(token, client.token)) {
    client.last_seen = absl::Now();
    return absl::OkStatus();
  }
  if (client_by_token_.contains(token)) {
    return absl::PermissionDeniedError(
        absl::StrCat("session token does not belong to ", client_id));
  }
  return absl::UnauthenticatedError("invalid session token");
}

bool RoundManager::IsAliveLocked(const Client& client, absl::Time now) const {
  return client.active_polls > 0 ||
         now - client.last_seen < options_.client_timeout;
}

std::vector<std::string> RoundManager::AliveClientsLocked(
    absl::Time now) const {
  std::vector<std::string> alive;
  for (const std::string& id : join_order_) {
    if (IsAliveLocked(*clients_.at(id), now)) alive.push_back(id);
  }
  return alive;
}

Task RoundManager::TaskForLocked(const std::string& client_id) const {
  Task task;
  if (phase_ == v1::PHASE_DONE) {
    task.type = v1::TASK_TYPE_DONE;
    task.round = round_;
    return task;
  }
  if (options_.mode == Mode::kAsync && phase_ == v1::PHASE_TRAINING) {
    // Whoever asks trains the latest model; a client that asks again has given
    // up its previous task (an agent only polls after pushing, or restarted).
    task.type = v1::TASK_TYPE_TRAIN;
    task.round = model_round_ + 1;
    task.weights = global_;
    return task;
  }
  if (attempt_ != nullptr && attempt_->selected_set.contains(client_id) &&
      !attempt_->accepted.contains(client_id)) {
    task.type =
        attempt_->evaluation ? v1::TASK_TYPE_EVALUATE : v1::TASK_TYPE_TRAIN;
    task.round = attempt_->round;
    task.run_validation = attempt_->run_validation;
    task.deadline = attempt_->deadline;
    task.weights = attempt_->weights;
    return task;
  }
  task.type = v1::TASK_TYPE_WAIT;
  task.round = round_;
  task.retry_after = kRetryAfter;
  return task;
}

uint64_t RoundManager::Poll(absl::string_view client_id,
                            absl::Duration max_wait, PollCallback done) {
  absl::StatusOr<Task> result;
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_poll_id_++;
    auto it = clients_.find(client_id);
    if (absl::Status s = CheckRunningLocked(); !s.ok()) {
      result = s;
    } else if (it == clients_.end()) {
      result = absl::NotFoundError(
          absl::StrCat("unknown client \"", client_id, "\""));
    } else {
      Task task = TaskForLocked(it->second->id);
      if (task.type != v1::TASK_TYPE_WAIT) {
        NoteSentLocked(task, it->second.get());
        result = std::move(task);
      } else {
        if (max_wait <= absl::ZeroDuration() ||
            max_wait > options_.poll_timeout) {
          max_wait = options_.poll_timeout;
        }
        ++it->second->active_polls;
        waiters_[id] =
            Waiter{it->second->id, absl::Now() + max_wait, std::move(done)};
        timer_dirty_ = true;
        return id;
      }
    }
  }
  done(std::move(result));
  return id;
}

void RoundManager::CancelPoll(uint64_t poll_id) {
  PollCallback done;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(poll_id);
    if (it == waiters_.end()) return;
    done = std::move(it->second.done);
    auto client = clients_.find(it->second.client_id);
    if (client != clients_.end()) --client->second->active_polls;
    waiters_.erase(it);
  }
  done(absl::CancelledError("poll cancelled"));
}

void RoundManager::NoteSentLocked(const Task& task, Client* client) {
  if (task.type == v1::TASK_TYPE_DONE) client->told_done = true;
  if (options_.mode == Mode::kAsync && task.type == v1::TASK_TYPE_TRAIN) {
    client->task_round = task.round;
  }
  if (task.weights != nullptr) {
    const auto bytes =
        static_cast<int64_t>(task.weights->size() * sizeof(float));
    bytes_sent_ += bytes;
    if (attempt_ != nullptr) attempt_->bytes_sent += bytes;
  }
}

void RoundManager::DeliverTasksLocked(Callbacks* callbacks) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Task task = TaskForLocked(it->second.client_id);
    if (task.type == v1::TASK_TYPE_WAIT) {
      ++it;
      continue;
    }
    Client& client = *clients_.at(it->second.client_id);
    --client.active_polls;
    client.last_seen = absl::Now();
    NoteSentLocked(task, &client);
    callbacks->push_back([done = std::move(it->second.done),
                          task = std::move(task)] { done(std::move(task)); });
    waiters_.erase(it++);
  }
}

void RoundManager::MaybeStartAttemptLocked(absl::Time now,
                                           Callbacks* callbacks) {
  if (shutting_down_ || attempt_ != nullptr || phase_ == v1::PHASE_DONE) return;
  std::vector<std::string> alive = AliveClientsLocked(now);
  if (options_.mode == Mode::kAsync && phase_ != v1::PHASE_EVALUATING) {
    // Training starts once min_clients are alive and then runs on with
    // whoever is there.
    if (phase_ == v1::PHASE_WAITING_FOR_CLIENTS &&
        static_cast<int>(alive.size()) >= options_.min_clients) {
      phase_ = v1::PHASE_TRAINING;
      last_applied_ = now;
      Logf("async training started with %d clients at round %d", alive.size(),
           model_round_ + 1);
      DeliverTasksLocked(callbacks);
    }
    return;
  }
  if (phase_ == v1::PHASE_EVALUATING) {
    if (alive.empty()) return;
    StartAttemptLocked(/*evaluation=*/true, std::move(alive), now);
  } else {
    if (static_cast<int>(alive.size()) < options_.min_clients) {
      phase_ = v1::PHASE_WAITING_FOR_CLIENTS;
      return;
    }
    StartAttemptLocked(/*evaluation=*/false, std::move(alive), now);
  }
  DeliverTasksLocked(callbacks);
}

void RoundManager::StartAttemptLocked(bool evaluation,
                                      std::vector<std::string> candidates,
                                      absl::Time now) {
  auto attempt = std::make_unique<Attempt>();
  attempt->evaluation = evaluation;
  attempt->round = round_;
  attempt->number = ++attempt_number_;
  attempt->start = now;
  attempt->deadline =
      now + (evaluation ? options_.eval_timeout : options_.round_timeout);
  attempt->weights = global_;
  if (evaluation) {
    // Every ready client evaluates the final weights.
    attempt->selected = std::move(candidates);
  } else {
    phase_ = v1::PHASE_TRAINING;
    const int available = static_cast<int>(candidates.size());
    int wanted = options_.clients_per_round > 0
                     ? options_.clients_per_round
                     : std::max(options_.min_clients,
                                static_cast<int>(std::ceil(
                                    options_.fraction * available - 1e-9)));
    wanted = std::min(wanted, available);
    const int sampled = std::min(
        available,
        static_cast<int>(std::ceil(wanted * options_.over_selection - 1e-9)));
    // Partial Fisher-Yates over the clients ordered by display name (then id):
    // for a seed, the same named clients give the same samples whatever order
    // they joined in (agents of one process join in no fixed order).
    std::sort(candidates.begin(), candidates.end(),
              [this](const std::string& a, const std::string& b)
                  ABSL_NO_THREAD_SAFETY_ANALYSIS {
                    const Client& x = *clients_.at(a);
                    const Client& y = *clients_.at(b);
                    return std::tie(x.display_name, x.id) <
                           std::tie(y.display_name, y.id);
                  });
    for (int i = 0; i < sampled; ++i) {
      std::uniform_int_distribution<int> pick(i, available - 1);
      std::swap(candidates[i], candidates[pick(sampler_)]);
    }
    candidates.resize(sampled);
    attempt->selected = std::move(candidates);
    attempt->run_validation = options_.rounds_between_validations > 0 &&
                              round_ % options_.rounds_between_validations == 0;
    accumulator_.Reset();
  }
  attempt->selected_set.insert(attempt->selected.begin(),
                               attempt->selected.end());
  attempt_ = std::move(attempt);
  timer_dirty_ = true;
  Logf(
      "round %d: %s attempt %d started with %d clients (quorum %d), deadline "
      "in %s",
      round_, evaluation ? "evaluation" : "training", attempt_number_,
      attempt_->selected.size(), QuorumLocked(),
      absl::FormatDuration(attempt_->deadline - now));
}

int RoundManager::QuorumLocked() const {
  // "Tolerates `tolerance` of the selected not answering": with 10 selected and
  // 0.3, 7 updates close the round. The epsilon keeps 0.7 * 10 from becoming 8.
  const int selected = static_cast<int>(attempt_->selected.size());
  const int quorum =
      static_cast<int>(std::ceil((1.0 - options_.tolerance) * selected - 1e-9));
  return std::clamp(quorum, 1, std::max(selected, 1));
}

void RoundManager::CloseIfAnsweredLocked(Callbacks* callbacks) {
  const int accepted = static_cast<int>(attempt_->accepted.size());
  if (accepted == static_cast<int>(attempt_->selected.size())) {
    CloseAttemptLocked("all", absl::Now(), callbacks);
  } else if (accepted >= QuorumLocked()) {
    CloseAttemptLocked("quorum", absl::Now(), callbacks);
  }
}

void RoundManager::CountRejectionLocked(Rejection reason) {
  Count(reason, &counters_.updates_rejected);
  if (attempt_ != nullptr) Count(reason, &attempt_->rejected);
}

void RoundManager::RecordRejection(Rejection reason) {
  absl::MutexLock lock(&mu_);
  CountRejectionLocked(reason);
}

absl::Status RoundManager::CheckAsyncUpdateLocked(
    const v1::UpdateHeader& header) {
  if (phase_ != v1::PHASE_TRAINING) {
    CountRejectionLocked(Rejection::kStaleRound);
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", header.client_id(), ": training is not running (phase ",
        v1::Phase_Name(phase_), ")"));
  }
  auto it = clients_.find(header.client_id());
  if (it == clients_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown client \"", header.client_id(), "\""));
  }
  const Client& client = *it->second;
  if (client.pushed_round != 0 && header.round() == client.pushed_round) {
    CountRejectionLocked(Rejection::kDuplicate);
    return absl::AlreadyExistsError(
        absl::StrCat("client ", header.client_id(), ": update for round ",
                     header.round(), " already applied"));
  }
  if (client.task_round == 0 || header.round() != client.task_round) {
    CountRejectionLocked(Rejection::kStaleRound);
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", header.client_id(), ": update for round ", header.round(),
        ", its task is for round ", client.task_round));
  }
  const int64_t staleness = model_round_ + 1 - header.round();
  if (options_.max_staleness > 0 && staleness > options_.max_staleness) {
    CountRejectionLocked(Rejection::kStaleRound);
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", header.client_id(), ": update trained for round ",
        header.round(), " is ", staleness,
        " updates stale (--max_staleness=", options_.max_staleness, ")"));
  }
  return absl::OkStatus();
}

absl::Status RoundManager::CheckUpdateLocked(const v1::UpdateHeader& header) {
  if (absl::Status s = CheckRunningLocked(); !s.ok()) return s;
  if (options_.mode == Mode::kAsync) {
    if (absl::Status s = CheckAsyncUpdateLocked(header); !s.ok()) return s;
    return CheckUpdateMetricsLocked(header);
  }
  if (phase_ != v1::PHASE_TRAINING || attempt_ == nullptr ||
      attempt_->evaluation) {
    CountRejectionLocked(Rejection::kStaleRound);
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", header.client_id(), ": no training round is open (phase ",
        v1::Phase_Name(phase_), ")"));
  }
  if (header.round() != attempt_->round) {
    CountRejectionLocked(Rejection::kStaleRound);
    return absl::FailedPreconditionError(
        absl::StrCat("client ", header.client_id(), ": update for round ",
                     header.round(), ", current round is ", attempt_->round));
  }
  if (!attempt_->selected_set.contains(header.client_id())) {
    CountRejectionLocked(Rejection::kNotSelected);
    return absl::FailedPreconditionError(
        absl::StrCat("client ", header.client_id(), ": not selected for round ",
                     attempt_->round));
  }
  if (attempt_->accepted.contains(header.client_id())) {
    CountRejectionLocked(Rejection::kDuplicate);
    return absl::AlreadyExistsError(
        absl::StrCat("client ", header.client_id(), ": update for round ",
                     attempt_->round, " already accepted"));
  }
  return CheckUpdateMetricsLocked(header);
}

absl::Status RoundManager::CheckUpdateMetricsLocked(
    const v1::UpdateHeader& header) {
  // The metrics feed the history, /metrics and the convergence test: as for
  // an evaluation report, losses must be finite and accuracies fractions.
  auto fraction = [](double x) { return x >= 0 && x <= 1; };
  const bool metrics_ok = Finite(header.train_loss()) &&
                          Finite(header.validation_loss()) &&
                          fraction(header.train_accuracy()) &&
                          fraction(header.validation_accuracy());
  if (header.num_examples() <= 0 || header.num_validation_examples() < 0 ||
      !metrics_ok ||
      (header.encoding() != v1::ENCODING_DENSE &&
       header.encoding() != v1::ENCODING_UNSPECIFIED &&
       header.encoding() != v1::ENCODING_QUANTIZED)) {
    CountRejectionLocked(Rejection::kInvalid);
    return absl::InvalidArgumentError(absl::StrCat(
        "client ", header.client_id(),
        ": header needs num_examples > 0, finite losses, accuracies in [0, 1] "
        "and a dense or quantized encoding"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<CancelHandle>> RoundManager::AdmitUpdate(
    const v1::UpdateHeader& header, std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckUpdateLocked(header); !s.ok()) return s;
  auto handle = std::make_shared<CancelHandle>(std::move(cancel));
  if (options_.mode == Mode::kAsync) {
    // Pushes that ended (their stream dropped the handle) leave the list.
    async_in_flight_.erase(
        std::remove_if(async_in_flight_.begin(), async_in_flight_.end(),
                       [](const std::shared_ptr<CancelHandle>& h) {
                         return h.use_count() == 1;
                       }),
        async_in_flight_.end());
    async_in_flight_.push_back(handle);
  } else {
    attempt_->in_flight.push_back(handle);
  }
  return handle;
}

absl::StatusOr<v1::PushGradientResponse> RoundManager::CommitUpdate(
    const v1::UpdateHeader& header, absl::Span<const float> delta,
    int64_t bytes) {
  Callbacks callbacks;
  v1::PushGradientResponse response;
  const double norm = L2Norm(delta);  // before the lock: the dashboard's
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckUpdateLocked(header); !s.ok()) return s;
    if (delta.size() != static_cast<size_t>(spec_.num_parameters)) {
      CountRejectionLocked(Rejection::kInvalid);
      return absl::InvalidArgumentError(
          absl::StrCat("client ", header.client_id(), ": expected ",
                       spec_.num_parameters, " floats, got ", delta.size()));
    }
    if (options_.mode == Mode::kAsync) {
      ApplyAsyncUpdateLocked(header, delta, bytes, norm, &response, &callbacks);
    } else {
      FoldUpdateLocked(header, delta, bytes, norm, &response, &callbacks);
    }
  }
  for (auto& callback : callbacks) callback();
  return response;
}

void RoundManager::FoldUpdateLocked(const v1::UpdateHeader& header,
                                    absl::Span<const float> delta,
                                    int64_t bytes, double norm,
                                    v1::PushGradientResponse* response,
                                    Callbacks* callbacks) {
  Attempt& a = *attempt_;
  const double weight = static_cast<double>(header.num_examples());
  const absl::Time fold_start = absl::Now();
  accumulator_.Fold(weight, delta);
  counters_.aggregation_latency.Observe(
      absl::ToDoubleSeconds(absl::Now() - fold_start));
  ++counters_.updates_accepted;
  a.accepted.insert(header.client_id());
  a.loss.Add(header.train_loss(), weight);
  a.accuracy.Add(header.train_accuracy(), weight);
  if (header.num_validation_examples() > 0) {
    const double vw = static_cast<double>(header.num_validation_examples());
    a.validation_loss.Add(header.validation_loss(), vw);
    a.validation_accuracy.Add(header.validation_accuracy(), vw);
  }
  a.num_examples += header.num_examples();
  a.bytes_received += bytes;
  bytes_received_ += bytes;
  Client& client = *clients_.at(header.client_id());
  ++client.rounds_contributed;
  client.last_update_norm = norm;
  client.last_update_round = a.round;
  client.last_seen = absl::Now();
  response->set_round(a.round);
  response->set_accepted_this_round(static_cast<int>(a.accepted.size()));
  Logf("round %d: update from %s accepted (%d/%d, %d examples, loss %.4f)",
       a.round, header.client_id(), a.accepted.size(), a.selected.size(),
       header.num_examples(), header.train_loss());
  CloseIfAnsweredLocked(callbacks);
}

void RoundManager::ApplyAsyncUpdateLocked(const v1::UpdateHeader& header,
                                          absl::Span<const float> delta,
                                          int64_t bytes, double norm,
                                          v1::PushGradientResponse* response,
                                          Callbacks* callbacks) {
  const absl::Time now = absl::Now();
  const int64_t staleness = model_round_ + 1 - header.round();
  const double scale =
      options_.AsyncMixing() * std::pow(1.0 + static_cast<double>(staleness),
                                        -options_.staleness_exponent);
  const float step = static_cast<float>(scale);
  auto next = std::make_shared<std::vector<float>>(*global_);
  for (size_t i = 0; i < next->size(); ++i) (*next)[i] += step * delta[i];
  global_ = std::move(next);
  ++model_round_;
  counters_.aggregation_latency.Observe(
      absl::ToDoubleSeconds(absl::Now() - now));
  ++counters_.updates_accepted;
  ++counters_.rounds_completed;

  v1::RoundRecord record;
  record.set_round(model_round_);
  record.set_attempt(1);
  record.set_selected(1);
  record.set_responded(1);
  record.add_selected_clients(header.client_id());
  record.set_outcome("async");
  record.set_duration_seconds(absl::ToDoubleSeconds(now - last_applied_));
  record.set_bytes_received(bytes);
  record.set_bytes_sent(static_cast<int64_t>(global_->size() * sizeof(float)));
  record.set_staleness(staleness);
  record.set_update_scale(scale);
  v1::RoundMetrics* metrics = record.mutable_metrics();
  metrics->set_num_examples(header.num_examples());
  metrics->set_train_loss(header.train_loss());
  metrics->set_train_accuracy(header.train_accuracy());
  if (header.num_validation_examples() > 0) {
    metrics->set_has_validation(true);
    metrics->set_validation_loss(header.validation_loss());
    metrics->set_validation_accuracy(header.validation_accuracy());
  }
  counters_.round_duration.Observe(record.duration_seconds());
  last_applied_ = now;
  bytes_received_ += bytes;

  Client& client = *clients_.at(header.client_id());
  ++client.rounds_contributed;
  client.last_update_norm = norm;
  client.last_update_round = model_round_;
  client.last_seen = now;
  client.pushed_round = header.round();
  client.task_round = 0;
  response->set_round(model_round_);
  response->set_accepted_this_round(1);

  // Convergence on windows of as many updates as there are clients (at least
  // min_clients): a single update's loss is one client's data, and a window
  // of fewer than the clients would compare different clients' data.
  window_loss_.Add(header.train_loss(),
                   static_cast<double>(header.num_examples()));
  bool converged = false;
  const int window = std::max<int>(
      options_.min_clients, static_cast<int>(AliveClientsLocked(now).size()));
  const bool window_closed = ++window_updates_ >= window;
  if (window_closed) {
    converged = ConvergedLocked(window_loss_.value(), &record);
    window_loss_ = WeightedMean();
    window_updates_ = 0;
  }
  Logf(
      "round %d: update from %s applied (staleness %d, scale %.3f, %d "
      "examples, loss %.4f)",
      model_round_, header.client_id(), staleness, scale, header.num_examples(),
      header.train_loss());
  const bool stop = converged || model_round_ >= options_.max_rounds;
  if (stop) {
    StopTrainingLocked(converged, callbacks);
  } else {
    round_ = model_round_ + 1;
  }
  history_.push_back(std::move(record));
  // Saved once a window (a model per update would be a disk write per push)
  // and when training stops.
  std::function<void()> save = window_closed || stop ? SaveLocked() : nullptr;
  timer_dirty_ = true;
  MaybeStartAttemptLocked(now, callbacks);
  DeliverTasksLocked(callbacks);
  if (save) callbacks->push_back(std::move(save));
}

absl::Status RoundManager::ReportEval(const v1::ReportEvalRequest& request) {
  Callbacks callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckRunningLocked(); !s.ok()) return s;
    if (phase_ != v1::PHASE_EVALUATING || attempt_ == nullptr ||
        !attempt_->evaluation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "client ", request.client_id(), ": no evaluation is open (phase ",
          v1::Phase_Name(phase_), ")"));
    }
    Attempt& a = *attempt_;
    if (request.round() != a.round) {
      return absl::FailedPreconditionError(absl::StrCat(
          "client ", request.client_id(), ": report for round ",
          request.round(), ", the final weights are round ", a.round, "'s"));
    }
    if (!a.selected_set.contains(request.client_id())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "client ", request.client_id(), ": not asked to evaluate"));
    }
    if (a.accepted.contains(request.client_id())) {
      return absl::AlreadyExistsError(absl::StrCat(
          "client ", request.client_id(), ": evaluation already reported"));
    }
    if (request.num_examples() <= 0 || !Finite(request.test_loss()) ||
        !(request.test_accuracy() >= 0 && request.test_accuracy() <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", request.client_id(),
                       ": report needs num_examples > 0, a finite loss and "
                       "accuracy in [0, 1]"));
    }
    const double weight = static_cast<double>(request.num_examples());
    a.accepted.insert(request.client_id());
    a.loss.Add(request.test_loss(), weight);
    a.accuracy.Add(request.test_accuracy(), weight);
    a.num_examples += request.num_examples();
    ++counters_.evaluations_accepted;
    clients_.at(request.client_id())->last_seen = absl::Now();
    Logf(
        "round %d: evaluation from %s (%d/%d): loss %.4f accuracy %.4f on %d "
        "examples",
        a.round, request.client_id(), a.accepted.size(), a.selected.size(),
        request.test_loss(), request.test_accuracy(), request.num_examples());
    CloseIfAnsweredLocked(&callbacks);
  }
  for (auto& callback : callbacks) callback();
  return absl::OkStatus();
}

v1::RoundRecord RoundManager::RecordLocked(const Attempt& a,
                                           absl::string_view outcome,
                                           absl::Time now) const {
  v1::RoundRecord record;
  record.set_round(a.round);
  record.set_attempt(a.number);
  record.set_evaluation(a.evaluation);
  record.set_selected(static_cast<int>(a.selected.size()));
  for (const std::string& id : a.selected) record.add_selected_clients(id);
  record.set_responded(static_cast<int>(a.accepted.size()));
  if (outcome == "open") {
    // Not closed yet: dropped are the selected that are gone without answering.
    int gone = 0;
    for (const std::string& id : a.selected) {
      if (!a.accepted.contains(id) && !IsAliveLocked(*clients_.at(id), now)) {
        ++gone;
      }
    }
    record.set_dropped(gone);
  } else {
    record.set_dropped(static_cast<int>(a.selected.size() - a.accepted.size()));
  }
  *record.mutable_rejected() = a.rejected;
  record.set_outcome(std::string(outcome));
  record.set_duration_seconds(absl::ToDoubleSeconds(now - a.start));
  record.set_bytes_received(a.bytes_received);
  record.set_bytes_sent(a.bytes_sent);
  v1::RoundMetrics* metrics = record.mutable_metrics();
  metrics->set_num_examples(a.num_examples);
  metrics->set_train_loss(a.loss.value());
  metrics->set_train_accuracy(a.accuracy.value());
  if (!a.evaluation && a.validation_loss.weight() > 0) {
    metrics->set_has_validation(true);
    metrics->set_validation_loss(a.validation_loss.value());
    metrics->set_validation_accuracy(a.validation_accuracy.value());
  }
  return record;
}

bool RoundManager::ConvergedLocked(double loss, v1::RoundRecord* record) {
  bool converged = false;
  if (previous_train_loss_.has_value() && *previous_train_loss_ > 0) {
    const double improvement =
        (*previous_train_loss_ - loss) / *previous_train_loss_;
    record->set_relative_improvement(improvement);
    converged = improvement < options_.convergence_threshold;
  }
  previous_train_loss_ = loss;
  return converged;
}

void RoundManager::StopTrainingLocked(bool converged, Callbacks* callbacks) {
  stop_reason_ = converged ? "converged" : "max_rounds";
  phase_ = v1::PHASE_EVALUATING;
  round_ = model_round_;  // the evaluation is of the last trained round
  attempt_number_ = 0;
  // Async updates still uploading can no longer count: stop receiving them.
  for (auto& handle : async_in_flight_) {
    callbacks->push_back([handle] { handle->Cancel(); });
  }
  async_in_flight_.clear();
  Logf("round %d: training stopped (%s); evaluating", model_round_,
       stop_reason_);
}

void RoundManager::CloseAttemptLocked(absl::string_view outcome, absl::Time now,
                                      Callbacks* callbacks) {
  const int quorum = QuorumLocked();
  std::unique_ptr<Attempt> a = std::move(attempt_);
  for (auto& handle : a->in_flight)
    callbacks->push_back([handle] { handle->Cancel(); });

  v1::RoundRecord record = RecordLocked(*a, outcome, now);
  v1::RoundMetrics* metrics = record.mutable_metrics();
  const bool abandoned = outcome == "abandoned";

  if (a->evaluation) {
    if (abandoned) {
      ++counters_.evaluations_abandoned;
      Logf(
          "round %d: evaluation attempt %d abandoned at its deadline with %d "
          "of %d reports",
          a->round, a->number, a->accepted.size(), a->selected.size());
    } else {
      v1::EvaluationResult result;
      result.set_test_loss(a->loss.value());
      result.set_test_accuracy(a->accuracy.value());
      result.set_num_examples(a->num_examples);
      result.set_num_clients(static_cast<int>(a->accepted.size()));
      final_evaluation_ = result;
      phase_ = v1::PHASE_DONE;
      Logf(
          "round %d: evaluation closed (%s): test loss %.4f accuracy %.4f over "
          "%d examples",
          a->round, outcome, result.test_loss(), result.test_accuracy(),
          result.num_examples());
      Logf(
          "run done: %d rounds (%s), final test accuracy %.2f%%, %.1f MB "
          "received, "
          "%.1f MB sent",
          a->round, stop_reason_, 100 * result.test_accuracy(),
          bytes_received_ / 1e6, bytes_sent_ / 1e6);
    }
  } else if (abandoned) {
    ++counters_.rounds_abandoned;
    counters_.round_duration.Observe(record.duration_seconds());
    Logf(
        "round %d: attempt %d abandoned at its deadline with %d of %d updates "
        "(quorum %d)",
        a->round, a->number, a->accepted.size(), a->selected.size(), quorum);
  } else {
    ++counters_.rounds_completed;
    counters_.round_duration.Observe(record.duration_seconds());
    auto next = std::make_shared<std::vector<float>>(global_->size());
    accumulator_.ApplyMean(*global_, absl::MakeSpan(*next));
    global_ = std::move(next);
    model_round_ = a->round;
    const double loss = a->loss.value();
    const bool converged = ConvergedLocked(loss, &record);
    Logf(
        "round %d: closed (%s) with %d of %d updates in %.2fs: train loss %.4f "
        "accuracy "
        "%.4f%s",
        a->round, outcome, a->accepted.size(), a->selected.size(),
        record.duration_seconds(), loss, a->accuracy.value(),
        metrics->has_validation()
            ? absl::StrFormat(", validation loss %.4f accuracy %.4f",
                              metrics->validation_loss(),
                              metrics->validation_accuracy())
            : "");
    if (converged || a->round >= options_.max_rounds) {
      StopTrainingLocked(converged, callbacks);
    } else {
      ++round_;
      attempt_number_ = 0;
    }
  }
  history_.push_back(std::move(record));
  // The run as this close leaves it, before the next round draws from the
  // sampler; written last, since callbacks run in order and the next round's
  // tasks should not wait for the disk.
  std::function<void()> save = SaveLocked();
  timer_dirty_ = true;
  MaybeStartAttemptLocked(now, callbacks);
  DeliverTasksLocked(callbacks);
  if (save) callbacks->push_back(std::move(save));
}

absl::StatusOr<v1::HeartbeatResponse> RoundManager::Heartbeat(
    const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRunningLocked(); !s.ok()) return s;
  auto it = clients_.find(request.client_id());
  if (it == clients_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown client \"", request.client_id(), "\""));
  }
  if (request.batches_done() < 0 || request.batches_total() < 0) {
    return absl::InvalidArgumentError("negative progress");
  }
  it->second->last_seen = absl::Now();
  it->second->batches_done = request.batches_done();
  it->second->batches_total = request.batches_total();
  v1::HeartbeatResponse response;
  response.set_phase(phase_);
  response.set_round(round_);
  return response;
}

v1::GetStatusResponse RoundManager::GetStatus(RunCounters* counters) const {
  v1::GetStatusResponse status;
  status.set_run_id(run_id_);
  *status.mutable_model() = spec_proto_;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();  // after the lock: no client seen later
  status.set_phase(phase_);
  status.set_round(round_);
  status.set_stop_reason(stop_reason_);
  for (const v1::RoundRecord& record : history_) *status.add_history() = record;
  if (attempt_ != nullptr) {
    *status.mutable_current_round() = RecordLocked(*attempt_, "open", now);
  }
  if (final_evaluation_.has_value()) {
    *status.mutable_final_evaluation() = *final_evaluation_;
  }
  status.set_bytes_received(bytes_received_);
  status.set_bytes_sent(bytes_sent_);
  if (counters != nullptr) *counters = counters_;
  for (const std::string& id : join_order_) {
    const Client& c = *clients_.at(id);
    v1::ClientInfo* info = status.add_clients();
    info->set_client_id(c.id);
    info->set_display_name(c.display_name);
    std::string state = "ready";
    if (!IsAliveLocked(c, now)) {
      state = "gone";
    } else if (attempt_ != nullptr && attempt_->selected_set.contains(id) &&
               !attempt_->accepted.contains(id)) {
      state = attempt_->evaluation ? "evaluating" : "training";
    } else if (options_.mode == Mode::kAsync && phase_ == v1::PHASE_TRAINING &&
               c.task_round != 0) {
      state = "training";
    }
    info->set_state(state);
    info->set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - c.last_seen));
    info->set_rounds_contributed(c.rounds_contributed);
    info->set_batches_done(c.batches_done);
    info->set_batches_total(c.batches_total);
    info->set_polling(c.active_polls > 0);
    info->set_last_update_norm(c.last_update_norm);
    info->set_last_update_round(c.last_update_round);
  }
  return status;
}

Weights RoundManager::global_weights(int64_t* rounds) const {
  absl::MutexLock lock(&mu_);
  if (rounds != nullptr) *rounds = model_round_;
  return global_;
}

v1::Phase RoundManager::phase() const {
  absl::MutexLock lock(&mu_);
  return phase_;
}

bool RoundManager::AwaitPhase(v1::Phase phase, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  // The phase enum is ordered along the lifecycle, except that an abandoned
  // round may send TRAINING back to WAITING_FOR_CLIENTS; "reached" means now at
  // or past `phase`.
  auto reached = [this, phase]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return phase_ >= phase;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

bool RoundManager::AwaitClientsDone(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto all_told = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ != v1::PHASE_DONE) return false;
    const absl::Time now = absl::Now();
    for (const auto& [id, client] : clients_) {
      if (!client->told_done && IsAliveLocked(*client, now)) return false;
    }
    return true;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&all_told), timeout);
}

bool RoundManager::AwaitPendingPolls(size_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return waiters_.size() >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

bool RoundManager::AwaitHistory(size_t n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return history_.size() >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

absl::Time RoundManager::NextTimerLocked() const {
  absl::Time next =
      absl::Now() + absl::Seconds(1);  // gone clients are noticed within 1s
  if (attempt_ != nullptr) next = std::min(next, attempt_->deadline);
  for (const auto& [id, waiter] : waiters_)
    next = std::min(next, waiter.expiry);
  return next;
}

void RoundManager::RunTimersLocked(absl::Time now, Callbacks* callbacks) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.expiry > now) {
      ++it;
      continue;
    }
    Client& client = *clients_.at(it->second.client_id);
    --client.active_polls;
    client.last_seen = now;  // it was waiting on us all along
    Task wait = TaskForLocked(client.id);
    callbacks->push_back([done = std::move(it->second.done),
                          wait = std::move(wait)] { done(std::move(wait)); });
    waiters_.erase(it++);
  }
  if (attempt_ != nullptr && now >= attempt_->deadline) {
    CloseAttemptLocked("abandoned", now, callbacks);
  }
  // Clients may have come back (or enough may be alive after a timeout).
  MaybeStartAttemptLocked(now, callbacks);
}

void RoundManager::TimerLoop() {
  for (;;) {
    Callbacks callbacks;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      const absl::Time next = NextTimerLocked();
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return timer_dirty_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&woken), next);
      timer_dirty_ = false;
      if (shutting_down_) return;
      RunTimersLocked(absl::Now(), &callbacks);
    }
    for (auto& callback : callbacks) callback();
  }
}

}  // namespace fedlearn
