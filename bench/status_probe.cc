// status_probe: how long a user waits for the coordinator's status while a
// benchmark loads it. Every --interval it calls GetStatus over gRPC and then
// GET /metrics over HTTP, and files each latency under the phase the
// GetStatus reply names: "idle" while the coordinator waits for clients,
// "rounds" while it trains or evaluates (other phases are not counted).
// Runs until its standard input closes, then prints one line per phase and
// call (p50, p99, count) and last `probe_errors=<failed calls>`.
//
// bench/swarm starts it as a process of its own: a prober thread inside the
// swarm's process waited for the swarm's own threads, busy with thousands of
// streams, and reported the coordinator 1 s slower than a separate process
// saw it.

#include <grpcpp/create_channel.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/process_stats.h"
#include "common/flags.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "coordinator address");
ABSL_FLAG(int, http_port, 8080, "the coordinator's HTTP port (/metrics)");
ABSL_FLAG(absl::Duration, interval, absl::Milliseconds(100),
          "pause between one GetStatus + /metrics pair and the next");

namespace fedlearn {
namespace {

const char* Label(v1::Phase phase) {
  switch (phase) {
    case v1::PHASE_WAITING_FOR_CLIENTS:
      return "idle";
    case v1::PHASE_TRAINING:
    case v1::PHASE_EVALUATING:
      return "rounds";
    default:
      return nullptr;
  }
}

int Run() {
  std::atomic<bool> stop{false};
  // Standard input closing is the signal to report.
  std::thread watcher([&stop] {
    char byte;
    while (read(STDIN_FILENO, &byte, 1) > 0) {
    }
    stop = true;
  });
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateCustomChannel(absl::GetFlag(FLAGS_coordinator),
                                grpc::InsecureChannelCredentials(), args));
  httplib::Client http("127.0.0.1", absl::GetFlag(FLAGS_http_port));
  http.set_read_timeout(30, 0);

  std::map<std::string, std::vector<double>> samples;
  int errors = 0;
  while (!stop.load()) {
    absl::Time t0 = absl::Now();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(t0 + absl::Seconds(30)));
    v1::GetStatusResponse status;
    const bool status_ok =
        stub->GetStatus(&context, v1::GetStatusRequest(), &status).ok();
    const double status_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    t0 = absl::Now();
    auto metrics = http.Get("/metrics");
    const bool metrics_ok = metrics && metrics->status == 200;
    const double metrics_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    if (!status_ok || !metrics_ok) ++errors;
    if (const char* label = status_ok ? Label(status.phase()) : nullptr) {
      samples[absl::StrCat(label, " GetStatus")].push_back(status_ms);
      if (metrics_ok) {
        samples[absl::StrCat(label, " /metrics")].push_back(metrics_ms);
      }
    }
    absl::SleepFor(absl::GetFlag(FLAGS_interval));
  }
  watcher.join();
  for (const auto& [label, v] : samples) {
    const Percentiles p = Of(v);
    std::printf("%-20s p50 %7.2f ms  p99 %7.2f ms  (%zu calls)\n",
                label.c_str(), p.p50, p.p99, p.n);
  }
  std::printf("probe_errors=%d\n", errors);
  return 0;
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  fedlearn::ParseFlags(argc, argv,
                       "status_probe --coordinator=HOST:PORT --http_port=N  "
                       "(until stdin closes)");
  return fedlearn::Run();
}
