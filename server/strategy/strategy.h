#ifndef FEDLEARN_SERVER_STRATEGY_STRATEGY_H_
#define FEDLEARN_SERVER_STRATEGY_STRATEGY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fedlearn/v1/config.pb.h"
#include "server/privacy/dp_params.h"
#include "server/strategy/aggregator.h"
#include "server/strategy/dp_mean_aggregator.h"
#include "server/strategy/server_optimizer.h"
#include "server/strategy/update_transform.h"

namespace fedlearn {

// A federated-learning strategy, composed (in Flower's words, in our shape) of
//   transforms   applied to each accepted update on its private buffer;
//   aggregator   folding the updates of a step into their aggregate Delta;
//   optimizer    moving the global model along Delta;
//   proximal_mu  FedProx's term, sent to clients in the training plan.
// FedAvg is the weighted mean and server SGD at learning rate 1. The names:
//   fedavg      weighted mean, SGD (eta 1)
//   fedprox     fedavg with proximal_mu 0.01 (Li et al. 2020)
//   fedavgm     weighted mean, SGD with server momentum (Hsu et al. 2019)
//   fedadam, fedyogi, fedadagrad   weighted mean, the adaptive optimizers of
//               Reddi et al. 2021 (server_optimizer.h)
//   fedmedian   coordinate-wise median, SGD (eta 1) (robust_aggregator.h)
//   fedtrimmedavg   coordinate-wise trimmed mean, SGD (eta 1)
//   krum, multikrum Krum's choice / the mean of Multi-Krum's m best, SGD
// The last four keep every update of a step (UpdateStore, to a budget).
// Central differential privacy (DpParams) turns a mean strategy's clipping and
// weighted mean into DP-FedAvg's (DpMeanAggregator); the optimizer after it is
// post-processing and keeps the guarantee.
struct Strategy {
  std::string name;
  v1::StrategyConfig config;  // every knob resolved (ResolveStrategy)
  std::vector<std::unique_ptr<UpdateTransform>> transforms;
  std::unique_ptr<Aggregator> aggregator;
  std::unique_ptr<ServerOptimizer> optimizer;
  // Fewest updates the aggregator can finish a step with (Krum: 2f + 3).
  int min_updates = 1;
  DpParams dp;  // as made; enabled() when the aggregator is DP's
  // The aggregator as DP's, when dp.enabled(): its clip norm per step.
  DpMeanAggregator* dp_aggregator = nullptr;
};

// The names --strategy accepts, in the order --help lists them.
const std::vector<std::string>& StrategyNames();

// `config` with every knob that `name` uses set: those given kept, the others
// at the strategy's defaults (config.proto lists them). INVALID_ARGUMENT,
// naming the flag, for an unknown name, a knob out of range, or a knob given
// that the strategy does not use.
absl::StatusOr<v1::StrategyConfig> ResolveStrategy(
    absl::string_view name, const v1::StrategyConfig& config);

// The strategy `name` with `config` (resolved as above) for a model of
// `num_parameters`, a stored aggregator held to `budget`, private with `dp`
// when enabled. Errors as ResolveStrategy, and INVALID_ARGUMENT for DP with a
// robust aggregation rule or with the clip_norm knob (DP clips itself).
absl::StatusOr<Strategy> MakeStrategy(absl::string_view name,
                                      const v1::StrategyConfig& config,
                                      size_t num_parameters,
                                      const AggregationBudget& budget = {},
                                      const DpParams& dp = {});

// --strategy_config: `text` is the path of a file holding a StrategyConfig in
// text format, or that text itself. INVALID_ARGUMENT naming the flag (and the
// file) for text that does not parse.
absl::StatusOr<v1::StrategyConfig> ParseStrategyConfig(absl::string_view text);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STRATEGY_STRATEGY_H_
