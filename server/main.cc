// fedlearn-coordinator: serves fedlearn.v1.Coordinator until the run is DONE
// (and every live client has been told so) or until SIGINT/SIGTERM.

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
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

ABSL_FLAG(
    std::string, config, "",
    "options in protobuf text format, a fedlearn.v1.CoordinatorConfig: one "
    "`flag_name: value` per line, any flag below (--config_schema "
    "prints the message); flags given on the command line win");
ABSL_FLAG(int, port, 50051, "gRPC port (0 picks a free one)");
ABSL_FLAG(std::string, bind, "0.0.0.0", "address the gRPC port listens on");
ABSL_FLAG(int, http_port, 8080,
          "dashboard, /api and /metrics port (0 picks a free one, -1: off)");
ABSL_FLAG(std::string, http_bind, "127.0.0.1",
          "address the HTTP port listens on (0.0.0.0 opens it to the network)");
ABSL_FLAG(std::string, mode, "rounds",
          "rounds (synchronous FedAvg rounds) or async (a parameter server "
          "applying every update as it arrives, scaled by its staleness)");
ABSL_FLAG(std::string, strategy_config, "",
          "the strategy's knobs, a fedlearn.v1.StrategyConfig in text format "
          "(proto/fedlearn/v1/config.proto), inline (\"server_learning_rate: "
          "0.1 beta_1: 0.9\") or in a file; knobs left out take the "
          "strategy's defaults");
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
#define FEDLEARN_OPTION(type, name, default_value, help) \
  ABSL_FLAG(type, name, default_value, help);
#include "server/options.inc"
#undef FEDLEARN_OPTION
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
#define FEDLEARN_OPTION(type, name, default_value, help) \
  o.name = absl::GetFlag(FLAGS_##name);
#include "server/options.inc"
#undef FEDLEARN_OPTION
  if (const std::string text = absl::GetFlag(FLAGS_strategy_config);
      !text.empty()) {
    absl::StatusOr<v1::StrategyConfig> config = ParseStrategyConfig(text);
    if (!config.ok()) return config.status();
    o.strategy_config = *std::move(config);
  }
  return o;
}

// Model-sized blocks come and go every round: a version's serialized chunks,
// the strategy's buffers (the global weights themselves reuse two buffers, see
// RunController). glibc serves blocks
// above its mmap threshold (128 KiB at first, raised as such blocks are freed,
// at most 32 MiB) with fresh mappings, and gives a freed heap top above its
// trim threshold back to the system; either way the next round faults every
// page in again. On a KVM guest that was about a third of the coordinator's
// time while it received uploads. So blocks up to the model's size (plus
// 1 MiB) come from the heap, and up to four models' worth of free heap (at
// least 64 MiB, at most 1 GiB) is kept for reuse instead of returned: freed
// memory the process keeps, on top of its peak use.
void KeepModelSizedBlocksOnTheHeap(int64_t model_bytes) {
  constexpr int64_t kMaxMmapThreshold = int64_t{32} << 20;  // glibc's limit
  const int64_t mmap_threshold = std::clamp<int64_t>(
      model_bytes + (int64_t{1} << 20), 128 << 10, kMaxMmapThreshold);
  const int64_t trim_threshold =
      std::clamp<int64_t>(4 * model_bytes, int64_t{64} << 20, int64_t{1} << 30);
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) != 1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) != 1) {
    Logf(
        "could not tune malloc for %lld-byte models; running with its "
        "defaults",
        static_cast<long long>(model_bytes));
  }
}

int Run() {
  // Signals are taken synchronously by this thread (sigtimedwait below).
  const sigset_t signals = BlockTerminationSignals();
  // The run logs under its lock (a join, an update, a round's close): a
  // reader of stderr that stalls must not stall every client with it.
  BackgroundLog log;

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
  // An undersized quota shows up as streams cancelled with ENHANCE_YOUR_CALM,
  // so say what it is.
  Logf("gRPC may hold up to %zu MiB (--grpc_memory)",
       (*server)->grpc_memory_bytes() >> 20);
  RunController& controller = (*server)->controller();
  KeepModelSizedBlocksOnTheHeap(controller.spec().num_parameters * 4);
  std::unique_ptr<HttpServer> http;
  if (const int http_port = absl::GetFlag(FLAGS_http_port); http_port >= 0) {
    const std::string host = absl::GetFlag(FLAGS_http_bind);
    // With TLS on, the dashboard and /metrics are served over HTTPS with the
    // same certificate (client certificates are not asked for there).
    auto started = HttpServer::Start(
        **server, host, http_port,
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
  const absl::Duration done_grace = absl::GetFlag(FLAGS_done_grace);
  // A run that was DONE when this process resumed it knows none of its
  // clients, but an agent that missed DONE to the crash comes back within its
  // backoff: it is served for the whole grace, each comer told DONE.
  const bool done_at_start = controller.phase() == v1::PHASE_DONE;
  const absl::Time serve_until = absl::Now() + done_grace;
  if (exit_on_done && done_at_start) {
    Logf(
        "the run was done before this start: telling clients that come back "
        "DONE for %s (--done_grace), then exiting",
        absl::FormatDuration(done_grace));
  }
  int exit_code = 0;
  for (;;) {
    const timespec tick = {0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      Logf("signal %d: shutting down", sig);
      exit_code = sig == SIGTERM ? 0 : 128 + sig;
      break;
    }
    if (exit_on_done && done_at_start) {
      if (absl::Now() < serve_until) continue;
      break;
    }
    if (exit_on_done && controller.phase() == v1::PHASE_DONE) {
      if (!controller.AwaitClientsDone(done_grace)) {
        Logf("some clients were not told DONE within %s",
             absl::FormatDuration(done_grace));
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
      fedlearn::ConfigSchema{
          "fedlearn.v1.CoordinatorConfig",
          {{"strategy_config", fedlearn::v1::StrategyConfig::descriptor()}}});
  return fedlearn::Run();
}
