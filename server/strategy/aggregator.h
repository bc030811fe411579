#ifndef FEDLEARN_SERVER_STRATEGY_AGGREGATOR_H_
#define FEDLEARN_SERVER_STRATEGY_AGGREGATOR_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/aligned_vector.h"
#include "server/strategy/update_store.h"

namespace fedlearn {

// Turns the updates of one aggregation step (a round, or K async updates) into
// one aggregate update Delta, which a ServerOptimizer then applies (the
// pseudo-gradient of Reddi et al. 2021 is -Delta). Updates are deltas from the
// weights their client was sent. Each update is folded whole or not at all:
// the controller folds only complete, verified updates, so a rejected one never
// touches the aggregate.
//
// A streaming aggregator keeps O(model) state whatever the number of updates
// and reports bytes_per_update() == 0. One that needs every update at once
// (coordinate-wise median, Krum: robust_aggregator.h) reports what it keeps
// per update, so that the controller can hold it to a memory budget before the
// round starts, and keeps them in an UpdateStore.
//
// The controller folds in two steps, so that nothing slow runs under its lock:
// Stage, on the push's thread outside the lock (a stored aggregator copies the
// update into its store there; a streaming one has nothing to do), then
// FoldStaged under the lock once the update is accepted. A staged update that
// is not folded is dropped and changes nothing.
// Every call but Stage is serialised by the run controller under its lock.
class Aggregator {
 public:
  virtual ~Aggregator() = default;

  // Bytes kept per folded update; 0 for a streaming aggregator.
  virtual size_t bytes_per_update() const = 0;

  // Forgets every folded update: the start of a new aggregation step, or an
  // abandoned one.
  virtual void Reset() = 0;

  // A step opens for `sampled` > 0 clients (rounds mode), before its first
  // fold. Only an aggregator with a fixed denominator (DpMeanAggregator) needs
  // it.
  virtual void BeginStep(int sampled) { (void)sampled; }

  // What Stage prepared for FoldStaged: a stored aggregator's copy of the
  // update, and (central DP) whether its norm was within the clip norm before
  // it was clipped.
  struct Staged {
    UpdateStore::Staged stored;
    bool within_clip = true;
  };

  // Thread-safe. Prepares `update`, on the push's private buffer, for
  // FoldStaged: nothing for the weighted mean; a stored aggregator copies it
  // (errors as UpdateStore::Stage); central DP's clips it in place to the
  // step's clip norm.
  virtual absl::StatusOr<Staged> Stage(absl::Span<float> update) {
    (void)update;
    return Staged();
  }

  // Folds `update` (num_parameters values). `weight` > 0 is its share of the
  // mean (its num_examples in rounds mode, 1 in async mode); `scale` > 0
  // multiplies the update itself (its staleness discount in async mode, 1 in
  // rounds mode).
  virtual void Fold(double weight, double scale,
                    absl::Span<const float> update) = 0;

  // Folds `update`, staged by Stage as `staged`.
  virtual void FoldStaged(double weight, double scale,
                          absl::Span<const float> update, Staged staged) {
    (void)staged;
    Fold(weight, scale, update);
  }

  // Updates folded since the last Reset.
  virtual int count() const = 0;

  // The aggregate Delta of the updates folded since Reset. Requires count() >
  // 0. The span is valid until the next Reset; Fold must not be called between
  // Finish and Reset. A stored aggregator fails when a spilled update cannot
  // be read back (DATA_LOSS) or when its rule needs more updates than were
  // folded (FAILED_PRECONDITION); the step is then abandoned.
  virtual absl::StatusOr<absl::Span<const double>> Finish() = 0;
};

// Streaming weighted mean, FedAvg's aggregate:
//   Delta = sum_i(weight_i * scale_i * update_i) / sum_i(weight_i).
// Memory: one double per parameter (9.6 MB for mnist_cnn), whatever the number
// of clients. Sums are kept in double: weight * update is exact in double for
// integer weights below 2^29, and the sum of 1,000 updates keeps an error far
// below float32's resolution. Finish divides in place, so the aggregate costs
// no second buffer.
class WeightedMeanAggregator final : public Aggregator {
 public:
  explicit WeightedMeanAggregator(size_t num_parameters);

  size_t bytes_per_update() const override { return 0; }
  void Reset() override;
  void Fold(double weight, double scale,
            absl::Span<const float> update) override;
  int count() const override { return count_; }
  absl::StatusOr<absl::Span<const double>> Finish() override;

  double total_weight() const { return total_weight_; }

 private:
  AlignedVector<double> sum_;  // on a cache line: the fold streams it
  double total_weight_ = 0;
  int count_ = 0;
  bool finished_ = false;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_AGGREGATOR_H_
