#include "server/async_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fedlearn {
namespace {

// The outcome of every version's step in the history.
constexpr absl::string_view kOutcome = "async";

}  // namespace

std::optional<int> AsyncScheduler::WantClients(int alive) const {
  if (!started_ && alive < options_.min_clients) return std::nullopt;
  return 0;  // nobody in particular: every poll gets the latest model
}

Opening AsyncScheduler::Open(
    std::vector<std::string> /*sampled*/, const Weights& weights,
    const std::shared_ptr<const v1::TrainingPlan>& plan, int64_t version,
    absl::Time now) {
  Opening opening;
  if (!started_) {
    step_start_ = now;
    saved_at_ = now;
    opening.log = absl::StrCat("async training started, a new model every ",
                               options_.buffer, " update(s)");
  }
  started_ = true;
  open_ = true;
  // Whoever asks trains the latest model; a client that asks again has given
  // up its previous task (an agent only polls after pushing, or restarted).
  opening.default_task.type = v1::TASK_TYPE_TRAIN;
  opening.default_task.round = version + 1;
  opening.default_task.weights = weights;
  opening.default_task.plan = plan;
  return opening;
}

double AsyncScheduler::Scale(int64_t staleness) const {
  return options_.mixing * std::pow(1.0 + static_cast<double>(staleness),
                                    -options_.staleness_exponent);
}

