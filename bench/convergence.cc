// convergence: rounds (and wall time) a real federated run needs to reach a
// test accuracy. Starts an in-process coordinator on a loopback port and
// --clients agents, each a thread with a real CnnTrainer (one compute thread)
// on its partition of the training split of --data_dir, and after every round
// judges the new global model centrally on the whole test split.
// bench/convergence-vs-pytorch.sh runs it next to an independent FedAvg
// simulation in PyTorch (bench/peers/fedavg_pytorch.py) on the same partition
// (--partitions_out) and from the same initial weights (--initial_out).
//
// The run: the first round waits for all --clients to join (min_clients =
// --clients), then every round the coordinator samples --clients_per_round of
// them with its seed (default: all) and waits for every one (tolerance 0);
// --model (default mnist_cnn), E=--epochs (default 1), B=10, Adadelta(lr 1.0)
// with each client's optimizer state kept across rounds, no local validation
// (all local data trains), FedAvg weighted by local train size.
// convergence_threshold is -inf, so the coordinator never stops on the train
// loss: the run goes on until the target accuracy or --rounds. The FedAvg
// paper's setting is --clients=100 --clients_per_round=10 --epochs=5
// --model=fedavg_cnn (bench/fedavg-paper.sh); only the 10 selected agents
// train at a time, the others hold a poll open.
//
// Prints one JSON line per round on stdout:
//   {"side":"fedlearn","round":1,"test_accuracy":...,"test_loss":...,
//    "train_loss":...,"seconds_since_start":...,"selected":[3,41,...]}
// "selected" lists the round's sampled clients as agent indices (partition
// indices), in sampling order, so the PyTorch peer can replay the sampling.
// seconds_since_start counts from the agents' start to the round's close (the
// central evaluation runs while the agents train the next round and is not
// counted). Logs of the coordinator and agents go to stderr.

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/byzantine_trainer.h"
#include "client/agent.h"
#include "client/cnn_trainer.h"
#include "client/idx.h"
#include "client/partition.h"
#include "common/flags.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "server/coordinator_server.h"
#include "server/run_controller.h"
#include "server/strategy/strategy.h"

ABSL_FLAG(std::string, data_dir, "data/mnist",
          "IDX directory (train-*/t10k-* files, raw or .gz)");
ABSL_FLAG(std::string, partition, "iid",
          "how the training split is dealt out: iid, shards, dirichlet:ALPHA");
ABSL_FLAG(int, clients, 10, "agents, one partition each");
ABSL_FLAG(int, clients_per_round, 0,
          "clients the coordinator samples for each round; 0: all of them");
ABSL_FLAG(int, epochs, 1, "local epochs per round (E)");
ABSL_FLAG(int, batch_size, 10, "local mini-batch size (B)");
ABSL_FLAG(std::string, model, "mnist_cnn",
          "registry model (common/model_spec.h): mnist_cnn, fedavg_cnn, "
          "mlp_2nn");
ABSL_FLAG(int, rounds, 40, "most rounds to run");
ABSL_FLAG(std::string, optimizer, "adadelta",
          "the clients' optimizer: adadelta, sgd, momentum or adam");
ABSL_FLAG(double, learning_rate, 1.0, "the clients' learning rate");
ABSL_FLAG(std::string, update_encoding, "dense",
          "how the agents send updates: dense or int8 (as fedlearn-client's "
          "--update_encoding)");
ABSL_FLAG(std::string, input_norm, "none",
          "input standardisation as fedlearn-coordinator's --input_norm: none "
          "(p/255), mnist, fashion-mnist or MEAN,STD");
ABSL_FLAG(double, target, 0.97,
          "stop once the global model's test accuracy reaches this");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of the partition and of the initial weights; agent i shuffles "
          "and drops out with seed 100 + i");
ABSL_FLAG(std::string, strategy, "fedavg",
          "the coordinator's --strategy (server/strategy/strategy.h)");
ABSL_FLAG(std::string, strategy_config, "",
          "its knobs, as the coordinator's --strategy_config takes them");
ABSL_FLAG(bool, reset_client_optimizer, false,
          "clients start every round with a fresh optimizer state");
