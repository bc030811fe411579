#include "server/step_metrics.h"

namespace fedlearn {

AnswerMetrics AnswerMetrics::FromHeader(const v1::UpdateHeader& header,
                                        int64_t bytes) {
  AnswerMetrics a;
  a.num_examples = header.num_examples();
  a.loss = header.train_loss();
  a.accuracy = header.train_accuracy();
  a.num_validation_examples = header.num_validation_examples();
  a.validation_loss = header.validation_loss();
  a.validation_accuracy = header.validation_accuracy();
  a.bytes = bytes;
  return a;
}

void StepMetrics::Add(const AnswerMetrics& answer) {
  const double weight = static_cast<double>(answer.num_examples);
  loss_.Add(answer.loss, weight);
  accuracy_.Add(answer.accuracy, weight);
  if (answer.num_validation_examples > 0) {
    const double vw = static_cast<double>(answer.num_validation_examples);
    validation_loss_.Add(answer.validation_loss, vw);
    validation_accuracy_.Add(answer.validation_accuracy, vw);
  }
  num_examples_ += answer.num_examples;
  bytes_ += answer.bytes;
}

void StepMetrics::Fill(v1::RoundRecord* record) const {
  record->set_bytes_received(bytes_);
  v1::RoundMetrics* metrics = record->mutable_metrics();
  metrics->set_num_examples(num_examples_);
  metrics->set_train_loss(loss_.value());
  metrics->set_train_accuracy(accuracy_.value());
  if (validation_loss_.weight() > 0) {
    metrics->set_has_validation(true);
    metrics->set_validation_loss(validation_loss_.value());
    metrics->set_validation_accuracy(validation_accuracy_.value());
  }
}

}  // namespace fedlearn
