#include "server/strategy/strategy.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "server/strategy/dp_mean_aggregator.h"
#include "server/strategy/robust_aggregator.h"

namespace fedlearn {
namespace {

namespace pb = google::protobuf;

enum class Kind { kSgd, kMomentum, kAdaptive };
enum class Aggregation { kMean, kMedian, kTrimmedMean, kKrum };

// One row per strategy: its optimizer and the defaults of the knobs it uses.
// A knob without a default here is not one the strategy uses.
struct Row {
  const char* name;
  Kind kind;
  AdaptiveServerOptimizer::Rule rule;
  v1::StrategyConfig defaults;
  Aggregation aggregation = Aggregation::kMean;
};

v1::StrategyConfig Defaults(double lr, double mu) {
  v1::StrategyConfig c;
  c.set_server_learning_rate(lr);
  c.set_proximal_mu(mu);
  c.set_clip_norm(0);
  return c;
}

v1::StrategyConfig AdaptiveDefaults(double lr, bool beta_2) {
  v1::StrategyConfig c = Defaults(lr, 0);
  c.set_beta_1(0.9);
  if (beta_2) c.set_beta_2(0.99);
  c.set_tau(1e-3);
  c.set_bias_correction(false);
  return c;
}

const std::vector<Row>& Rows() {
  using Rule = AdaptiveServerOptimizer::Rule;
  static const auto* rows = [] {
    v1::StrategyConfig momentum = Defaults(1.0, 0);
    momentum.set_server_momentum(0.9);
    v1::StrategyConfig trimmed = Defaults(1.0, 0);
    trimmed.set_trim_beta(0.2);
    v1::StrategyConfig krum = Defaults(1.0, 0);
    krum.set_num_byzantine(1);
    v1::StrategyConfig multikrum = krum;
    multikrum.set_num_to_select(0);
    return new std::vector<Row>{
        {"fedavg", Kind::kSgd, Rule::kAdam, Defaults(1.0, 0)},
        {"fedprox", Kind::kSgd, Rule::kAdam, Defaults(1.0, 0.01)},
        {"fedavgm", Kind::kMomentum, Rule::kAdam, momentum},
        {"fedadam", Kind::kAdaptive, Rule::kAdam, AdaptiveDefaults(0.01, true)},
        {"fedyogi", Kind::kAdaptive, Rule::kYogi, AdaptiveDefaults(0.01, true)},
        {"fedadagrad", Kind::kAdaptive, Rule::kAdagrad,
         AdaptiveDefaults(0.1, false)},
        {"fedmedian", Kind::kSgd, Rule::kAdam, Defaults(1.0, 0),
         Aggregation::kMedian},
        {"fedtrimmedavg", Kind::kSgd, Rule::kAdam, trimmed,
         Aggregation::kTrimmedMean},
        {"krum", Kind::kSgd, Rule::kAdam, krum, Aggregation::kKrum},
        {"multikrum", Kind::kSgd, Rule::kAdam, multikrum, Aggregation::kKrum},
    };
  }();
  return *rows;
}

const Row* FindRow(absl::string_view name) {
  for (const Row& row : Rows()) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

// Keeps the parser's first error for the message (instead of its log line).
class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty())
      first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

absl::Status Bad(absl::string_view knob, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("--strategy_config: ", knob, " ", why));
}

// The range checks, one per knob.
absl::Status CheckKnobs(const v1::StrategyConfig& c) {
  if (!(c.server_learning_rate() > 0 &&
        std::isfinite(c.server_learning_rate())))
    return Bad("server_learning_rate", "must be > 0");
  if (c.has_server_momentum() &&
      !(c.server_momentum() >= 0 && c.server_momentum() < 1))
    return Bad("server_momentum", "must be in [0, 1)");
  if (c.has_beta_1() && !(c.beta_1() >= 0 && c.beta_1() < 1))
    return Bad("beta_1", "must be in [0, 1)");
  if (c.has_beta_2() && !(c.beta_2() >= 0 && c.beta_2() < 1))
    return Bad("beta_2", "must be in [0, 1)");
  if (c.has_tau() && !(c.tau() > 0 && std::isfinite(c.tau())))
    return Bad("tau", "must be > 0");
  if (!(c.proximal_mu() >= 0 && std::isfinite(c.proximal_mu())))
    return Bad("proximal_mu", "must be >= 0");
  if (!(c.clip_norm() >= 0 && std::isfinite(c.clip_norm())))
    return Bad("clip_norm", "must be >= 0 (0: no clipping)");
  if (c.has_trim_beta() && !(c.trim_beta() >= 0 && c.trim_beta() < 0.5))
    return Bad("trim_beta", "must be in [0, 0.5)");
  if (c.num_byzantine() < 0) return Bad("num_byzantine", "must be >= 0");
  if (c.num_to_select() < 0)
    return Bad("num_to_select", "must be >= 0 (0: n - num_byzantine)");
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& StrategyNames() {
  static const auto* names = [] {
    auto* n = new std::vector<std::string>();
    for (const Row& row : Rows()) n->push_back(row.name);
    return n;
  }();
  return *names;
}

absl::StatusOr<v1::StrategyConfig> ResolveStrategy(
    absl::string_view name, const v1::StrategyConfig& config) {
  const Row* row = FindRow(name);
  if (row == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--strategy: \"", name, "\": expected one of ",
                     absl::StrJoin(StrategyNames(), ", ")));
  }
  // Every knob given must be one the strategy uses: those are exactly the
  // fields its defaults set.
  const pb::Descriptor* descriptor = v1::StrategyConfig::descriptor();
  const pb::Reflection* reflection = v1::StrategyConfig::GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const pb::FieldDescriptor* field = descriptor->field(i);
    if (reflection->HasField(config, field) &&
        !reflection->HasField(row->defaults, field)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--strategy_config: ", field->name(),
                       " does not apply to --strategy=", name));
    }
  }
  v1::StrategyConfig resolved = row->defaults;
  resolved.MergeFrom(config);
  if (absl::Status s = CheckKnobs(resolved); !s.ok()) return s;
  return resolved;
}

