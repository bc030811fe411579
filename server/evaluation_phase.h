#ifndef FEDLEARN_SERVER_EVALUATION_PHASE_H_
#define FEDLEARN_SERVER_EVALUATION_PHASE_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "server/cohort.h"
#include "server/task.h"

namespace fedlearn {

// The evaluation phase after training: an attempt asks every alive client to
// evaluate the final weights (EVALUATE) and aggregates their test loss and
// accuracy weighted by test size; it closes as a training round does (quorum,
// all, or abandoned at its deadline and tried again). Not thread-safe: the run
// controller serialises.
class EvaluationPhase {
 public:
  EvaluationPhase(double tolerance, absl::Duration timeout)
      : tolerance_(tolerance), timeout_(timeout) {}

  // Opens an attempt for the weights of `round` over `clients`; returns the
  // EVALUATE tasks to post.
  std::vector<std::pair<std::string, Task>> Open(
      int64_t round, std::vector<std::string> clients, const Weights& weights,
      absl::Time now);
  bool is_open() const { return cohort_ != nullptr; }
  absl::Time deadline() const {
    return cohort_ == nullptr ? absl::InfiniteFuture() : cohort_->deadline();
  }

  // Accepts a report; returns "all" or "quorum" when it closes the attempt,
  // empty otherwise. FAILED_PRECONDITION when no attempt is open, for a
  // client not asked or a wrong round, ALREADY_EXISTS for a second report,
  // INVALID_ARGUMENT for non-finite or out-of-range metrics. A rejected
  // report changes nothing.
  absl::StatusOr<absl::string_view> Report(const v1::ReportEvalRequest& report);

  struct Closed {
    v1::RoundRecord record;
    std::optional<v1::EvaluationResult> result;  // none when abandoned
    // The attempt's EVALUATE downloads still running: cut off, as their
    // reports could no longer count.
    std::vector<std::shared_ptr<CancelHandle>> cancel;
  };
  // Closes the open attempt with `outcome` ("all", "quorum", "abandoned").
  Closed Close(absl::string_view outcome, absl::Time now);

  // A resumed run had already made `attempts` evaluation attempts.
  void ResumeAttempts(int attempts) { attempts_ = attempts; }

  // As Scheduler::Replace: `successor` evaluates in place of `gone`.
  std::optional<Task> Replace(const std::string& gone,
                              const std::string& successor);

  // `task`, an EVALUATE task, was sent with `bytes` of weights; its
  // download (Task::retire) ends when the attempt closes.
  void NoteSent(const Task& task, int64_t bytes);
  const Cohort* cohort() const { return cohort_.get(); }

 private:
  const double tolerance_;
  const absl::Duration timeout_;
  std::unique_ptr<Cohort> cohort_;
  Task evaluate_;  // the open attempt's task
  int attempts_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_EVALUATION_PHASE_H_
