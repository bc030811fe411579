// fedlearn-coordinator: serves fedlearn.v1.Coordinator until the run is DONE
// (and every live client has been told so) or until SIGINT/SIGTERM.

#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/tls.h"
#include "fedlearn/v1/config.pb.h"
#include "server/coordinator_server.h"
#include "server/http_server.h"
#include "server/run_controller.h"
#include "server/strategy/strategy.h"

ABSL_FLAG(std::string, config, "",
          "options in protobuf text format, a fedlearn.v1.CoordinatorConfig "
          "(proto/fedlearn/v1/config.proto): one `flag_name: value` per "
          "line; flags given on the command line win");
ABSL_FLAG(int, port, 50051, "gRPC port (0 picks a free one)");
ABSL_FLAG(std::string, bind, "0.0.0.0", "address the gRPC port listens on");
ABSL_FLAG(int, http_port, 8080,
          "dashboard, /api and /metrics port (0 picks a free one, -1: off)");
ABSL_FLAG(std::string, http_bind, "127.0.0.1",
          "address the HTTP port listens on (0.0.0.0 opens it to the network)");
ABSL_FLAG(std::string, mode, "rounds",
          "rounds (synchronous FedAvg rounds) or async (a parameter server "
          "applying every update as it arrives, scaled by its staleness)");
ABSL_FLAG(double, async_mixing, 0,
          "async mode: share of a fresh update applied to the global model "
          "(0: 1 / --min_clients)");
ABSL_FLAG(double, staleness_exponent, 0.5,
          "async mode: an update s updates stale is scaled by (1+s)^-this");
ABSL_FLAG(int, max_staleness, 0,
          "async mode: updates staler than this are rejected (0: no limit)");
ABSL_FLAG(int, async_buffer, 1,
          "async mode: a new model version every K accepted updates "
          "(FedBuff; 1: every update as it arrives)");
ABSL_FLAG(std::string, strategy, "fedavg",
          "fedavg, fedavgm, fedadam, fedyogi, fedadagrad or fedprox (FedAvg "
          "with a proximal term)");
ABSL_FLAG(std::string, strategy_config, "",
          "the strategy's knobs, a fedlearn.v1.StrategyConfig in text format "
          "(proto/fedlearn/v1/config.proto), inline (\"server_learning_rate: "
          "0.1 beta_1: 0.9\") or in a file; knobs left out take the "
          "strategy's defaults");
ABSL_FLAG(std::string, model, "mnist_cnn",
          "model: mnist_cnn, fedavg_cnn, mlp_2nn, or PATH.safetensors (its "
          "float32 tensors are the model and its initial weights)");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of the initial weights and of client sampling");
ABSL_FLAG(int, min_clients, 2,
          "clients that must have joined before training starts");
ABSL_FLAG(int, clients_per_round, 0,
          "clients sampled per round (0: use --fraction)");
ABSL_FLAG(double, fraction, 1.0,
          "share of the ready clients sampled per round");
ABSL_FLAG(double, over_selection, 1.0,
          "sample this many times the clients needed (e.g. 1.3)");
ABSL_FLAG(double, tolerance, 0.3,
          "share of the selected clients that may stay silent");
ABSL_FLAG(absl::Duration, round_timeout, absl::Minutes(5),
          "a round below quorum at this deadline is abandoned and retried");
ABSL_FLAG(absl::Duration, eval_timeout, absl::Minutes(5),
          "deadline of an evaluation attempt");
ABSL_FLAG(int, max_rounds, 50,
          "training stops after this many rounds (async mode: applied "
          "updates)");
ABSL_FLAG(int, rounds_between_validations, 2,
          "validate every N rounds (0: never)");
ABSL_FLAG(double, convergence_threshold, 0.01,
          "stop when the train loss improves by less than this fraction");
ABSL_FLAG(int, epochs, 1, "training plan: local epochs per round");
ABSL_FLAG(int, batch_size, 10, "training plan: local batch size");
ABSL_FLAG(std::string, optimizer, "adadelta",
          "training plan: adadelta, sgd, momentum or adam");
