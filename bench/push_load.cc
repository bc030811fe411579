// push_load: N clients in one process, each with its own connection, that join
// a coordinator, take their TRAIN task, wait until every one of them has its
// weights, then push their updates all at once; then, once every push is
// answered, evaluate and exit on DONE. With --warmup_rounds, that many rounds
// are pushed first, untimed and without the barriers. It is the load for the
// coordinator's memory and ingest benchmark (bench/aggregation.sh).
//
// The load shares the machine's cores with the coordinator, so it does as
// little as a client can: the clients' updates are seven shared vectors, not
// one each, cut into chunk messages (with their CRCs) once, not once per push
// (--encode_once; without it each push encodes its update as the C++ client
// does), and no client downloads its next task while others still push (the
// reply to the last push would otherwise wait behind 99 downloads for a thread
// of this process, and count as ingest time).

#include <grpcpp/create_channel.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "client/coordinator_client.h"
#include "common/model_spec.h"
#include "common/retry.h"
#include "common/tensor_codec.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "coordinator address");
ABSL_FLAG(int, clients, 10, "number of clients");
ABSL_FLAG(int, chunk_bytes, static_cast<int>(fedlearn::kDefaultPushChunkBytes),
          "payload bytes per pushed chunk (the C++ client's default)");
ABSL_FLAG(bool, encode_once, true,
          "cut each of the seven shared updates into chunk messages once and "
          "send those; false: every push encodes its update as "
          "CoordinatorClient::PushUpdate does (a CRC-32C and a copy per chunk "
          "more on this process)");
ABSL_FLAG(int, warmup_rounds, 0,
          "rounds every client pushes before the timed one (the coordinator "
          "needs --max_rounds of at least this plus one): the first round "
          "also pays the coordinator's first touch of its receive buffers");
ABSL_FLAG(bool, transfer_report, false,
          "print one JSON line of the seconds polls waited for their task's "
          "header, downloads took (header to verified weights) and uploads "
          "took, and the bytes, summed over every TRAIN task");

namespace fedlearn {
namespace {

// Releases everyone once `n` have arrived.
class Barrier {
 public:
  explicit Barrier(int n) : remaining_(n) {}
  void ArriveAndWait() {
    absl::MutexLock lock(&mu_);
    --remaining_;
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return remaining_ <= 0;
    };
    mu_.Await(absl::Condition(&all));
  }

