#include "server/sync_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fedlearn {
std::optional<int> SyncScheduler::WantClients(int alive) const {
  if (alive < options_.min_clients) return std::nullopt;
  int wanted =
      options_.clients_per_round > 0
          ? options_.clients_per_round
          : std::max(
                options_.min_clients,
                static_cast<int>(std::ceil(options_.fraction * alive - 1e-9)));
  wanted = std::min(wanted, alive);
  return std::min(
      alive,
      static_cast<int>(std::ceil(wanted * options_.over_selection - 1e-9)));
}

Scheduler::StepBounds SyncScheduler::UpdatesPerStep(int max_clients) const {
  // Fewest: the quorum of the smallest sample, taken when just min_clients
  // are alive; most: every client of the largest sample.
  const int smallest = WantClients(options_.min_clients).value_or(1);
  const int largest =
      WantClients(std::max(max_clients, options_.min_clients)).value_or(1);
  return {Cohort::Quorum(smallest, options_.tolerance), largest};
}

Opening SyncScheduler::Open(std::vector<std::string> sampled,
                            const Weights& weights,
                            const std::shared_ptr<const v1::TrainingPlan>& plan,
                            int64_t version, absl::Time now) {
  const int64_t round = version + 1;
  attempt_ = round == last_round_ ? attempt_ + 1 : 1;
  last_round_ = round;
  ++step_;
  cohort_ = std::make_unique<Cohort>(round, attempt_, std::move(sampled),
                                     options_.tolerance, now,
                                     now + options_.round_timeout);
  Opening opening;
  Task& train = train_;
  train = Task();
  train.type = v1::TASK_TYPE_TRAIN;
  train.round = round;
  train.run_validation = options_.rounds_between_validations > 0 &&
                         round % options_.rounds_between_validations == 0;
  train.deadline = cohort_->deadline();
  train.weights = weights;
  train.plan = plan;
  for (const std::string& id : cohort_->selected()) {
    opening.posts.emplace_back(id, train);
  }
  opening.default_task.type = v1::TASK_TYPE_WAIT;
  opening.default_task.round = round;
  opening.default_task.retry_after = kWaitRetryAfter;
  opening.log = absl::StrCat("training attempt ", attempt_, " started with ",
                             cohort_->selected().size(), " clients (quorum ",
                             cohort_->quorum(), "), deadline in ",
                             absl::FormatDuration(options_.round_timeout));
  return opening;
}

absl::StatusOr<Ticket> SyncScheduler::Admit(
    const v1::UpdateHeader& header, std::shared_ptr<CancelHandle> cancel,
    int64_t /*version*/, Rejection* why) {
  const std::string& id = header.client_id();
  if (cohort_ == nullptr) {
    *why = Rejection::kStaleRound;
    return absl::FailedPreconditionError(
        absl::StrCat("client ", id, ": no training round is open"));
  }
  if (header.round() != cohort_->round()) {
    *why = Rejection::kStaleRound;
    return absl::FailedPreconditionError(
        absl::StrCat("client ", id, ": update for round ", header.round(),
                     ", current round is ", cohort_->round()));
  }
  if (!cohort_->IsSelected(id)) {
    *why = Rejection::kNotSelected;
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", id, ": not selected for round ", cohort_->round()));
  }
  if (cohort_->HasAnswered(id)) {
    *why = Rejection::kDuplicate;
    return absl::AlreadyExistsError(
        absl::StrCat("client ", id, ": update for round ", cohort_->round(),
                     " already accepted"));
  }
  cohort_->Track(cancel);
  return Ticket{id, header.round(), step_, std::move(cancel)};
}

absl::StatusOr<Acceptance> SyncScheduler::Accept(
    const Ticket& ticket, const v1::UpdateHeader& header, int64_t bytes,
    int64_t /*version*/, absl::Time /*now*/, Rejection* why) {
  if (cohort_ == nullptr || ticket.step != step_) {
    *why = Rejection::kStaleRound;
    return absl::FailedPreconditionError(
        absl::StrCat("client ", ticket.client_id, ": round ", ticket.round,
                     " closed before the update arrived"));
  }
  // A client that re-joined under a new id while this push was under way
  // has its place in the round under that id now: one place, one update.
  if (!cohort_->IsSelected(ticket.client_id)) {
    *why = Rejection::kNotSelected;
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", ticket.client_id, ": no longer selected for round ",
        ticket.round, " (it re-joined under a new id)"));
  }
  if (cohort_->HasAnswered(ticket.client_id)) {
    *why = Rejection::kDuplicate;
    return absl::AlreadyExistsError(
        absl::StrCat("client ", ticket.client_id, ": update for round ",
                     ticket.round, " already accepted"));
  }
  cohort_->Add(ticket.client_id, AnswerMetrics::FromHeader(header, bytes));
  Acceptance acceptance;
  acceptance.weight = static_cast<double>(header.num_examples());
  acceptance.outcome = cohort_->Outcome();
  acceptance.round = cohort_->round();
  acceptance.accepted = cohort_->answered();
  return acceptance;
}

Closing SyncScheduler::Close(absl::string_view outcome, int64_t /*version*/,
                             int /*alive*/, absl::Time now) {
  std::unique_ptr<Cohort> cohort = std::move(cohort_);
  Closing closing;
  closing.record = cohort->Record(
      outcome, now,
      static_cast<int>(cohort->selected().size()) - cohort->answered());
  if (outcome != "abandoned") closing.loss = cohort->metrics().loss().value();
  closing.cancel = cohort->TakeInFlight();
  return closing;
}

absl::Time SyncScheduler::deadline() const {
  return cohort_ == nullptr ? absl::InfiniteFuture() : cohort_->deadline();
}

std::optional<Task> SyncScheduler::Replace(const std::string& gone,
                                           const std::string& successor) {
  if (cohort_ == nullptr || !cohort_->Replace(gone, successor)) {
    return std::nullopt;
  }
  return train_;
}

void SyncScheduler::NoteSent(const std::string& /*client_id*/, const Task& task,
                             int64_t bytes) {
  // Its download ends when the round closes, as its push would.
  if (cohort_ != nullptr && task.type == v1::TASK_TYPE_TRAIN) {
    cohort_->NoteSent(task, bytes);
  }
}

std::vector<std::shared_ptr<CancelHandle>> SyncScheduler::Stop() {
  std::vector<std::shared_ptr<CancelHandle>> cancel;
  if (cohort_ != nullptr) cancel = cohort_->TakeInFlight();
  cohort_.reset();
  return cancel;
}

std::optional<v1::RoundRecord> SyncScheduler::OpenRecord(
    absl::Time now, const std::function<bool(const std::string&)>& is_gone,
    bool client_ids) const {
  if (cohort_ == nullptr) return std::nullopt;
  int gone = 0;
  for (const std::string& id : cohort_->selected()) {
    if (!cohort_->HasAnswered(id) && is_gone(id)) ++gone;
  }
  return cohort_->Record("open", now, gone, client_ids);
}

bool SyncScheduler::IsTraining(const std::string& client_id) const {
  return cohort_ != nullptr && cohort_->IsSelected(client_id) &&
         !cohort_->HasAnswered(client_id);
}

void SyncScheduler::ForEachTraining(
    const std::function<void(const std::string&)>& visit) const {
  if (cohort_ == nullptr) return;
  for (const std::string& id : cohort_->selected()) {
    if (!cohort_->HasAnswered(id)) visit(id);
  }
}

}  // namespace fedlearn
