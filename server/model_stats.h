#ifndef FEDLEARN_SERVER_MODEL_STATS_H_
#define FEDLEARN_SERVER_MODEL_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/model_spec.h"

namespace fedlearn {

// Summary of one tensor of the global model, for the dashboard's parameters
// view.
struct TensorStats {
  std::string name;
  std::vector<int64_t> shape;
  int64_t count = 0;
  double l2 = 0;
  double mean = 0;
  double std = 0;  // population standard deviation
  double min = 0;
  double max = 0;
  // `histogram.size()` equal-width bins over [min, max]; the last bin is
  // closed. All values fall in bin 0 when min == max.
  std::vector<int64_t> histogram;
};

// Statistics of every tensor of `spec` in `weights` (spec.num_parameters
// floats), in wire order. Sums are in double.
std::vector<TensorStats> ComputeTensorStats(const ModelSpec& spec,
                                            absl::Span<const float> weights,
                                            int bins);

// /api/parameters: {"round": R, "tensors": [{"name", "shape", "count", "l2",
// "mean", "std", "min", "max", "histogram": {"lo", "hi", "counts"}}, ...]}
// where R is the number of rounds folded into the weights.
std::string TensorStatsJson(int64_t round,
                            const std::vector<TensorStats>& tensors);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_MODEL_STATS_H_
