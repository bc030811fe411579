#ifndef FEDLEARN_SERVER_FEDAVG_H_
#define FEDLEARN_SERVER_FEDAVG_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace fedlearn {

// Streaming FedAvg: folds client updates (deltas from the round's global
// weights) in as they arrive, weighted by their number of examples, and
// produces
//   global + sum_i(n_i * delta_i) / sum_i(n_i).
// Memory is one double per parameter whatever the number of clients. Sums are
// kept in double: n_i * delta_i is exact in double for n_i < 2^29, and the sum
// of 1,000 updates keeps an error far below float32's resolution. Not
// thread-safe; the owner serialises.
class FedAvgAccumulator {
 public:
  explicit FedAvgAccumulator(size_t num_parameters);

  // Starts a new round: forgets every folded update.
  void Reset();

  // Adds `weight` * `update`. `update` has num_parameters() values; weight > 0.
  void Fold(double weight, absl::Span<const float> update);

  // Writes global + weighted mean of the folded updates into `out` (which may
  // alias `global`). Requires at least one folded update.
  void ApplyMean(absl::Span<const float> global, absl::Span<float> out) const;

  size_t num_parameters() const { return sum_.size(); }
  int count() const { return count_; }
  double total_weight() const { return total_weight_; }

 private:
  std::vector<double> sum_;
  double total_weight_ = 0;
  int count_ = 0;
};

// A weighted mean of scalars (loss, accuracy), folded one value at a time.
class WeightedMean {
 public:
  void Add(double value, double weight) {
    sum_ += value * weight;
    weight_ += weight;
  }
  double weight() const { return weight_; }
  // 0 when nothing was added.
  double value() const { return weight_ > 0 ? sum_ / weight_ : 0.0; }

 private:
  double sum_ = 0;
  double weight_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_FEDAVG_H_