ABSL_FLAG(double, learning_rate, 1.0, "training plan: learning rate");
ABSL_FLAG(bool, reset_client_optimizer, false,
          "training plan: clients start every round with a fresh optimizer "
          "state (false: they keep theirs across rounds)");
ABSL_FLAG(
    double, validation_fraction, 0.1,
    "training plan: share of local training data held out for validation");
ABSL_FLAG(std::string, state_dir, "",
          "save the run here after every aggregation (async mode: every "
          "window of updates) and resume from it on restart (empty: not "
          "saved)");
ABSL_FLAG(std::string, input_norm, "mnist",
          "training plan: input standardisation, (p/255 - mean) / std: mnist "
          "(0.1307,0.3081), fashion-mnist (0.2860,0.3530), MEAN,STD, or none "
          "(p/255)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve gRPC, and the dashboard as HTTPS, "
          "over TLS (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA that client certificates must chain to: mutual TLS");
ABSL_FLAG(std::string, join_token, "",
          "secret a client must present to join (empty: none)");
ABSL_FLAG(int, max_clients, 10000, "most clients that may join");
ABSL_FLAG(absl::Duration, poll_timeout, absl::Seconds(30),
          "longest a poll is held open");
ABSL_FLAG(absl::Duration, client_timeout, absl::Seconds(20),
          "a client silent this long is gone");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(5),
          "heartbeat interval suggested to clients");
ABSL_FLAG(int, max_concurrent_updates, 2,
          "updates received at once; each holds a model-sized buffer");
ABSL_FLAG(int, chunk_bytes, 64 << 10,
          "payload bytes per chunk the coordinator sends");
ABSL_FLAG(bool, exit_on_done, true,
          "exit once the run is DONE and clients were told");
ABSL_FLAG(absl::Duration, done_grace, absl::Seconds(10),
          "after DONE, how long to wait for clients to be told before exiting");

namespace fedlearn {
namespace {

absl::StatusOr<CoordinatorOptions> OptionsFromFlags() {
  CoordinatorOptions o;
  if (absl::Status s = ParseInputNorm(absl::GetFlag(FLAGS_input_norm), &o);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ParseMode(absl::GetFlag(FLAGS_mode), &o); !s.ok()) {
    return s;
  }
  o.async_mixing = absl::GetFlag(FLAGS_async_mixing);
  o.staleness_exponent = absl::GetFlag(FLAGS_staleness_exponent);
  o.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  o.async_buffer = absl::GetFlag(FLAGS_async_buffer);
  o.strategy = absl::GetFlag(FLAGS_strategy);
  if (const std::string text = absl::GetFlag(FLAGS_strategy_config);
      !text.empty()) {
    absl::StatusOr<v1::StrategyConfig> config = ParseStrategyConfig(text);
    if (!config.ok()) return config.status();
    o.strategy_config = *std::move(config);
  }
  o.model = absl::GetFlag(FLAGS_model);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.min_clients = absl::GetFlag(FLAGS_min_clients);
  o.clients_per_round = absl::GetFlag(FLAGS_clients_per_round);
  o.fraction = absl::GetFlag(FLAGS_fraction);
  o.over_selection = absl::GetFlag(FLAGS_over_selection);
  o.tolerance = absl::GetFlag(FLAGS_tolerance);
  o.round_timeout = absl::GetFlag(FLAGS_round_timeout);
  o.eval_timeout = absl::GetFlag(FLAGS_eval_timeout);
  o.max_rounds = absl::GetFlag(FLAGS_max_rounds);
  o.rounds_between_validations =
      absl::GetFlag(FLAGS_rounds_between_validations);
  o.convergence_threshold = absl::GetFlag(FLAGS_convergence_threshold);
  o.epochs = absl::GetFlag(FLAGS_epochs);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.learning_rate = absl::GetFlag(FLAGS_learning_rate);
  o.reset_client_optimizer = absl::GetFlag(FLAGS_reset_client_optimizer);
  o.validation_fraction = absl::GetFlag(FLAGS_validation_fraction);
  o.state_dir = absl::GetFlag(FLAGS_state_dir);
  o.join_token = absl::GetFlag(FLAGS_join_token);
  o.max_clients = absl::GetFlag(FLAGS_max_clients);
  o.poll_timeout = absl::GetFlag(FLAGS_poll_timeout);
  o.client_timeout = absl::GetFlag(FLAGS_client_timeout);
  o.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  o.max_concurrent_updates = absl::GetFlag(FLAGS_max_concurrent_updates);
  o.chunk_bytes =
      static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_chunk_bytes)));
  return o;
}