 private:
  absl::Mutex mu_;
  int remaining_ ABSL_GUARDED_BY(mu_);
};

// The update of every client whose index is `kind` modulo 7: 1e-3 * kind in
// every element, `size` of them (the model's, the same for every client).
// Made once, under the lock, by the first client that asks, and never
// changed after: the reference stays valid and is only read.
const std::vector<float>& SharedDelta(int kind, size_t size) {
  static absl::Mutex mu;
  static std::vector<float> deltas[7];
  absl::MutexLock lock(&mu);
  std::vector<float>& delta = deltas[kind];
  if (delta.empty()) delta.assign(size, 1e-3f * static_cast<float>(kind));
  return delta;
}

// SharedDelta(kind, spec.num_parameters) cut into dense chunk messages of
// `chunk_bytes`, made once like it and read-only after.
absl::Span<const v1::PushGradientRequest> SharedChunks(int kind,
                                                       const ModelSpec& spec,
                                                       size_t chunk_bytes) {
  static absl::Mutex mu;
  static std::vector<v1::PushGradientRequest> chunks[7];
  const std::vector<float>& delta =
      SharedDelta(kind, static_cast<size_t>(spec.num_parameters));
  absl::MutexLock lock(&mu);
  std::vector<v1::PushGradientRequest>& encoded = chunks[kind];
  if (encoded.empty()) {
    ChunkWriter writer(spec, delta, chunk_bytes);
    v1::PushGradientRequest message;
    while (writer.Next(message.mutable_chunk())) encoded.push_back(message);
  }
  return encoded;
}

int Run() {
  const int n = absl::GetFlag(FLAGS_clients);
  Barrier weights_in_hand(n), all_pushed(n);
  std::atomic<int> failures{0};
  std::atomic<int64_t> pushed_bytes{0};
  absl::Mutex mu;
  absl::Time first_push = absl::InfiniteFuture(),
             last_push = absl::InfinitePast();
  // Summed over every client's TRAIN tasks, under mu.
  double task_wait_seconds = 0, download_seconds = 0, upload_seconds = 0;
  int64_t downloaded = 0, uploaded = 0, tasks = 0;

  auto agent = [&](int index) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                1);  // a connection per client
    args.SetMaxReceiveMessageSize(4 << 20);
    CoordinatorClient client(
        grpc::CreateCustomChannel(absl::GetFlag(FLAGS_coordinator),
                                  grpc::InsecureChannelCredentials(), args),
        static_cast<size_t>(absl::GetFlag(FLAGS_chunk_bytes)));
    v1::JoinRequest join;
    join.set_display_name(absl::StrCat("load-", index));
    // The round needs every client: a join that fails for the moment (the
    // connection, a deadline) is tried again, as an agent would.
    absl::StatusOr<v1::JoinResponse> joined;
    std::minstd_rand rng(static_cast<unsigned>(index) + 1);
    std::uniform_real_distribution<double> jitter(0.0, 1.0);
    constexpr int kJoinAttempts = 5;
    for (int attempt = 1; attempt <= kJoinAttempts; ++attempt) {
      joined = client.Join(join);
      if (joined.ok() || !IsRetryable(joined.status().code()) ||
          attempt == kJoinAttempts)
        break;
      std::fprintf(stderr, "client %d: join attempt %d: %s\n", index, attempt,
                   joined.status().ToString().c_str());
      absl::SleepFor(Backoff(attempt - 1, absl::Milliseconds(200),
                             absl::Seconds(2), jitter(rng)));
    }
    if (!joined.ok()) {
      // Without it the round never starts, and every other client would poll
      // for ever.
      std::fprintf(stderr, "client %d: join: %s; giving up\n", index,
                   joined.status().ToString().c_str());
      std::fflush(stdout);
      std::_Exit(1);
    }
    // The TRAIN tasks this client has had; the one after the warm-up rounds
    // is timed between the two barriers.
    int trained_rounds = 0;
    const int timed_round = absl::GetFlag(FLAGS_warmup_rounds) + 1;
    for (;;) {
      const absl::Time polled = absl::Now();
      auto task = client.RequestUpdate(absl::Seconds(10));
      const absl::Time received = absl::Now();
      if (absl::IsCancelled(task.status())) {
        // A download the coordinator ended (the run moved past it, or it
        // stalled): poll again after the agent's first backoff.
        absl::SleepFor(absl::Milliseconds(100));
        continue;
      }
      if (!task.ok()) {
        std::fprintf(stderr, "%s: poll: %s\n", client.client_id().c_str(),
                     task.status().ToString().c_str());
        ++failures;
        if (trained_rounds < timed_round) {
          weights_in_hand.ArriveAndWait();
          all_pushed.ArriveAndWait();
        }
        return;
      }
      switch (task->task.type()) {
        case v1::TASK_TYPE_TRAIN: {
          const std::vector<float>& delta =
              SharedDelta(index % 7, task->weights.size());
          // Encoded before the barrier: the push window times the pushes.
          const bool encode_once = absl::GetFlag(FLAGS_encode_once);
          absl::Span<const v1::PushGradientRequest> encoded;
          if (encode_once) {
            encoded = SharedChunks(
                index % 7, client.spec(),
                static_cast<size_t>(absl::GetFlag(FLAGS_chunk_bytes)));
          }
          const bool timed = ++trained_rounds == timed_round;
          if (timed) weights_in_hand.ArriveAndWait();
          const absl::Time start = absl::Now();
          v1::UpdateHeader header;
          header.set_round(task->task.round());
          header.set_num_examples(100);
          header.set_train_loss(1.0);
          auto pushed = encode_once ? client.PushEncoded(header, encoded)
                                    : client.PushUpdate(header, delta);
          const absl::Time end = absl::Now();
          if (!pushed.ok()) {
            std::fprintf(stderr, "%s: push: %s\n", client.client_id().c_str(),
                         pushed.status().ToString().c_str());
            ++failures;
          } else if (timed) {
            pushed_bytes += static_cast<int64_t>(delta.size() * sizeof(float));
          }
          {
            absl::MutexLock lock(&mu);
            if (timed) {
              first_push = std::min(first_push, start);
              last_push = std::max(last_push, end);
            }
            // The transfer report sums every TRAIN task, warm-up or not.
            task_wait_seconds +=
                absl::ToDoubleSeconds(task->header_received - polled);
            download_seconds +=
                absl::ToDoubleSeconds(received - task->header_received);
            upload_seconds += absl::ToDoubleSeconds(end - start);
            downloaded += static_cast<int64_t>(task->weights.size() * 4);
            uploaded += static_cast<int64_t>(delta.size() * 4);
            ++tasks;
          }
          if (timed) all_pushed.ArriveAndWait();
          break;
        }
        case v1::TASK_TYPE_EVALUATE: {
          v1::ReportEvalRequest report;
          report.set_round(task->task.round());
          report.set_test_loss(1.0);
          report.set_test_accuracy(0.5);
          report.set_num_examples(10);
          if (!client.ReportEval(report).ok()) ++failures;
          break;
        }
        case v1::TASK_TYPE_DONE:
          return;
        default:
          break;
      }
    }
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(agent, i);
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(last_push - first_push);
  std::printf(
      "push_load: %d clients pushed %.1f MB in %.3f s (%.2f GB/s), %d "
      "failures\n",
      n, pushed_bytes.load() / 1e6, seconds,
      pushed_bytes.load() / 1e9 / seconds, failures.load());
  if (absl::GetFlag(FLAGS_transfer_report)) {
    absl::MutexLock lock(&mu);
    std::printf(
        "{\"tasks\":%lld,\"task_wait_seconds\":%.6f,"
        "\"download_seconds\":%.6f,\"upload_seconds\":%.6f,"
        "\"bytes_received\":%lld,\"bytes_sent\":%lld}\n",
        static_cast<long long>(tasks), task_wait_seconds, download_seconds,
        upload_seconds, static_cast<long long>(downloaded),
        static_cast<long long>(uploaded));
  }
  return failures.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return fedlearn::Run();
}
