#include "server/cohort.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace fedlearn {

Cohort::Cohort(int64_t round, int number, std::vector<std::string> selected,
               double tolerance, absl::Time start, absl::Time deadline)
    : round_(round),
      number_(number),
      selected_(std::move(selected)),
      selected_set_(selected_.begin(), selected_.end()),
      tolerance_(tolerance),
      start_(start),
      deadline_(deadline) {}

int Cohort::quorum() const {
  return Quorum(static_cast<int>(selected_.size()), tolerance_);
}

int Cohort::Quorum(int selected, double tolerance) {
  // "Tolerates `tolerance` of the selected not answering": with 10 selected
  // and 0.3, 7 answers close the attempt. The epsilon keeps 0.7 * 10 from
  // becoming 8.
  const int quorum =
      static_cast<int>(std::ceil((1.0 - tolerance) * selected - 1e-9));
  return std::clamp(quorum, 1, std::max(selected, 1));
}

bool Cohort::Replace(const std::string& gone, const std::string& successor) {
  if (!IsSelected(gone) || HasAnswered(gone) || IsSelected(successor)) {
    return false;
  }
  *std::find(selected_.begin(), selected_.end(), gone) = successor;
  selected_set_.erase(gone);
  selected_set_.insert(successor);
  return true;
}

void Cohort::Add(const std::string& id, const AnswerMetrics& answer) {
  answered_.push_back(id);
  answered_set_.insert(id);
  metrics_.Add(answer);
}

absl::string_view Cohort::Outcome() const {
  if (answered() == static_cast<int>(selected_.size())) return "all";
  if (answered() >= quorum()) return "quorum";
  return {};
}

void Cohort::Track(std::shared_ptr<CancelHandle> handle) {
  in_flight_.Track(std::move(handle));
}

void Cohort::NoteSent(const Task& task, int64_t bytes) {
  bytes_sent_ += bytes;
  if (task.retire != nullptr && task.round == round_) Track(task.retire);
}

std::vector<std::shared_ptr<CancelHandle>> Cohort::TakeInFlight() {
  return in_flight_.Take();
}

v1::RoundRecord Cohort::Record(absl::string_view outcome, absl::Time now,
                               int dropped, bool client_ids) const {
  v1::RoundRecord record;
  record.set_round(round_);
  record.set_attempt(number_);
  record.set_selected(static_cast<int>(selected_.size()));
  if (client_ids) {
    for (const std::string& id : selected_) record.add_selected_clients(id);
    for (const std::string& id : answered_) record.add_accepted_clients(id);
  }
  record.set_responded(answered());
  record.set_dropped(dropped);
  record.set_outcome(std::string(outcome));
  record.set_duration_seconds(absl::ToDoubleSeconds(now - start_));
  record.set_bytes_sent(bytes_sent_);
  metrics_.Fill(&record);
  return record;
}

}  // namespace fedlearn
