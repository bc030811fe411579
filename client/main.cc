// fedlearn-client: federated-learning agents, each training the coordinator's
// model on its own partition of a local MNIST-format data set, until the
// coordinator says DONE or until SIGINT/SIGTERM. --agents=N runs N of them in
// one process, one thread each, for a single-machine run.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/agent.h"
#include "client/cnn_trainer.h"
#include "client/idx.h"
#include "client/partition.h"
#include "client/progress.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "common/tls.h"

ABSL_FLAG(std::string, config, "",
          "options in protobuf text format, a fedlearn.v1.ClientConfig: one "
          "`flag_name: value` per line, any flag below (--config_schema "
          "prints the message); flags given on the command line win");
ABSL_FLAG(std::string, coordinator, "localhost:50051",
          "address of the coordinator, HOST:PORT");
ABSL_FLAG(std::string, data_dir, "data/mnist",
          "directory with the MNIST-format IDX files train-images-idx3-ubyte, "
          "train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
          "t10k-labels-idx1-ubyte, each possibly gzipped (.gz)");
ABSL_FLAG(std::string, partition, "iid",
          "how the data is dealt out to clients: iid, shards or "
          "dirichlet:ALPHA");
ABSL_FLAG(int, num_partitions, 0,
          "number of partitions the train and test splits are cut into; 0: "
          "--agents");
ABSL_FLAG(int, partition_index, 0,
          "this process's first partition: its agents take partitions "
          "I .. I+agents-1");
ABSL_FLAG(int, agents, 1,
          "agents run by this process, each on its own partition, seed and "
          "thread");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of the partitioning; mixed with each agent's partition, of its "
          "shuffling and dropout");
ABSL_FLAG(std::string, join_token, "",
          "the coordinator's join secret, if it has one");
ABSL_FLAG(absl::Duration, max_backoff, absl::Seconds(10),
          "longest wait between retries while the coordinator is "
          "unreachable; the wait starts at 100ms and doubles, with +-20% "
          "jitter");
ABSL_FLAG(absl::Duration, reconnect_timeout, absl::Minutes(10),
          "give up when the coordinator has not answered for this long; inf: "
          "never");
ABSL_FLAG(absl::Duration, poll_wait, absl::Seconds(30),
          "how long the coordinator may hold this agent's poll open with no "
          "task (it caps this with its --poll_timeout); longer polls cost an "
          "idle coordinator less (README, \"Many clients\")");
ABSL_FLAG(std::string, session_dir, "",
          "keep each agent's client id and session token in DIR/NAME.session, "
          "so that an agent restarted after a crash retires its old identity "
          "at the coordinator instead of leaving it counted alive (empty: not "
          "kept)");
ABSL_FLAG(std::string, name, "",
          "display name; empty: the host name. Each agent appends -pI, I its "
          "partition, unless --name is set and --agents=1");
ABSL_FLAG(bool, tls, false,
          "connect with TLS (the coordinator runs with --tls_cert/--tls_key)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA the coordinator's certificate must chain to (empty: the "
          "system's roots)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of this client, for mutual TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "name the coordinator's certificate must carry (default: the host "
          "of --coordinator)");
ABSL_FLAG(int, threads, 0,
          "compute threads per agent; 0: hardware threads / --agents, at "
          "least 1");
ABSL_FLAG(std::string, update_encoding, "dense",
          "how updates travel: dense (float32) or int8 (one byte per value "
          "and a scale per tensor: a quarter of the upload, each value within "
          "half a step of max|delta| / 127)");
ABSL_FLAG(bool, heartbeat, true,
          "send heartbeats with training progress to the coordinator");
ABSL_FLAG(std::string, progress, "auto",
          "how training progress is shown on stderr: bar (a progress bar per "
          "local epoch; with several agents one combined line), plain (one "
          "log line per round), none (no per-round line either), auto (bar "
          "on a terminal, else plain)");