absl::StatusOr<Strategy> MakeStrategy(absl::string_view name,
                                      const v1::StrategyConfig& config,
                                      size_t num_parameters,
                                      const AggregationBudget& budget,
                                      const DpParams& dp) {
  absl::StatusOr<v1::StrategyConfig> resolved = ResolveStrategy(name, config);
  if (!resolved.ok()) return resolved.status();
  const Row& row = *FindRow(name);
  const v1::StrategyConfig& c = *resolved;
  if (dp.enabled() && row.aggregation != Aggregation::kMean) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dp_noise_multiplier: central DP is built on the mean of clipped "
        "updates, not on --strategy=",
        name,
        "'s rule (whose sensitivity to one client the noise would not "
        "cover): use fedavg, fedprox, fedavgm, fedadam, fedyogi or "
        "fedadagrad"));
  }
  if (dp.enabled() && c.clip_norm() > 0) {
    return absl::InvalidArgumentError(
        "--strategy_config: clip_norm with --dp_noise_multiplier: DP clips "
        "every update to --dp_clip_norm; give that one only");
  }
  Strategy strategy;
  strategy.name = std::string(name);
  strategy.config = c;
  strategy.dp = dp;
  // DP clips in its aggregator's Stage, to the step's C.
  if (c.clip_norm() > 0) {
    strategy.transforms.push_back(std::make_unique<ClipToNorm>(c.clip_norm()));
  }
  UpdateStore::Options store;
  store.num_parameters = num_parameters;
  store.memory_budget = budget.memory_bytes;
  store.spill_dir = budget.spill_dir;
  switch (row.aggregation) {
    case Aggregation::kMean:
      if (dp.enabled()) {
        auto aggregator =
            std::make_unique<DpMeanAggregator>(num_parameters, dp);
        strategy.dp_aggregator = aggregator.get();
        strategy.aggregator = std::move(aggregator);
      } else {
        strategy.aggregator =
            std::make_unique<WeightedMeanAggregator>(num_parameters);
      }
      break;
    case Aggregation::kMedian:
      strategy.aggregator = std::make_unique<MedianAggregator>(store);
      break;
    case Aggregation::kTrimmedMean:
      strategy.aggregator =
          std::make_unique<TrimmedMeanAggregator>(store, c.trim_beta());
      break;
    case Aggregation::kKrum: {
      const int f = c.num_byzantine();
      const int m = name == "krum" ? 1 : c.num_to_select();
      strategy.aggregator = std::make_unique<KrumAggregator>(store, f, m);
      // Blanchard et al.: n >= 2f + 3, and m <= n - f.
      strategy.min_updates = std::max(2 * f + 3, m + f);
      break;
    }
  }
  switch (row.kind) {
    case Kind::kSgd:
      strategy.optimizer = std::make_unique<SgdServerOptimizer>(
          num_parameters, c.server_learning_rate(), 0.0);
      break;
    case Kind::kMomentum:
      strategy.optimizer = std::make_unique<SgdServerOptimizer>(
          num_parameters, c.server_learning_rate(), c.server_momentum());
      break;
    case Kind::kAdaptive: {
      AdaptiveServerOptimizer::Params p;
      p.rule = row.rule;
      p.learning_rate = c.server_learning_rate();
      p.beta_1 = c.beta_1();
      p.beta_2 = c.has_beta_2() ? c.beta_2() : 0.0;
      p.tau = c.tau();
      p.bias_correction = c.bias_correction();
      strategy.optimizer =
          std::make_unique<AdaptiveServerOptimizer>(num_parameters, p);
      break;
    }
  }
  return strategy;
}

absl::StatusOr<v1::StrategyConfig> ParseStrategyConfig(absl::string_view text) {
  std::string body(text);
  std::string where = "--strategy_config";
  std::error_code error;
  if (!body.empty() && std::filesystem::is_regular_file(body, error)) {
    absl::StatusOr<std::string> file = ReadFileToString(body);
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat(where, "=", body, ": ", file.status().message()));
    }
    where = absl::StrCat(where, "=", body);
    body = *std::move(file);
  }
  v1::StrategyConfig config;
  pb::TextFormat::Parser parser;
  FirstError parse_error;
  parser.RecordErrorsTo(&parse_error);
  if (!parser.ParseFromString(body, &config)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ":", parse_error.first(),
        " (expected a fedlearn.v1.StrategyConfig in text format, e.g. "
        "\"server_learning_rate: 0.1 beta_1: 0.9\", or a file holding one)"));
  }
  return config;
}

}  // namespace fedlearn
