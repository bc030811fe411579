#include "server/evaluation_phase.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace fedlearn {

std::vector<std::pair<std::string, Task>> EvaluationPhase::Open(
    int64_t round, std::vector<std::string> clients, const Weights& weights,
    absl::Time now) {
  cohort_ = std::make_unique<Cohort>(round, ++attempts_, std::move(clients),
                                     tolerance_, now, now + timeout_);
  Task& evaluate = evaluate_;
  evaluate = Task();
  evaluate.type = v1::TASK_TYPE_EVALUATE;
  evaluate.round = round;
  evaluate.deadline = cohort_->deadline();
  evaluate.weights = weights;
  std::vector<std::pair<std::string, Task>> posts;
  for (const std::string& id : cohort_->selected())
    posts.emplace_back(id, evaluate);
  return posts;
}

std::optional<Task> EvaluationPhase::Replace(const std::string& gone,
                                             const std::string& successor) {
  if (cohort_ == nullptr || !cohort_->Replace(gone, successor)) {
    return std::nullopt;
  }
  return evaluate_;
}

absl::StatusOr<absl::string_view> EvaluationPhase::Report(
    const v1::ReportEvalRequest& request) {
  const std::string& id = request.client_id();
  if (cohort_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", id, ": no evaluation is open"));
  }
  if (request.round() != cohort_->round()) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", id, ": report for round ", request.round(),
                     ", the final weights are round ", cohort_->round(), "'s"));
  }
  if (!cohort_->IsSelected(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", id, ": not asked to evaluate"));
  }
  if (cohort_->HasAnswered(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("client ", id, ": evaluation already reported"));
  }
  if (request.num_examples() <= 0 ||
      request.num_examples() > kMaxExamplesPerAnswer ||
      !std::isfinite(request.test_loss()) ||
      !(request.test_accuracy() >= 0 && request.test_accuracy() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client ", id,
        ": report needs num_examples in [1, 2^40], a finite loss and "
        "accuracy in [0, 1]"));
  }
  AnswerMetrics answer;
  answer.num_examples = request.num_examples();
  answer.loss = request.test_loss();
  answer.accuracy = request.test_accuracy();
  cohort_->Add(id, answer);
  return cohort_->Outcome();
}

void EvaluationPhase::NoteSent(const Task& task, int64_t bytes) {
  if (cohort_ != nullptr) cohort_->NoteSent(task, bytes);
}

EvaluationPhase::Closed EvaluationPhase::Close(absl::string_view outcome,
                                               absl::Time now) {
  std::unique_ptr<Cohort> cohort = std::move(cohort_);
  Closed closed;
  closed.cancel = cohort->TakeInFlight();
  closed.record = cohort->Record(
      outcome, now,
      static_cast<int>(cohort->selected().size()) - cohort->answered());
  closed.record.set_evaluation(true);
  if (outcome != "abandoned") {
    v1::EvaluationResult result;
    const StepMetrics& m = cohort->metrics();
    result.set_test_loss(m.loss().value());
    result.set_test_accuracy(m.accuracy().value());
    result.set_num_examples(m.num_examples());
    result.set_num_clients(cohort->answered());
    closed.result = result;
  }
  return closed;
}

}  // namespace fedlearn