absl::Status AsyncScheduler::CheckStaleness(const std::string& client_id,
                                            int64_t round,
                                            int64_t version) const {
  const int64_t staleness = Staleness(round, version);
  if (options_.max_staleness > 0 && staleness > options_.max_staleness) {
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", client_id, ": update trained for round ", round, " is ",
        staleness, " updates stale (--max_staleness=", options_.max_staleness,
        ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Ticket> AsyncScheduler::Admit(
    const v1::UpdateHeader& header, std::shared_ptr<CancelHandle> cancel,
    int64_t version, Rejection* why) {
  const std::string& id = header.client_id();
  const ClientRounds rounds =
      clients_.contains(id) ? clients_.at(id) : ClientRounds{};
  if (rounds.pushed != 0 && header.round() == rounds.pushed) {
    *why = Rejection::kDuplicate;
    return absl::AlreadyExistsError(
        absl::StrCat("client ", id, ": update for round ", header.round(),
                     " already applied"));
  }
  if (rounds.task == 0 || header.round() != rounds.task) {
    *why = Rejection::kStaleRound;
    return absl::FailedPreconditionError(
        absl::StrCat("client ", id, ": update for round ", header.round(),
                     ", its task is for round ", rounds.task));
  }
  if (absl::Status s = CheckStaleness(id, header.round(), version); !s.ok()) {
    *why = Rejection::kStaleRound;
    return s;
  }
  if (options_.max_staleness > 0) {
    pushes_[header.round()].Track(cancel);  // Close cuts the too stale
  } else {
    in_flight_.Track(cancel);
  }
  return Ticket{id, header.round(), rounds.sent, std::move(cancel)};
}

absl::StatusOr<Acceptance> AsyncScheduler::Accept(
    const Ticket& ticket, const v1::UpdateHeader& header, int64_t bytes,
    int64_t version, absl::Time /*now*/, Rejection* why) {
  auto known = clients_.find(ticket.client_id);
  if (known == clients_.end()) {
    // Forgotten while it uploaded.
    *why = Rejection::kStaleRound;
    return absl::FailedPreconditionError(
        absl::StrCat("client ", ticket.client_id, ": update for round ",
                     ticket.round, " can no longer be applied"));
  }
  ClientRounds& rounds = known->second;
  if (!open_ || rounds.task != ticket.round || rounds.sent != ticket.step) {
    // Training stopped, or the client took a newer task (or a concurrent push
    // for the same task was accepted) while this one uploaded.
    *why = rounds.pushed == ticket.round && rounds.sent == ticket.step
               ? Rejection::kDuplicate
               : Rejection::kStaleRound;
    if (*why == Rejection::kDuplicate) {
      return absl::AlreadyExistsError(
          absl::StrCat("client ", ticket.client_id, ": update for round ",
                       ticket.round, " already applied"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("client ", ticket.client_id, ": update for round ",
                     ticket.round, " can no longer be applied"));
  }
  if (absl::Status s = CheckStaleness(ticket.client_id, ticket.round, version);
      !s.ok()) {
    *why = Rejection::kStaleRound;
    return s;
  }
  const int64_t staleness = Staleness(ticket.round, version);
  rounds.pushed = ticket.round;
  rounds.task = 0;
  training_.erase(ticket.client_id);
  accepted_.push_back(ticket.client_id);
  metrics_.Add(AnswerMetrics::FromHeader(header, bytes));
  max_staleness_seen_ = std::max(max_staleness_seen_, staleness);
  window_loss_.Add(header.train_loss(),
                   static_cast<double>(header.num_examples()));
  ++window_updates_;

  Acceptance acceptance;
  acceptance.weight = 1;
  acceptance.scale = Scale(staleness);
  scale_sum_ += acceptance.scale;
  acceptance.accepted = static_cast<int>(accepted_.size());
  if (acceptance.accepted >= options_.buffer) {
    acceptance.outcome = kOutcome;
  } else {
    acceptance.wait_for_next_step = true;
  }
  // The reply names the version this update is part of.
  acceptance.round = version + 1;
  return acceptance;
}

absl::string_view AsyncScheduler::Stranded(
    int min_updates, int alive,
    const std::function<bool(const std::string&)>& is_alive) const {
  // Fewer than a robust rule needs could not make a version: the step would
  // be abandoned, its clients asked again, and stranded again.
  if (!open_ || accepted_.empty() ||
      static_cast<int>(accepted_.size()) < min_updates) {
    return {};
  }
  // At most K - 1 ids: the step closes at K.
  const auto in = std::count_if(accepted_.begin(), accepted_.end(), is_alive);
  return in >= alive ? kOutcome : absl::string_view();
}

void AsyncScheduler::CutBefore(
    int64_t round, std::map<int64_t, InFlightCalls>* by_round,
    std::vector<std::shared_ptr<CancelHandle>>* cancel) {
  for (auto it = by_round->begin(); it != by_round->end() && it->first < round;
       it = by_round->erase(it)) {
    for (auto& handle : it->second.Take()) cancel->push_back(std::move(handle));
  }
}

Closing AsyncScheduler::Close(absl::string_view outcome, int64_t version,
                              int alive, absl::Time now) {
  open_ = false;
  Closing closing;
  v1::RoundRecord& record = closing.record;
  const int n = static_cast<int>(accepted_.size());
  record.set_round(version + 1);
  record.set_attempt(1);
  record.set_selected(n);
  record.set_responded(n);
  for (const std::string& id : accepted_) {
    record.add_selected_clients(id);
    record.add_accepted_clients(id);
  }
  record.set_outcome(std::string(outcome));
  record.set_duration_seconds(absl::ToDoubleSeconds(now - step_start_));
  record.set_bytes_sent(bytes_sent_);
  record.set_staleness(max_staleness_seen_);
  record.set_update_scale(n > 0 ? scale_sum_ / n : 0);
  metrics_.Fill(&record);
  // The convergence window: as many updates as alive clients, at least
  // min_clients; fewer would compare different clients' data.
  const int window = std::max(options_.min_clients, alive);
  closing.save = false;
  if (window_updates_ >= window) {
    closing.loss = window_loss_.value();
    closing.save = true;  // once a window: not a disk write per update
    window_loss_ = WeightedMean();
    window_updates_ = 0;
  }
  // And at least every kMaxUnsavedTime of versions: with many clients a
  // window is many updates (10,000 at 10,000 alive), all of them lost to a
  // crash before it closes.
  if (outcome != "abandoned" && now - saved_at_ >= kMaxUnsavedTime) {
    closing.save = true;
  }
  if (closing.save) saved_at_ = now;
  // Tasks from now on are for round version + 2 (version + 1 again when
  // nothing was applied). The downloads of rounds the run would no longer
  // take an update for (staler than max_staleness), or beyond the newest
  // download_versions rounds, end here.
  const int64_t next_round = outcome == "abandoned" ? version + 1 : version + 2;
  int64_t keep_from = std::numeric_limits<int64_t>::min();
  if (options_.download_versions > 0) {
    keep_from = next_round - options_.download_versions + 1;
  }
  if (options_.max_staleness > 0) {
    keep_from = std::max(keep_from, next_round - options_.max_staleness);
  }
  CutBefore(keep_from, &downloads_, &closing.cancel);
  // So do the pushes still uploading an update that could no longer be
  // applied: the next version would find them staler than max_staleness.
  if (options_.max_staleness > 0) {
    CutBefore(next_round - options_.max_staleness, &pushes_, &closing.cancel);
  }
  // An abandoned step applied nothing, and the next one is for the same
  // round: its clients' updates may come again (else each would be refused
  // as a duplicate, and a step whose clients were all of this one could
  // never fill).
  if (outcome == "abandoned") {
    for (const std::string& id : accepted_) {
      if (auto it = clients_.find(id); it != clients_.end()) {
        it->second.pushed = 0;
      }
    }
  }
  // The next step starts now.
  step_start_ = now;
  accepted_.clear();
  metrics_ = StepMetrics();
  bytes_sent_ = 0;
  max_staleness_seen_ = 0;
  scale_sum_ = 0;
  return closing;
}

void AsyncScheduler::NoteSent(const std::string& client_id, const Task& task,
                              int64_t bytes) {
  if (task.type != v1::TASK_TYPE_TRAIN) return;
  ClientRounds& rounds = clients_[client_id];
  rounds.task = task.round;
  ++rounds.sent;
  training_.insert(client_id);
  bytes_sent_ += bytes;
  if (task.retire == nullptr) return;
  if (options_.download_versions > 0 || options_.max_staleness > 0) {
    downloads_[task.round].Track(task.retire);  // Close cuts old rounds
  } else {
    // Nothing to cut it for until training stops: kept with the pushes, whose
    // list lets go of ended calls as it grows (a per-round list here would
    // keep a handle for every download of the run).
    in_flight_.Track(task.retire);
  }
}

std::vector<std::shared_ptr<CancelHandle>> AsyncScheduler::Stop() {
  open_ = false;
  std::vector<std::shared_ptr<CancelHandle>> cancel = in_flight_.Take();
  const int64_t all = std::numeric_limits<int64_t>::max();
  CutBefore(all, &downloads_, &cancel);
  CutBefore(all, &pushes_, &cancel);
  return cancel;
}

std::optional<v1::RoundRecord> AsyncScheduler::OpenRecord(
    absl::Time /*now*/,
    const std::function<bool(const std::string&)>& /*is_gone*/,
    bool /*client_ids*/) const {
  return std::nullopt;  // versions are recorded as they are made
}

bool AsyncScheduler::IsTraining(const std::string& client_id) const {
  auto it = clients_.find(client_id);
  return open_ && it != clients_.end() && it->second.task != 0;
}

void AsyncScheduler::ForEachTraining(
    const std::function<void(const std::string&)>& visit) const {
  if (!open_) return;
  for (const std::string& id : training_) visit(id);
}

void AsyncScheduler::Forget(const std::string& client_id) {
  clients_.erase(client_id);
  training_.erase(client_id);
}

}  // namespace fedlearn