namespace fedlearn {
namespace {

// Exit codes: 0 after every agent got DONE (or after SIGTERM), 1 when an agent
// failed, 2 for a bad command line or missing data, 130 after SIGINT.
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// One agent of this process and what it trains on.
struct Slot {
  int partition = 0;
  std::string name;
  Dataset train;
  Dataset test;
  std::unique_ptr<Agent> agent;
  std::thread thread;
  absl::StatusOr<AgentSummary> result = absl::UnknownError("did not run");
};

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "fedlearn-client: %s\n", message.c_str());
  return code;
}

// SplitMix64's finaliser: turns related seeds into unrelated ones.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0')
    return "agent";
  return host;
}

// Loads one split of --data_dir and cuts it into the flags' partitions.
absl::StatusOr<std::pair<Dataset, std::vector<std::vector<int64_t>>>>
LoadAndPartition(const std::string& dir, bool train,
                 const PartitionScheme& scheme, int num_partitions,
                 uint64_t seed) {
  absl::StatusOr<Dataset> data = LoadMnistDir(dir, train);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat("loading the ", train ? "train" : "test",
                                     " split: ", data.status().message()));
  }
  absl::StatusOr<std::vector<std::vector<int64_t>>> parts =
      Partition(data->labels, scheme, num_partitions, seed);
  if (!parts.ok()) return parts.status();
  return std::make_pair(*std::move(data), *std::move(parts));
}

std::string SummaryLine(const Slot& slot) {
  if (absl::IsCancelled(slot.result.status())) {
    return absl::StrFormat("%s (partition %d): stopped", slot.name,
                           slot.partition);
  }
  if (!slot.result.ok()) {
    return absl::StrFormat("%s (partition %d): failed: %s", slot.name,
                           slot.partition, slot.result.status().ToString());
  }
  const AgentSummary& s = *slot.result;
  std::string eval = "no evaluation";
  if (s.evaluated) {
    eval = absl::StrFormat("test loss %.4f accuracy %.4f on %d examples",
                           s.last_eval.loss, s.last_eval.accuracy,
                           s.last_eval.num_examples);
  }
  return absl::StrFormat(
      "%s (%s, partition %d): done: %d rounds trained, %d updates rejected, "
      "%d join(s); %s; sent %.2f MB, received %.2f MB in %.1fs",
      slot.name, s.client_id, slot.partition, s.rounds_trained,
      s.updates_rejected, s.joins, eval, s.bytes_sent / 1e6,
      s.bytes_received / 1e6, absl::ToDoubleSeconds(s.wall_time));
}

