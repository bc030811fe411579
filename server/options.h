#ifndef FEDLEARN_SERVER_OPTIONS_H_
#define FEDLEARN_SERVER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fedlearn/v1/config.pb.h"
#include "fedlearn/v1/coordinator.pb.h"

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
// The defaults are the seed's: 2 clients, 50 rounds, validation every 2 rounds,
// tolerance 0.3, convergence at 1%, E=1, B=10, Adadelta.
struct CoordinatorOptions {
  // Model and its initialisation.
  std::string model = "mnist_cnn";
  uint64_t seed = 1;

  Mode mode = Mode::kRounds;

  // Round rules (README, "Round lifecycle").
  int min_clients = 2;
  int clients_per_round = 0;  // 0: use `fraction` of the ready clients
  double fraction = 1.0;
  double over_selection = 1.0;  // sample this many times the clients needed
  double tolerance = 0.3;       // share of the selected that may stay silent
  absl::Duration round_timeout = absl::Minutes(5);
  absl::Duration eval_timeout = absl::Minutes(5);
  int max_rounds = 50;
  int rounds_between_validations = 2;
  // Converged when the aggregated train loss improves by less than this
  // fraction: 0 stops only on a rising loss, a negative value tolerates some
  // rise, -inf never converges.
  double convergence_threshold = 0.01;

  // Async mode (README, "Async mode"): an update trained from the model of
  // `s` applied updates ago is applied as
  //   global += mixing * (1 + s)^-staleness_exponent * delta,
  // where mixing is async_mixing, or 1 / min_clients when that is 0 (N clients
  // training at once then move the model at most as far as one FedAvg round,
  // less as staleness scales them down), and rejected (FAILED_PRECONDITION)
  // when s > max_staleness (0: no limit). max_rounds counts applied updates;
  // the convergence test compares the mean train loss of consecutive windows
  // of as many updates as alive clients (at least min_clients).
  double async_mixing = 0;
  double staleness_exponent = 0.5;
  int max_staleness = 0;
  // Async mode: a new model version every `async_buffer` accepted updates
  // (FedBuff); 1 applies each update as it arrives. max_rounds then counts
  // versions.
  int async_buffer = 1;

  // The strategy (server/strategy/strategy.h): its name and its knobs, those
  // not set taking the strategy's defaults.
  std::string strategy = "fedavg";
  v1::StrategyConfig strategy_config;

  // Training plan sent to every client.
  int epochs = 1;
  int batch_size = 10;
  std::string optimizer = "adadelta";
  double learning_rate = 1.0;
  double validation_fraction = 0.1;
  // Clients start every round with a fresh optimizer state (else they keep
  // theirs across rounds).
  bool reset_client_optimizer = false;
  // Input standardisation (TrainingPlan.input_mean/std); input_std 0: p / 255.
  // The default is MNIST's pixel statistics.
  double input_mean = 0.1307;
  double input_std = 0.3081;

  // Where the run is saved after every aggregation, and resumed from on a
  // restart (server/state_store.h). Empty: nothing is saved.
  std::string state_dir;

  // Clients and limits.
  std::string join_token;  // empty: anyone may join
  int max_clients = 10000;
  absl::Duration poll_timeout =
      absl::Seconds(30);  // longest a poll is held open
  // Silent this long (no call, no heartbeat, no poll held open): gone. Agents
  // heartbeat every --heartbeat_interval while training and hold a poll open
  // otherwise.
  absl::Duration client_timeout = absl::Seconds(20);
  absl::Duration heartbeat_interval = absl::Seconds(5);  // suggested to clients
  int max_concurrent_updates =
      2;  // updates received at once (each holds one model)
  size_t chunk_bytes = size_t{64}
                       << 10;  // payload per chunk the coordinator sends

  // async_mixing, with 0 resolved to 1 / min_clients.
  double AsyncMixing() const {
    return async_mixing > 0 ? async_mixing : 1.0 / min_clients;
  }

  // Checks ranges and combinations; INVALID_ARGUMENT naming the flag.
  absl::Status Validate() const;

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
