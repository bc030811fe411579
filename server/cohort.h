#ifndef FEDLEARN_SERVER_COHORT_H_
#define FEDLEARN_SERVER_COHORT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "server/step_metrics.h"
#include "server/task.h"

namespace fedlearn {

// One attempt at a training round or an evaluation: the clients asked, who has
// answered, the metrics of the answers (weighted by their example counts), and
// the rule that closes it. It closes when every selected client has answered
// ("all"), or a quorum of ceil((1 - tolerance) x selected) has ("quorum": with
// 10 selected and 0.3, 7), and is abandoned below quorum at its deadline.
// Memory: the ids of its clients, twice. Not thread-safe: its owner
// serialises.
class Cohort {
 public:
  Cohort(int64_t round, int number, std::vector<std::string> selected,
         double tolerance, absl::Time start, absl::Time deadline);

  int64_t round() const { return round_; }
  int number() const { return number_; }
  absl::Time start() const { return start_; }
  absl::Time deadline() const { return deadline_; }
  const std::vector<std::string>& selected() const { return selected_; }
  bool IsSelected(const std::string& id) const {
    return selected_set_.contains(id);
  }
  bool HasAnswered(const std::string& id) const {
    return answered_set_.contains(id);
  }
  int answered() const { return static_cast<int>(answered_.size()); }
  int quorum() const;
  // The quorum of `selected` clients tolerating `tolerance` of them silent.
  static int Quorum(int selected, double tolerance);

  // `successor` takes the place of `gone`, a selected client that has not
  // answered and never will (it joined again under a new id): the attempt
  // keeps its size and quorum. False, changing nothing, when `gone` is not
  // such a client or `successor` is selected already.
  bool Replace(const std::string& gone, const std::string& successor);

  // Records `id`'s answer (it must be selected and not have answered).
  void Add(const std::string& id, const AnswerMetrics& answer);

  // "all" or "quorum" when the answers close the attempt; empty otherwise.
  absl::string_view Outcome() const;

  // Pushes in flight for this attempt, and its TRAIN or EVALUATE downloads,
  // cut off when it closes.
  void Track(std::shared_ptr<CancelHandle> handle);
  std::vector<std::shared_ptr<CancelHandle>> TakeInFlight();

  // `task` was sent with `bytes` of weights: counted, and a download of this
  // attempt's round (Task::retire) tracked, to be cut off when it closes.
  void NoteSent(const Task& task, int64_t bytes);

  // The attempt's record as of `now` with `outcome` ("open", "all",
  // "quorum", "abandoned"); `dropped` is the count of selected clients that
  // did not answer and are gone (a closed attempt counts every selected
  // client that did not answer). Its selected and accepted client ids only
  // when `client_ids`.
  v1::RoundRecord Record(absl::string_view outcome, absl::Time now, int dropped,
                         bool client_ids = true) const;

  const StepMetrics& metrics() const { return metrics_; }

 private:
  const int64_t round_;
  const int number_;
  std::vector<std::string> selected_;
  absl::flat_hash_set<std::string> selected_set_;
  const double tolerance_;
  const absl::Time start_;
  const absl::Time deadline_;
  std::vector<std::string> answered_;  // in the order they came
  absl::flat_hash_set<std::string> answered_set_;
  StepMetrics metrics_;
  int64_t bytes_sent_ = 0;
  InFlightCalls in_flight_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_COHORT_H_