int Run() {
  // Signals are taken synchronously by this thread (sigtimedwait below).
  const sigset_t signals = BlockTerminationSignals();

  const int agents = absl::GetFlag(FLAGS_agents);
  const int num_partitions = absl::GetFlag(FLAGS_num_partitions) > 0
                                 ? absl::GetFlag(FLAGS_num_partitions)
                                 : agents;
  const int first = absl::GetFlag(FLAGS_partition_index);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (agents < 1) return Fail(kExitUsage, "--agents must be at least 1");
  if (absl::GetFlag(FLAGS_num_partitions) < 0)
    return Fail(kExitUsage, "--num_partitions must be >= 0 (0: --agents)");
  if (first < 0 || first + agents > num_partitions) {
    return Fail(kExitUsage,
                absl::StrFormat("--partition_index=%d with --agents=%d needs "
                                "partitions %d..%d, but --num_partitions is %d",
                                first, agents, first, first + agents - 1,
                                num_partitions));
  }
  absl::StatusOr<PartitionScheme> scheme =
      ParsePartitionScheme(absl::GetFlag(FLAGS_partition));
  if (!scheme.ok()) {
    return Fail(kExitUsage,
                absl::StrCat("--partition: ", scheme.status().message()));
  }
  absl::StatusOr<ProgressMode> progress_mode =
      ParseProgressMode(absl::GetFlag(FLAGS_progress));
  if (!progress_mode.ok()) {
    return Fail(kExitUsage,
                absl::StrCat("--progress: ", progress_mode.status().message()));
  }
  absl::StatusOr<v1::Encoding> update_encoding =
      ParseUpdateEncoding(absl::GetFlag(FLAGS_update_encoding));
  if (!update_encoding.ok()) {
    return Fail(kExitUsage, absl::StrCat("--update_encoding: ",
                                         update_encoding.status().message()));
  }
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  std::error_code error;
  if (!std::filesystem::is_directory(data_dir, error)) {
    return Fail(kExitUsage,
                absl::StrCat("data directory \"", data_dir,
                             "\" does not exist or is not a directory "
                             "(--data_dir; scripts/fetch-data.sh prepares "
                             "data/mnist)"));
  }

  std::vector<Slot> slots(static_cast<size_t>(agents));
  {
    auto train = LoadAndPartition(data_dir, /*train=*/true, *scheme,
                                  num_partitions, seed);
    if (!train.ok())
      return Fail(kExitUsage,
                  absl::StrCat(data_dir, ": ", train.status().message()));
    auto test = LoadAndPartition(data_dir, /*train=*/false, *scheme,
                                 num_partitions, seed);
    if (!test.ok())
      return Fail(kExitUsage,
                  absl::StrCat(data_dir, ": ", test.status().message()));
    const std::string flag_name = absl::GetFlag(FLAGS_name);
    const std::string base = flag_name.empty() ? HostName() : flag_name;
    for (int i = 0; i < agents; ++i) {
      Slot& slot = slots[static_cast<size_t>(i)];
      slot.partition = first + i;
      slot.name = agents == 1 && !flag_name.empty()
                      ? flag_name
                      : absl::StrCat(base, "-p", slot.partition);
      slot.train = Subset(train->first, train->second[slot.partition]);
      slot.test = Subset(test->first, test->second[slot.partition]);
    }
  }  // the whole splits are freed here

  const int threads =
      absl::GetFlag(FLAGS_threads) > 0
          ? absl::GetFlag(FLAGS_threads)
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                            agents);
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  const std::string session_dir = absl::GetFlag(FLAGS_session_dir);
  if (!session_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(session_dir, error);
    if (error) {
      return Fail(kExitUsage, absl::StrCat("--session_dir=", session_dir, ": ",
                                           error.message()));
    }
  }
  const absl::Duration max_backoff = absl::GetFlag(FLAGS_max_backoff);
  // One channel for all: one connection, and Stop() can cut calls short.
  ClientTlsFiles tls;
  tls.enabled = absl::GetFlag(FLAGS_tls);
  tls.ca = absl::GetFlag(FLAGS_tls_ca);
  tls.cert = absl::GetFlag(FLAGS_tls_cert);
  tls.key = absl::GetFlag(FLAGS_tls_key);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(tls);
  if (!credentials.ok()) {
    return Fail(kExitUsage, std::string(credentials.status().message()));
  }
  std::shared_ptr<grpc::Channel> channel =
      MakeCoordinatorChannel(address, max_backoff, *std::move(credentials),
                             absl::GetFlag(FLAGS_tls_server_name));
  // Logs and progress share stderr, so the terminal test is on stderr.
  ProgressConsole::Options console_options;
  console_options.mode = ResolveProgressMode(*progress_mode, STDERR_FILENO);
  console_options.agents = agents;
  auto console = std::make_shared<ProgressConsole>(std::move(console_options));
  for (Slot& slot : slots) {
    AgentOptions options;
    options.coordinator = address;
    options.channel = channel;
    options.join_token = absl::GetFlag(FLAGS_join_token);
    options.display_name = slot.name;
    if (!session_dir.empty()) {
      std::string file = slot.name;
      std::replace(file.begin(), file.end(), '/', '_');
      options.session_file = absl::StrCat(session_dir, "/", file, ".session");
    }
    options.num_train_examples = slot.train.size();
    options.num_test_examples = slot.test.size();
    options.evaluates = slot.test.size() > 0;
    options.max_backoff = max_backoff;
    options.reconnect_timeout = absl::GetFlag(FLAGS_reconnect_timeout);
    options.poll_wait = absl::GetFlag(FLAGS_poll_wait);
    options.heartbeat = absl::GetFlag(FLAGS_heartbeat);
    options.update_encoding = *update_encoding;
    options.progress = console;
    options.progress_slot = static_cast<int>(&slot - slots.data());
    ConsoleLogf(
        console.get(),
        "%s: partition %d of %d (%s): %d train and %d test examples, %d "
        "thread(s), coordinator %s",
        slot.name, slot.partition, num_partitions,
        PartitionSchemeToString(*scheme), slot.train.size(), slot.test.size(),
        threads, address);
    // The trainer is built after Join, for the model the coordinator names;
    // again only if a re-join brings another model, so the data is copied.
    const Slot* data = &slot;
    TrainerFactory factory = [data, seed,
                              threads](const v1::JoinResponse& joined)
        -> absl::StatusOr<std::unique_ptr<Trainer>> {
      FEDLEARN_RETURN_IF_ERROR(CheckTrainable(joined.model()));
      CnnTrainerOptions trainer;
      trainer.model = joined.model().name();
      trainer.train = data->train;
      trainer.test = data->test;
      trainer.seed =
          Mix(seed ^ Mix(joined.plan().seed() ^
                         Mix(static_cast<uint64_t>(data->partition))));
      trainer.threads = threads;
      SetInputNorm(joined.plan(), &trainer);
      return MakeCnnTrainer(std::move(trainer));
    };
    slot.agent =
        std::make_unique<Agent>(std::move(options), std::move(factory));
  }

  absl::Mutex mu;
  int finished = 0;
  ProgressConsole* const log = console.get();
  for (Slot& slot : slots) {
    slot.thread = std::thread([&slot, &mu, &finished, log, agents] {
      slot.result = slot.agent->Run();
      int others = 0;
      {
        absl::MutexLock lock(&mu);
        others = agents - 1 - finished++;
      }
      // Said when it happens: with --agents=N the others may go on for hours
      // before the summary lines. (Its message names the agent.)
      if (others > 0 && !slot.result.ok() &&
          !absl::IsCancelled(slot.result.status())) {
        ConsoleLogf(log, "%s; the other agents go on (%d)",
                    slot.result.status().ToString(), others);
      }
    });
  }

  std::optional<int> signalled;
  for (;;) {
    {
      absl::MutexLock lock(&mu);
      if (finished == agents) break;
    }
    const timespec tick = {0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig != SIGINT && sig != SIGTERM) continue;
    const int code = sig == SIGTERM ? 0 : 128 + sig;
    if (signalled.has_value()) {
      ConsoleLogf(console.get(), "signal %d again: exiting at once", sig);
      std::fflush(stdout);
      _exit(code);
    }
    signalled = code;
    ConsoleLogf(console.get(),
                "signal %d: stopping the agents (a round in training finishes "
                "first; signal again to exit at once)",
                sig);
    for (Slot& slot : slots) slot.agent->Stop();
  }
  for (Slot& slot : slots) slot.thread.join();

  // Stopped by the signal is not a failure; an agent that had failed before
  // it still is (the signal's exit status would hide it).
  auto failed = [&signalled](const Slot& slot) {
    return !slot.result.ok() &&
           !(signalled.has_value() && absl::IsCancelled(slot.result.status()));
  };
  bool any_failed = false;
  for (const Slot& slot : slots) {
    std::printf("%s\n", SummaryLine(slot).c_str());
    any_failed |= failed(slot);
  }
  std::fflush(stdout);
  if (!any_failed) return signalled.value_or(0);
  for (const Slot& slot : slots) {
    if (failed(slot)) Fail(kExitFailure, slot.result.status().ToString());
  }
  return kExitFailure;
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  fedlearn::ParseFlags(
      argc, argv,
      "fedlearn-client --coordinator=HOST:PORT --data_dir=DIR [flags]\n"
      "Runs federated-learning agents on local MNIST-format data until the "
      "coordinator's run is DONE.",
      fedlearn::ConfigSchema{"fedlearn.v1.ClientConfig", {}});
  return fedlearn::Run();
}
