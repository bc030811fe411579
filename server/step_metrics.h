#ifndef FEDLEARN_SERVER_STEP_METRICS_H_
#define FEDLEARN_SERVER_STEP_METRICS_H_

#include <cstdint>

#include "fedlearn/v1/coordinator.pb.h"
#include "server/weighted_mean.h"

namespace fedlearn {

// The most examples (and validation examples) one answer may claim: about a
// trillion, far beyond any client's data set, and small enough that the
// int64 sums of a step's answers cannot overflow (2^63 / 2^40 = 8 million
// answers). Claims beyond it are INVALID_ARGUMENT.
inline constexpr int64_t kMaxExamplesPerAnswer = int64_t{1} << 40;

// What one answer (an accepted update, an evaluation report) says about its
// client's data.
struct AnswerMetrics {
  int64_t num_examples = 0;
  double loss = 0;
  double accuracy = 0;
  int64_t num_validation_examples = 0;
  double validation_loss = 0;
  double validation_accuracy = 0;
  int64_t bytes = 0;  // of the update as received

  // An accepted update's: its header's metrics and the bytes it took.
  static AnswerMetrics FromHeader(const v1::UpdateHeader& header,
                                  int64_t bytes);
};

// The metrics of one step's answers (a round attempt, an evaluation attempt,
// an async model version): loss and accuracy weighted by example counts,
// validation weighted by validation counts, bytes summed.
class StepMetrics {
 public:
  void Add(const AnswerMetrics& answer);
  // Sets record.metrics and record.bytes_received.
  void Fill(v1::RoundRecord* record) const;

  const WeightedMean& loss() const { return loss_; }
  const WeightedMean& accuracy() const { return accuracy_; }
  int64_t num_examples() const { return num_examples_; }

 private:
  WeightedMean loss_, accuracy_, validation_loss_, validation_accuracy_;
  int64_t num_examples_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STEP_METRICS_H_