int Run() {
  // Signals are taken synchronously by this thread (sigtimedwait below).
  const sigset_t signals = BlockTerminationSignals();

  const std::string address =
      absl::StrCat(absl::GetFlag(FLAGS_bind), ":", absl::GetFlag(FLAGS_port));
  absl::StatusOr<CoordinatorOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "fedlearn-coordinator: %s\n",
                 options.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials({absl::GetFlag(FLAGS_tls_cert),
                             absl::GetFlag(FLAGS_tls_key),
                             absl::GetFlag(FLAGS_tls_client_ca)});
  if (!credentials.ok()) {
    std::fprintf(stderr, "fedlearn-coordinator: %s\n",
                 credentials.status().ToString().c_str());
    return 2;
  }
  auto server =
      CoordinatorServer::Start(*options, address, *std::move(credentials));
  if (!server.ok()) {
    std::fprintf(stderr, "fedlearn-coordinator: %s\n",
                 server.status().ToString().c_str());
    return 2;
  }
  Logf("listening on %s (port %d)%s", absl::GetFlag(FLAGS_bind),
       (*server)->port(),
       absl::GetFlag(FLAGS_tls_cert).empty()        ? ""
       : absl::GetFlag(FLAGS_tls_client_ca).empty() ? " with TLS"
                                                    : " with mutual TLS");
  RunController& controller = (*server)->controller();
  std::unique_ptr<HttpServer> http;
  if (const int http_port = absl::GetFlag(FLAGS_http_port); http_port >= 0) {
    const std::string host = absl::GetFlag(FLAGS_http_bind);
    // With TLS on, the dashboard and /metrics are served over HTTPS with the
    // same certificate (client certificates are not asked for there).
    auto started = HttpServer::Start(
        &controller, host, http_port,
        {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key)});
    if (!started.ok()) {
      std::fprintf(stderr, "fedlearn-coordinator: %s\n",
                   started.status().ToString().c_str());
      return 2;
    }
    http = *std::move(started);
    Logf("dashboard on %s://%s:%d/ (metrics on /metrics)",
         absl::GetFlag(FLAGS_tls_cert).empty() ? "http" : "https",
         host == "0.0.0.0" ? "127.0.0.1" : host, http->port());
  }
  const bool exit_on_done = absl::GetFlag(FLAGS_exit_on_done);
  int exit_code = 0;
  for (;;) {
    const timespec tick = {0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      Logf("signal %d: shutting down", sig);
      exit_code = sig == SIGTERM ? 0 : 128 + sig;
      break;
    }
    if (exit_on_done && controller.phase() == v1::PHASE_DONE) {
      if (!controller.AwaitClientsDone(absl::GetFlag(FLAGS_done_grace))) {
        Logf("some clients were not told DONE within %s",
             absl::FormatDuration(absl::GetFlag(FLAGS_done_grace)));
      }
      break;
    }
  }
  (*server)->Shutdown(absl::Seconds(2));
  if (http != nullptr) http->Stop();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  Logf("stopped; peak RSS %.1f MB", usage.ru_maxrss / 1024.0);
  return exit_code;
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  fedlearn::ParseFlags(
      argc, argv,
      "fedlearn-coordinator --port=50051 [flags]\n"
      "Serves fedlearn.v1.Coordinator: federated training rounds (FedAvg, "
      "FedProx, FedAvgM, FedAdam, FedYogi, FedAdagrad) or asynchronous "
      "FedBuff over gRPC.",
      fedlearn::v1::CoordinatorConfig::default_instance());
  return fedlearn::Run();
}
