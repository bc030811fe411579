#ifndef FEDLEARN_SERVER_STRATEGY_ROBUST_AGGREGATOR_H_
#define FEDLEARN_SERVER_STRATEGY_ROBUST_AGGREGATOR_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/strategy/aggregator.h"
#include "server/strategy/update_store.h"

namespace fedlearn {

// Byzantine-robust aggregation rules: each needs every update of the step, so
// each keeps them in an UpdateStore (memory up to its budget, then spill
// files) and computes Delta at Finish in stripes of coordinates, its working
// memory count x kStripe floats besides the store's.
//
// None is weighted by num_examples: a client's example count is its own claim,
// and a robust rule that trusted it would let one client outvote the rest by
// claiming a large dataset. `weight` is ignored; `scale` (async staleness)
// multiplies the update as for the mean.
class StoredAggregator : public Aggregator {
 public:
  // Coordinates per stripe: 64 KiB of floats per update.
  static constexpr size_t kStripe = 16384;

  size_t bytes_per_update() const override { return store_.bytes_per_update(); }
  void Reset() override;
  absl::StatusOr<Staged> Stage(absl::Span<float> update) override;
  // Stages and keeps at once; on a staging error (budget spent with nowhere
  // to spill, a full disk) the update is not folded and the error kept for
  // Finish to return.
  void Fold(double weight, double scale,
            absl::Span<const float> update) override;
  void FoldStaged(double weight, double scale, absl::Span<const float> update,
                  Staged staged) override;
  int count() const override { return store_.count(); }
  absl::StatusOr<absl::Span<const double>> Finish() override;

  const UpdateStore& store() const { return store_; }

 protected:
  explicit StoredAggregator(UpdateStore::Options options);

  // Writes Delta into `out` (num_parameters) from the store's count() >= 1
  // updates.
  virtual absl::Status Compute(const UpdateStore& store,
                               absl::Span<double> out) = 0;

 private:
  UpdateStore store_;
  std::vector<double> delta_;
  absl::Status fold_error_;
  bool finished_ = false;
};

// Coordinate-wise median (Yin et al. 2018): per coordinate, the middle value,
// or the mean of the two middle values for an even count.
class MedianAggregator final : public StoredAggregator {
 public:
  explicit MedianAggregator(UpdateStore::Options options)
      : StoredAggregator(std::move(options)) {}

 private:
  absl::Status Compute(const UpdateStore& store,
                       absl::Span<double> out) override;
};

// Coordinate-wise trimmed mean (Yin et al. 2018): per coordinate, the mean of
// the values left after dropping the floor(beta n) smallest and as many
// largest. 0 <= beta < 0.5, so at least one value is left.
class TrimmedMeanAggregator final : public StoredAggregator {
 public:
  TrimmedMeanAggregator(UpdateStore::Options options, double beta)
      : StoredAggregator(std::move(options)), beta_(beta) {}

 private:
  absl::Status Compute(const UpdateStore& store,
                       absl::Span<double> out) override;
  double beta_;
};

// Krum and Multi-Krum (Blanchard et al. 2017). With n updates of which up to
// f are Byzantine, update i's score is the sum of its squared L2 distances to
// its n - f - 2 nearest other updates; Delta is the mean of the m updates of
// lowest score (ties to the earlier folded), m = 1 being Krum. Needs
// n >= 2f + 3 (FAILED_PRECONDITION otherwise). num_to_select 0 selects n - f.
// Working memory besides the stripes: n x n distances in double.
class KrumAggregator final : public StoredAggregator {
 public:
  KrumAggregator(UpdateStore::Options options, int num_byzantine,
                 int num_to_select)
      : StoredAggregator(std::move(options)),
        f_(num_byzantine),
        m_(num_to_select) {}

  // The updates selected by the last Finish, in the order they were folded.
  const std::vector<int>& selected() const { return selected_; }

 private:
  absl::Status Compute(const UpdateStore& store,
                       absl::Span<double> out) override;
  int f_;
  int m_;
  std::vector<int> selected_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_ROBUST_AGGREGATOR_H_