ABSL_FLAG(int, byzantine, 0,
          "the first N agents are Byzantine: they train, then send --attack "
          "instead of their update (bench/byzantine_trainer.h)");
ABSL_FLAG(std::string, attack, "signflip",
          "what a Byzantine agent sends: signflip, noise or constant");
ABSL_FLAG(std::string, aggregation_memory, "512MiB",
          "the coordinator's --aggregation_memory");
ABSL_FLAG(double, dp_noise_multiplier, 0,
          "central DP: the coordinator's --dp_noise_multiplier (0: no DP)");
ABSL_FLAG(double, dp_clip_norm, 0, "central DP: --dp_clip_norm");
ABSL_FLAG(double, dp_delta, 1e-5, "central DP: --dp_delta");
ABSL_FLAG(double, dp_target_quantile, 0,
          "central DP: --dp_target_quantile (0: a fixed clip norm)");
ABSL_FLAG(std::string, partitions_out, "",
          "if set, write the partition here as JSON "
          "{\"partitions\": [[train indices of client 0], ...]}");
ABSL_FLAG(std::string, initial_out, "",
          "if set, write the coordinator's initial global weights here "
          "(safetensors, PyTorch names and layouts)");

namespace fedlearn {
namespace {

absl::Status WritePartitions(const std::string& path,
                             const std::vector<std::vector<int64_t>>& parts) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr)
    return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::fputs("{\"partitions\": [", f);
  for (size_t i = 0; i < parts.size(); ++i) {
    std::fprintf(f, "%s\n[%s]", i == 0 ? "" : ",",
                 absl::StrJoin(parts[i], ",").c_str());
  }
  std::fputs("]}\n", f);
  if (std::fclose(f) != 0) {
    return absl::DataLossError(absl::StrCat("short write to ", path));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  const int clients = absl::GetFlag(FLAGS_clients);
  const int per_round = absl::GetFlag(FLAGS_clients_per_round) > 0
                            ? absl::GetFlag(FLAGS_clients_per_round)
                            : clients;
  if (per_round > clients) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--clients_per_round=", per_round, " exceeds --clients=", clients));
  }
  const int max_rounds = absl::GetFlag(FLAGS_rounds);
  const double target = absl::GetFlag(FLAGS_target);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  FEDLEARN_ASSIGN_OR_RETURN(Dataset train, LoadMnistDir(dir, /*train=*/true));
  FEDLEARN_ASSIGN_OR_RETURN(Dataset test, LoadMnistDir(dir, /*train=*/false));
  FEDLEARN_ASSIGN_OR_RETURN(
      PartitionScheme scheme,
      ParsePartitionScheme(absl::GetFlag(FLAGS_partition)));
  FEDLEARN_ASSIGN_OR_RETURN(auto parts,
                            Partition(train.labels, scheme, clients, seed));
  if (const std::string out = absl::GetFlag(FLAGS_partitions_out);
      !out.empty()) {
    FEDLEARN_RETURN_IF_ERROR(WritePartitions(out, parts));
  }

  absl::StatusOr<v1::Encoding> encoding =
      ParseUpdateEncoding(absl::GetFlag(FLAGS_update_encoding));
  if (!encoding.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--update_encoding: ", encoding.status().message()));
  }

  CoordinatorOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  options.seed = seed;
  options.min_clients = clients;  // the first round waits for every agent
  options.clients_per_round = per_round;
  options.tolerance = 0;  // every selected client's update counts
  options.epochs = absl::GetFlag(FLAGS_epochs);
  options.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.optimizer = absl::GetFlag(FLAGS_optimizer);
  options.learning_rate = absl::GetFlag(FLAGS_learning_rate);
  options.max_rounds = max_rounds;
  // Never stop on the train loss: a benchmark of rounds-to-target runs until
  // the target (non-IID train loss is noisy, and a rise would end the run).
  options.convergence_threshold = -std::numeric_limits<double>::infinity();
  options.rounds_between_validations = 0;
  options.validation_fraction = 0;  // all local data trains
  // The agents and the judge take the input scaling from the plan, as the
  // peer takes it from the same flag.
  FEDLEARN_RETURN_IF_ERROR(
      ParseInputNorm(absl::GetFlag(FLAGS_input_norm), &options));
  options.strategy = absl::GetFlag(FLAGS_strategy);
  if (const std::string text = absl::GetFlag(FLAGS_strategy_config);
      !text.empty()) {
    FEDLEARN_ASSIGN_OR_RETURN(options.strategy_config,
                              ParseStrategyConfig(text));
  }
  options.reset_client_optimizer = absl::GetFlag(FLAGS_reset_client_optimizer);
  options.aggregation_memory = absl::GetFlag(FLAGS_aggregation_memory);
  options.dp_noise_multiplier = absl::GetFlag(FLAGS_dp_noise_multiplier);
  options.dp_clip_norm = absl::GetFlag(FLAGS_dp_clip_norm);
  options.dp_delta = absl::GetFlag(FLAGS_dp_delta);
  options.dp_target_quantile = absl::GetFlag(FLAGS_dp_target_quantile);
  const int byzantine = absl::GetFlag(FLAGS_byzantine);
  FEDLEARN_ASSIGN_OR_RETURN(const Attack attack,
                            ParseAttack(absl::GetFlag(FLAGS_attack)));
  if (byzantine < 0 || byzantine > clients) {
    return absl::InvalidArgumentError(
        absl::StrCat("--byzantine=", byzantine, ": must be in [0, --clients]"));
  }
  options.round_timeout = absl::Minutes(10);
  options.client_timeout = absl::Minutes(5);  // 10 training agents, 2 cores
  FEDLEARN_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server,
                            CoordinatorServer::Start(options, "127.0.0.1:0"));
  RunController& controller = server->controller();
  if (const std::string out = absl::GetFlag(FLAGS_initial_out); !out.empty()) {
    FEDLEARN_RETURN_IF_ERROR(
        WriteSafetensors(out, controller.spec(), *controller.global_weights()));
  }

  // The judge: a trainer of its own that only evaluates (its train split is a
  // placeholder, since a trainer needs one).
  CnnTrainerOptions judge_options;
  judge_options.model = options.model;
  judge_options.train = Subset(train, std::vector<int64_t>{0});
  judge_options.test = test;
  SetInputNorm(options.Plan(), &judge_options);
  FEDLEARN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> judge,
                            MakeCnnTrainer(std::move(judge_options)));

  const std::string address = absl::StrCat("127.0.0.1:", server->port());
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<int64_t> sizes;
  absl::flat_hash_map<std::string, int> agent_index;  // display name -> i
  // The agents' own test split only serves the coordinator's closing
  // EVALUATE, which this bench does not read (the judge above is central);
  // a placeholder keeps 100 agents from holding 100 copies of the test split.
  const Dataset agent_test = Subset(test, std::vector<int64_t>{0});
  for (int i = 0; i < clients; ++i) {
    CnnTrainerOptions trainer;
    trainer.train = Subset(train, parts[i]);
    trainer.test = agent_test;
    trainer.seed = 100 + i;
    // Compute threads are process-wide (nn::SetComputeThreads); every agent
    // and the judge set 1, so the selected agents' threads share the 2 cores.
    trainer.threads = 1;
    sizes.push_back(trainer.train.size());
    AgentOptions agent_options;
    agent_options.coordinator = address;
    agent_options.channel =
        MakeCoordinatorChannel(address, agent_options.max_backoff);
    agent_options.display_name = absl::StrCat("agent-", i);
    agent_index[agent_options.display_name] = i;
    agent_options.num_train_examples = trainer.train.size();
    agent_options.num_test_examples = trainer.test.size();
    agent_options.jitter_seed = 1000 + i;
    agent_options.update_encoding = *encoding;
    const bool lies = i < byzantine;
    agents.push_back(std::make_unique<Agent>(
        agent_options,
        [trainer, lies, attack, i](const v1::JoinResponse& joined) mutable
        -> absl::StatusOr<std::unique_ptr<Trainer>> {
          trainer.model = joined.model().name();
          SetInputNorm(joined.plan(), &trainer);
          FEDLEARN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> honest,
                                    MakeCnnTrainer(std::move(trainer)));
          if (!lies) return honest;
          return std::make_unique<ByzantineTrainer>(std::move(honest), attack,
                                                    5000 + i);
        }));
  }
  std::printf(
      "{\"side\":\"fedlearn\",\"event\":\"start\",\"partition\":\"%s\","
      "\"model\":\"%s\",\"clients\":%d,\"clients_per_round\":%d,"
      "\"epochs\":%d,\"batch_size\":%d,\"optimizer\":\"%s\","
      "\"learning_rate\":%g,\"client_sizes\":[%s],"
      "\"test_examples\":%lld,\"max_rounds\":%d,\"target\":%.4f,"
      "\"strategy\":\"%s\",\"strategy_config\":\"%s\","
      "\"reset_client_optimizer\":%s,\"byzantine\":%d,\"attack\":\"%s\","
      "\"dp_noise_multiplier\":%g,\"dp_clip_norm\":%g}\n",
      PartitionSchemeToString(scheme).c_str(), options.model.c_str(), clients,
      per_round, options.epochs, options.batch_size, options.optimizer.c_str(),
      options.learning_rate, absl::StrJoin(sizes, ",").c_str(),
      static_cast<long long>(test.size()), max_rounds, target,
      options.strategy.c_str(),
      controller.GetStatus().strategy_config().c_str(),
      options.reset_client_optimizer ? "true" : "false", byzantine,
      byzantine > 0 ? absl::GetFlag(FLAGS_attack).c_str() : "none",
      options.dp_noise_multiplier, options.dp_clip_norm);
  {
    FEDLEARN_ASSIGN_OR_RETURN(EvalMetrics initial,
                              judge->Evaluate(*controller.global_weights()));
    std::printf(
        "{\"side\":\"fedlearn\",\"round\":0,\"test_accuracy\":%.4f,"
        "\"test_loss\":%.4f,\"seconds_since_start\":0}\n",
        initial.accuracy, initial.loss);
    std::fflush(stdout);
  }

  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(clients);
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] { results[i] = agents[i]->Run().status(); });
  }

  // This thread takes each round's model the moment the round closes (the
  // next one takes seconds to train) and queues it; a judge thread evaluates
  // the queue in order at the lowest priority, so that its work does not take
  // a core's share from the agents inside fedlearn's timed window (the peer's
  // evaluations are outside its own).
  struct Closed {
    v1::RoundRecord record;
    Weights weights;
    double seconds = 0;
    std::vector<int> selected;
    // The L2 norms of the round's accepted updates as sent (none under DP,
    // which does not show them).
    std::vector<double> update_norms;
  };
  absl::Mutex mu;
  std::deque<Closed> queue;  // each guarded by mu
  bool no_more = false;      // the main loop has ended
  bool reached = false;      // the judge saw the target
  absl::Status judged;       // the judge thread's error
  std::thread judge_thread([&] {
    // Threads take their creator's priority: the agents' started before.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
    for (;;) {
      Closed c;
      {
        absl::MutexLock lock(&mu);
        auto ready = [&] { return !queue.empty() || no_more; };
        mu.Await(absl::Condition(&ready));
        if (queue.empty()) return;
        c = std::move(queue.front());
        queue.pop_front();
      }
      absl::StatusOr<EvalMetrics> eval = judge->Evaluate(*c.weights);
      if (!eval.ok()) {
        judged = eval.status();
        absl::MutexLock lock(&mu);
        reached = true;  // stops the run
        return;
      }
      std::printf(
          "{\"side\":\"fedlearn\",\"round\":%lld,\"outcome\":\"%s\","
          "\"responded\":%d,\"test_accuracy\":%.4f,\"test_loss\":%.4f,"
          "\"train_loss\":%.4f,\"round_seconds\":%.2f,"
          "\"seconds_since_start\":%.2f,\"selected\":[%s],"
          "\"dp_epsilon\":%.6g,\"dp_clip_norm\":%.6g,\"update_norms\":[%s]}\n",
          static_cast<long long>(c.record.round()), c.record.outcome().c_str(),
          c.record.responded(), eval->accuracy, eval->loss,
          c.record.metrics().train_loss(), c.record.duration_seconds(),
          c.seconds, absl::StrJoin(c.selected, ",").c_str(),
          c.record.dp_epsilon(), c.record.dp_clip_norm(),
          absl::StrJoin(c.update_norms, ",").c_str());
      std::fflush(stdout);
      if (eval->accuracy >= target) {
        std::printf(
            "{\"side\":\"fedlearn\",\"event\":\"stopped\",\"reason\":"
            "\"target\",\"round\":%lld}\n",
            static_cast<long long>(c.record.round()));
        absl::MutexLock lock(&mu);
        reached = true;
        return;
      }
    }
  });

  // A round's record is history[round - 1] as long as no attempt is abandoned
  // (tolerance 0 with a 10-minute deadline); the record says which round it
  // is, so an abandoned attempt would show as a repeated round number.
  absl::Status outcome = absl::OkStatus();
  std::string stop_reason;
  int64_t last_round = 0;
  for (size_t n = 1;; ++n) {
    const absl::Time deadline = absl::Now() + absl::Minutes(15);
    bool recorded = false;
    while (!(recorded = controller.AwaitHistory(n, absl::Seconds(1)))) {
      absl::MutexLock lock(&mu);
      if (reached || absl::Now() > deadline) break;
    }
    {
      absl::MutexLock lock(&mu);
      if (reached) break;
    }
    if (!recorded) {
      outcome = absl::DeadlineExceededError(
          absl::StrCat("no record ", n, " within 15 minutes"));
      break;
    }
    // Both read under the manager's lock, but separately: the next round
    // cannot close before its agents have trained, which takes seconds.
    // Every record (n may pass the default 100) with its sampled clients.
    const v1::GetStatusResponse status = controller.GetStatus(
        ClientPage(), nullptr, kMaxHistory, /*client_ids=*/true);
    Closed c;
    c.seconds = absl::ToDoubleSeconds(absl::Now() - start);
    c.weights = controller.global_weights();
    c.record = status.history(static_cast<int>(n) - 1);
    if (c.record.evaluation()) break;
    absl::flat_hash_map<std::string, int> index_of;  // client id -> agent
    for (const v1::ClientInfo& info : status.clients()) {
      if (auto it = agent_index.find(info.display_name());
          it != agent_index.end()) {
        index_of[info.client_id()] = it->second;
      }
      // The next round cannot have closed yet (its agents train for
      // seconds), so a client's latest update of this round is its one.
      if (info.last_update_round() == c.record.round() &&
          info.last_update_norm() > 0) {
        c.update_norms.push_back(info.last_update_norm());
      }
    }
    for (const std::string& id : c.record.selected_clients()) {
      auto it = index_of.find(id);
      c.selected.push_back(it == index_of.end() ? -1 : it->second);
    }
    last_round = c.record.round();
    {
      absl::MutexLock lock(&mu);
      queue.push_back(std::move(c));
    }
    if (status.phase() == v1::PHASE_EVALUATING ||
        status.phase() == v1::PHASE_DONE) {
      stop_reason = status.stop_reason();
      break;
    }
  }
  {
    absl::MutexLock lock(&mu);
    no_more = true;
  }
  judge_thread
      .join();  // evaluates what is queued, unless the target stopped it
  if (outcome.ok()) outcome = judged;
  bool target_reached;
  {
    absl::MutexLock lock(&mu);
    target_reached = reached && judged.ok();
  }
  if (!target_reached && !stop_reason.empty()) {
    std::printf(
        "{\"side\":\"fedlearn\",\"event\":\"stopped\",\"reason\":\"%s\","
        "\"round\":%lld}\n",
        stop_reason.c_str(), static_cast<long long>(last_round));
  }
  std::fflush(stdout);

  for (auto& agent : agents) agent->Stop();
  server->Shutdown(absl::Seconds(1));
  for (auto& t : threads) t.join();
  return outcome;
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  fedlearn::ParseFlags(argc, argv,
                       "convergence: rounds a federated run with in-process "
                       "agents needs to reach a test accuracy");
  const absl::Status status = fedlearn::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "convergence: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
