#include "server/options.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "server/strategy/strategy.h"

namespace fedlearn {
namespace {

absl::Status Bad(absl::string_view flag, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", why));
}

// A size flag's value, N, NKiB, NMiB or NGiB, in bytes.
absl::StatusOr<size_t> ParseBytes(absl::string_view flag,
                                  absl::string_view value) {
  absl::string_view text = value;
  uint64_t unit = 1;
  for (const auto& [suffix, bytes] :
       {std::pair<absl::string_view, uint64_t>{"KiB", uint64_t{1} << 10},
        {"MiB", uint64_t{1} << 20},
        {"GiB", uint64_t{1} << 30}}) {
    if (absl::ConsumeSuffix(&text, suffix)) {
      unit = bytes;
      break;  // one unit: "1GiBKiB" is not a size
    }
  }
  uint64_t count = 0;
  if (!absl::SimpleAtoi(text, &count) ||
      count > std::numeric_limits<size_t>::max() / unit) {
    return Bad(flag,
               absl::StrCat("\"", value, "\": expected N, NKiB, NMiB or NGiB"));
  }
  return static_cast<size_t>(count * unit);
}

}  // namespace

absl::Status CoordinatorOptions::Validate() const {
  if (min_clients < 1) return Bad("min_clients", "must be at least 1");
  if (clients_per_round < 0) return Bad("clients_per_round", "must be >= 0");
  if (!(fraction > 0 && fraction <= 1))
    return Bad("fraction", "must be in (0, 1]");
  if (!(over_selection >= 1 && over_selection <= 10)) {
    return Bad("over_selection", "must be in [1, 10]");
  }
  if (!(tolerance >= 0 && tolerance < 1))
    return Bad("tolerance", "must be in [0, 1)");
  if (round_timeout <= absl::ZeroDuration())
    return Bad("round_timeout", "must be > 0");
  if (eval_timeout <= absl::ZeroDuration())
    return Bad("eval_timeout", "must be > 0");
  if (eval_clients < 0) return Bad("eval_clients", "must be >= 0");
  if (max_rounds < 1) return Bad("max_rounds", "must be at least 1");
  if (rounds_between_validations < 0) {
    return Bad("rounds_between_validations", "must be >= 0 (0: never)");
  }
  if (std::isnan(convergence_threshold)) {
    return Bad("convergence_threshold",
               "must be a number (-inf: never converge)");
  }
  if (!(async_mixing >= 0 && async_mixing <= 1)) {
    return Bad("async_mixing", "must be in [0, 1] (0: 1 / --min_clients)");
  }
  if (!(staleness_exponent >= 0 && std::isfinite(staleness_exponent))) {
    return Bad("staleness_exponent", "must be >= 0");
  }
  if (max_staleness < 0)
    return Bad("max_staleness", "must be >= 0 (0: no limit)");
  if (download_versions < 0)
    return Bad("download_versions", "must be >= 0 (0: no limit)");
  if (async_buffer < 1) return Bad("async_buffer", "must be at least 1");
  if (mode == Mode::kAsync && async_buffer > min_clients) {
    return Bad("async_buffer",
               absl::StrCat("must be at most --min_clients (", min_clients,
                            "): a version takes one update from each of K "
                            "clients"));
  }
  if (absl::Status s = ResolveStrategy(strategy, strategy_config).status();
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Budget().status(); !s.ok()) return s;
  if (absl::Status s = ValidatePrivacy(); !s.ok()) return s;
  if (epochs < 1) return Bad("epochs", "must be at least 1");
  if (batch_size < 1) return Bad("batch_size", "must be at least 1");
  if (optimizer != "adadelta" && optimizer != "sgd" &&
      optimizer != "momentum" && optimizer != "adam") {
    return Bad("optimizer", "must be adadelta, sgd, momentum or adam");
  }
  if (!(learning_rate > 0)) return Bad("learning_rate", "must be > 0");
  if (!(input_std >= 0) || !std::isfinite(input_std) ||
      !std::isfinite(input_mean)) {
    return Bad("input_norm", "needs a finite mean and a std >= 0");
  }
  if (!(validation_fraction >= 0 && validation_fraction < 1)) {
    return Bad("validation_fraction", "must be in [0, 1)");
  }
  if (max_clients < 1) return Bad("max_clients", "must be at least 1");
  if (history_in_memory < 1) {
    return Bad("history_in_memory", "must be at least 1");
  }
  if (poll_timeout <= absl::ZeroDuration())
    return Bad("poll_timeout", "must be > 0");
  if (client_timeout <= absl::ZeroDuration())
    return Bad("client_timeout", "must be > 0");
  if (ForgetAfter() < client_timeout) {
    return Bad("forget_after",
               "must be 0 (never) or at least --client_timeout");
  }
  if (max_concurrent_updates < 1)
    return Bad("max_concurrent_updates", "must be at least 1");
  if (stall_timeout <= absl::ZeroDuration())
    return Bad("stall_timeout", "must be > 0");
  if (!(min_upload_rate >= 0) || !std::isfinite(min_upload_rate))
    return Bad("min_upload_rate", "must be a number of bytes/s >= 0");
  if (absl::Status s = GrpcMemoryBytes().status(); !s.ok()) return s;
  if (chunk_bytes < 1024 || static_cast<size_t>(chunk_bytes) > kMaxChunkBytes) {
    return Bad("chunk_bytes", "must be in [1024, 1048576]");
  }
  return absl::OkStatus();
}

absl::Status CoordinatorOptions::ValidatePrivacy() const {
  if (!(dp_noise_multiplier >= 0 && std::isfinite(dp_noise_multiplier))) {
    return Bad("dp_noise_multiplier", "must be >= 0 (0: no DP)");
  }
  if (!(dp_clip_norm >= 0 && std::isfinite(dp_clip_norm))) {
    return Bad("dp_clip_norm", "must be >= 0");
  }
  if (!(dp_delta > 0 && dp_delta < 1)) {
    return Bad("dp_delta", "must be in (0, 1)");
  }
  if (!(dp_max_epsilon >= 0 && std::isfinite(dp_max_epsilon))) {
    return Bad("dp_max_epsilon", "must be >= 0 (0: no budget)");
  }
  if (!(dp_target_quantile >= 0 && dp_target_quantile < 1)) {
    return Bad("dp_target_quantile", "must be in [0, 1) (0: a fixed clip)");
  }
  if (!(dp_clip_learning_rate > 0 && std::isfinite(dp_clip_learning_rate))) {
    return Bad("dp_clip_learning_rate", "must be > 0");
  }
  if (!(dp_clipped_count_stddev >= 0 &&
        std::isfinite(dp_clipped_count_stddev))) {
    return Bad("dp_clipped_count_stddev", "must be >= 0");
  }
  const DpParams dp = Privacy();
  if (dp_target_quantile > 0 && !dp.enabled()) {
    return Bad("dp_target_quantile", "needs --dp_noise_multiplier > 0");
  }
  if (dp_clipped_count_stddev > 0 &&
      !DpParams::CountStddevFits(dp_clipped_count_stddev,
                                 dp_noise_multiplier)) {
    return Bad("dp_clipped_count_stddev",
               "must exceed --dp_noise_multiplier / 2: the count's noise is "
               "part of the round's (server/privacy/dp_params.h)");
  }
  if (!dp.enabled()) {
    if (dp_clip_norm > 0) {
      return Bad("dp_clip_norm",
                 "without --dp_noise_multiplier gives no privacy; to clip "
                 "alone use --strategy_config='clip_norm: C'");
    }
    if (dp_max_epsilon > 0) {
      return Bad("dp_max_epsilon", "needs --dp_noise_multiplier > 0");
    }
    return absl::OkStatus();
  }
  if (!(dp_clip_norm > 0)) {
    return Bad("dp_noise_multiplier",
               "needs --dp_clip_norm > 0: the noise is scaled to the clip");
  }
  if (mode != Mode::kRounds) {
    return Bad("dp_noise_multiplier",
               "central DP needs --mode=rounds: its accounting is for rounds "
               "that sample clients at random, which async versions do not");
  }
  return absl::OkStatus();
}

DpParams CoordinatorOptions::Privacy() const {
  DpParams dp;
  dp.clip_norm = dp_clip_norm;
  dp.noise_multiplier = dp_noise_multiplier;
  dp.target_quantile = dp_target_quantile;
  dp.clip_learning_rate = dp_clip_learning_rate;
  dp.clipped_count_stddev = dp_clipped_count_stddev;
  return dp;
}

absl::StatusOr<AggregationBudget> CoordinatorOptions::Budget() const {
  AggregationBudget budget;
  FEDLEARN_ASSIGN_OR_RETURN(
      budget.memory_bytes,
      ParseBytes("aggregation_memory", aggregation_memory));
  if (aggregation_spill_dir == "none") {
    budget.spill_dir.clear();
  } else if (!aggregation_spill_dir.empty()) {
    budget.spill_dir = aggregation_spill_dir;
  } else if (!state_dir.empty()) {
    budget.spill_dir = absl::StrCat(state_dir, "/spill");
  } else {
    const char* tmp = std::getenv("TMPDIR");
    budget.spill_dir = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  return budget;
}

absl::StatusOr<size_t> CoordinatorOptions::GrpcMemoryBytes() const {
  if (grpc_memory == "auto") {
    return (size_t{256} << 20) + static_cast<size_t>(max_clients) * (16 << 10);
  }
  FEDLEARN_ASSIGN_OR_RETURN(const size_t bytes,
                            ParseBytes("grpc_memory", grpc_memory));
  if (bytes == 0) return Bad("grpc_memory", "must be more than 0 (or auto)");
  return bytes;
}

v1::TrainingPlan CoordinatorOptions::Plan() const {
  v1::TrainingPlan plan;
  plan.set_epochs(epochs);
  plan.set_batch_size(batch_size);
  plan.set_optimizer(optimizer);
  plan.set_learning_rate(static_cast<float>(learning_rate));
  plan.set_validation_fraction(static_cast<float>(validation_fraction));
  plan.set_seed(seed);
  plan.set_input_mean(static_cast<float>(input_mean));
  plan.set_input_std(static_cast<float>(input_std));
  plan.set_reset_optimizer(reset_client_optimizer);
  return plan;
}

absl::string_view ModeName(Mode mode) {
  return mode == Mode::kAsync ? "async" : "rounds";
}

absl::Status ParseMode(absl::string_view text, CoordinatorOptions* options) {
  if (text == ModeName(Mode::kRounds)) {
    options->mode = Mode::kRounds;
  } else if (text == ModeName(Mode::kAsync)) {
    options->mode = Mode::kAsync;
  } else {
    return Bad("mode",
               absl::StrCat("\"", text, "\": expected rounds or async"));
  }
  return absl::OkStatus();
}

absl::Status ParseInputNorm(absl::string_view text,
                            CoordinatorOptions* options) {
  double mean = 0, std = 0;
  if (text == "mnist") {
    mean = 0.1307;
    std = 0.3081;
  } else if (text == "fashion-mnist") {
    mean = 0.2860;
    std = 0.3530;
  } else if (text != "none") {
    const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
    if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &mean) ||
        !absl::SimpleAtod(parts[1], &std) || !(std > 0) ||
        !std::isfinite(mean) || !std::isfinite(std)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input_norm=", text,
                       ": expected mnist, fashion-mnist, none or MEAN,STD "
                       "with STD > 0"));
    }
  }
  options->input_mean = mean;
  options->input_std = std;
  return absl::OkStatus();
}

}  // namespace fedlearn
