#ifndef FEDLEARN_SERVER_OPTIONS_H_
#define FEDLEARN_SERVER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fedlearn/v1/config.pb.h"
#include "fedlearn/v1/coordinator.pb.h"
#include "server/privacy/dp_params.h"
#include "server/strategy/update_store.h"

namespace fedlearn {

// How updates become the global model.
enum class Mode {
  // Synchronous FedAvg rounds: sample, wait for a quorum, average.
  kRounds,
  // Asynchronous parameter server: every client trains the latest model and
  // each update is applied as it arrives, scaled down by its staleness.
  kAsync,
};

// Everything that shapes a run, set from flags (server/main.cc) or by tests.
// The plain options are listed, with their defaults and help, in
// server/options.inc; the rest are parsed from their flag's text.
struct CoordinatorOptions {
#define FEDLEARN_OPTION(type, name, default_value, help) \
  type name = default_value;
#include "server/options.inc"
#undef FEDLEARN_OPTION

  // --mode.
  Mode mode = Mode::kRounds;
  // --strategy_config: the strategy's knobs, those not set taking the
  // strategy's defaults.
  v1::StrategyConfig strategy_config;
  // --input_norm (TrainingPlan.input_mean/std); input_std 0: p / 255. The
  // default is MNIST's pixel statistics.
  double input_mean = 0.1307;
  double input_std = 0.3081;

  // async_mixing, with 0 resolved to 1 / min_clients.
  double AsyncMixing() const {
    return async_mixing > 0 ? async_mixing : 1.0 / min_clients;
  }

  // forget_after, with 0 resolved to never (absl::InfiniteDuration()).
  absl::Duration ForgetAfter() const {
    return forget_after == absl::ZeroDuration() ? absl::InfiniteDuration()
                                                : forget_after;
  }

  // --grpc_memory in bytes, "auto" resolved to 256 MiB for the transfers
  // under way plus 16 KiB per --max_clients for the idle connections (a quota
  // of 64 MiB filled at 7,326 idle clients): README, "Many clients".
  // INVALID_ARGUMENT naming the flag for a malformed or zero size.
  absl::StatusOr<size_t> GrpcMemoryBytes() const;

  // --aggregation_memory and --aggregation_spill_dir resolved: the size in
  // bytes, the spill directory chosen (STATE_DIR/spill, $TMPDIR or /tmp when
  // not given; empty for none). INVALID_ARGUMENT naming the flag for a
  // malformed size.
  absl::StatusOr<AggregationBudget> Budget() const;

  // The --dp_* flags as the strategy takes them.
  DpParams Privacy() const;

  // Checks ranges and combinations; INVALID_ARGUMENT naming the flag.
  absl::Status Validate() const;
  // The --dp_* part of Validate.
  absl::Status ValidatePrivacy() const;

  // The training plan these options give every client.
  v1::TrainingPlan Plan() const;
};

// "rounds" or "async", as --mode and the state directory spell them.
absl::string_view ModeName(Mode mode);

// --mode: "rounds" or "async" into options->mode. INVALID_ARGUMENT naming the
// flag otherwise.
absl::Status ParseMode(absl::string_view text, CoordinatorOptions* options);

// --input_norm: "mnist" (0.1307, 0.3081), "fashion-mnist" (0.2860, 0.3530),
// "MEAN,STD" with STD > 0, or "none" (p / 255), into options->input_mean and
// input_std. INVALID_ARGUMENT naming the flag otherwise.
absl::Status ParseInputNorm(absl::string_view text,
                            CoordinatorOptions* options);

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_OPTIONS_H_
