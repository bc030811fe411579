// swarm: thousands of simulated clients in one process, on the gRPC callback
// API, against a running coordinator (bench/swarm.sh starts it). Every client
// joins, holds a long poll and heartbeats at the interval the coordinator
// suggests (unless --heartbeat=false); a TRAIN task is downloaded in full and
// answered at once with a small valid update (no training: what is left is the
// coordinator's cost of coordinating), an EVALUATE task with a report, DONE
// ends the client.
//
// Phases: join N clients (at most --join_concurrency at a time), hold them
// idle for --idle_seconds while measuring the coordinator's CPU and RSS, then
// join one more client, which lets the coordinator (started with
// --min_clients=N+1) open its first round; run until every client was told
// DONE. A prober in a process of its own (bench/status_probe) measures
// GetStatus and /metrics latency throughout.
//
// Memory of the swarm itself: per client a few hundred bytes and one held
// poll; the update it pushes is serialized once and every push writes those
// bytes; a downloaded task is counted, not kept, except for one client in
// --verify_every, whose download is reassembled and verified (every chunk's
// and tensor's CRC-32C) like a real client's.
//
// What the swarm costs is taken from the coordinator: both share the machine's
// cores. So polls and pushes go through gRPC's generic stub, as raw messages:
// a downloaded chunk is read where gRPC received it (ReadChunkInPlace) rather
// than copied into a protobuf string, and a push's chunks are not serialized
// afresh per push. The wire bytes are the typed stub's.

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/probe_process.h"
#include "bench/process_stats.h"
#include "bench/swarm_report.h"
#include "common/chunk_wire.h"
#include "common/flags.h"
#include "common/grpc_status.h"
#include "common/model_spec.h"
#include "common/raw_message.h"
#include "common/retry.h"
#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "coordinator address");
ABSL_FLAG(int, http_port, 8080,
          "the coordinator's HTTP port (/metrics, for bench/status_probe)");
ABSL_FLAG(int, coordinator_pid, 0,
          "the coordinator's process id, for its RSS and CPU (0: not read)");
ABSL_FLAG(int, clients, 1000, "simulated clients");
ABSL_FLAG(int, clients_per_connection, 1,
          "clients sharing one HTTP/2 connection (1: one each, as separate "
          "devices would)");
ABSL_FLAG(int, join_concurrency, 256, "joins in flight at once");
ABSL_FLAG(absl::Duration, idle_seconds, absl::ZeroDuration(),
          "how long every client idles, polling, before the first round (0: "
          "--max_wait + 12 s, so that every client renews its long poll once "
          "before the idle RSS is read: the first renewal adds about 3 KiB a "
          "client to the coordinator's RSS); from then on the coordinator's "
          "RSS, fds and threads are read every 10 s and their slopes printed");
ABSL_FLAG(absl::Duration, max_wait, absl::Seconds(30), "long poll max_wait");
ABSL_FLAG(bool, heartbeat, true,
          "heartbeat at the interval the coordinator suggests, idle or not; "
          "false: only hold polls, as an idle fedlearn-client does (it "
          "heartbeats while it trains)");
ABSL_FLAG(bool, bdp_probe, true,
          "let gRPC grow each download's flow-control window to the "
          "connection's measured bandwidth-delay product, as a real client's "
          "gRPC does; false holds it at gRPC's 64 KiB, which bounds what "
          "downloads in flight keep in this machine's TCP receive queues, "
          "shared by every simulated client (bench/swarm.sh: mnist_cnn)");
ABSL_FLAG(int, verify_every, 100,
          "reassemble and verify the download of one client in this many");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(15),
          "give up when the run is not DONE by then");
ABSL_FLAG(double, churn, 0,
          "soak: after each answered task a client leaves with this "
          "probability (its next poll hangs up after 100 ms, as a process "
          "that exits does) and joins again as a new client");
ABSL_FLAG(double, kill_push, 0,
          "soak: a push is cut off after its first chunk with this "
          "probability (a client killed mid-push), and the client joins "
          "again naming its previous identity (an agent with --session_dir)");
ABSL_FLAG(bool, sample_rounds, false,
          "read the coordinator's RSS, open file descriptors and threads at "
          "every round and print their slope from round 50 on");
ABSL_FLAG(bool, status_only, false,
          "print the coordinator's phase, round and history_total and exit");

namespace fedlearn {
namespace {

// Runs closures at given times on one thread (they only start RPCs).
class Timers {
 public:
  Timers() : thread_([this] { Loop(); }) {}
  ~Timers() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void At(absl::Time when, std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push(Entry{when, next_++, std::move(fn)});
  }

 private:
  struct Entry {
    absl::Time when;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Entry& o) const {
      return std::tie(when, seq) > std::tie(o.when, o.seq);
    }
  };
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || (!queue_.empty() && queue_.top().when <= absl::Now());
        };
        const absl::Time wake =
            queue_.empty() ? absl::Now() + absl::Milliseconds(50)
                           : std::min(queue_.top().when,
                                      absl::Now() + absl::Milliseconds(50));
        mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
        if (stop_) return;
        if (queue_.empty() || queue_.top().when > absl::Now()) continue;
        fn = std::move(const_cast<Entry&>(queue_.top()).fn);
        queue_.pop();
      }
      fn();
    }
  }
  absl::Mutex mu_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Says at once (on stderr) what went wrong with a call.
void Say(absl::string_view what, absl::string_view call,
         const grpc::Status& s) {
  std::fprintf(stderr, "swarm: %s: %s code %d: %s\n", std::string(what).c_str(),
               std::string(call).c_str(), static_cast<int>(s.error_code()),
               s.error_message().c_str());
}

constexpr int kJoinAttempts = 8;

class Swarm;

// One simulated client.
struct Sim {
  int index = 0;
  v1::Coordinator::Stub* stub = nullptr;
  grpc::GenericStub* raw = nullptr;  // the same connection, for raw messages
  std::atomic<bool> done{false};
  std::atomic<bool> leaving{false};  // its next poll hangs up (--churn)
  // Who it is: set at each join, read by every call.
  absl::Mutex mu;
  std::string id ABSL_GUARDED_BY(mu);
  std::string token ABSL_GUARDED_BY(mu);
  std::pair<std::string, std::string> Identity() {
    absl::MutexLock lock(&mu);
    return {id, token};
  }
};

class Swarm {
 public:
  Swarm() {
    const int n = absl::GetFlag(FLAGS_clients) + 1;  // the starter too
    const int per = std::max(1, absl::GetFlag(FLAGS_clients_per_connection));
    for (int i = 0; i < n; i += per) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own socket
      args.SetMaxReceiveMessageSize(8 << 20);
      if (!absl::GetFlag(FLAGS_bdp_probe)) {
        args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      }
      std::shared_ptr<grpc::Channel> channel =
          grpc::CreateCustomChannel(absl::GetFlag(FLAGS_coordinator),
                                    grpc::InsecureChannelCredentials(), args);
      stubs_.push_back(v1::Coordinator::NewStub(channel));
      raw_stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
    }
    sims_.reserve(n);
    for (int i = 0; i < n; ++i) {
      sims_.push_back(std::make_unique<Sim>());
      sims_.back()->index = i;
      sims_.back()->stub = stubs_[i / per].get();
      sims_.back()->raw = raw_stubs_[i / per].get();
    }
  }

  // Joins clients [begin, end), `concurrency` at a time, each polling as
  // soon as it joined; returns when every join answered.
  void JoinRange(int begin, int end, int concurrency) {
    next_join_ = begin;
    join_end_ = end;
    {
      absl::MutexLock lock(&mu_);
      joins_pending_ = end - begin;
    }
    for (int i = 0; i < concurrency && i < end - begin; ++i) JoinNext();
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return joins_pending_ == 0;
    };
    mu_.Await(absl::Condition(&all));
  }

  // Sends heartbeats: every joined client once per interval, spread evenly.
  void StartHeartbeats() {
    heartbeat_thread_ = std::thread([this] {
      const absl::Duration tick = absl::Milliseconds(100);
      size_t cursor = 0;
      double owed = 0;
      while (!stopping_.load()) {
        const absl::Duration interval =
            absl::Milliseconds(heartbeat_interval_ms_.load());
        owed += sims_.size() * absl::FDivDuration(tick, interval);
        while (owed >= 1) {
          owed -= 1;
          Sim* s = sims_[cursor++ % sims_.size()].get();
          if (!s->Identity().first.empty() && !s->done.load()) Heartbeat(s);
        }
        absl::SleepFor(tick);
      }
    });
  }

  bool AwaitDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return told_done_ == static_cast<int>(sims_.size());
    };
    return mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
  }

  void Stop() {
    stopping_ = true;
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  }

  // Counts an answer that came too late to count, by call and code.
  void Late(absl::string_view call, const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    late_.Add(call, s);
  }
  // Counts a failed call that is tried again.
  void Retried(absl::string_view call, const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    if (retried_.Add(call, s)) Say("retrying", call, s);
  }
  // Counts an unexpected status, by call and code; says the first of each at
  // once, so that a run that stalls shows why.
  void Error(absl::string_view call, const grpc::Status& s) {
    absl::MutexLock lock(&mu_);
    if (errors_.Add(call, s)) Say("error", call, s);
  }
  Tally Lates() {
    absl::MutexLock lock(&mu_);
    return late_;
  }
  Tally Retries() {
    absl::MutexLock lock(&mu_);
    return retried_;
  }
  Tally Errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }

  void Poll(Sim* s);
  // Joins `s`; a join that fails as the agent retries (IsRetryable) is
  // tried again after the agent's backoff, up to kJoinAttempts times. `then`
  // runs once, when the join succeeded or gave up.
  void Join(Sim* s, bool name_previous, std::function<void()> then,
            int attempt = 1);
  // The client starts over as a new process would: naming its previous
  // identity (a restart with its session file) or not (a new client).
  void Rejoin(Sim* s, bool name_previous);
  double Uniform();  // in [0, 1)
  bool Chance(double p);
  std::atomic<int> retired{0}, restarts{0}, departures{0};
  std::atomic<int64_t> latest_round{0};  // the latest TRAIN task's round
  void PollAt(Sim* s, absl::Time when) {
    timers_.At(when, [this, s] { Poll(s); });
  }
  void Push(Sim* s, int64_t round);
  void PushAt(absl::Time when, Sim* s, int64_t round) {
    timers_.At(when, [this, s, round] { Push(s, round); });
  }
  void Report(Sim* s, int64_t round);
  void Heartbeat(Sim* s);
  void JoinNext();

  // Heartbeat latencies (ms) of the beats sent in [from, to).
  Percentiles HeartbeatsSent(absl::Time from, absl::Time to) {
    std::vector<double> ms;
    absl::MutexLock lock(&beats_mu_);
    for (const auto& [sent, took] : beats_) {
      if (sent >= from && sent < to) ms.push_back(took);
    }
    return Of(std::move(ms));
  }

  // Called by the calls.
  void Downloaded(int64_t round, bool train) {
    absl::MutexLock lock(&mu_);
    if (!train) return;
    RoundSeen& r = rounds_[round];
    r.last_download = absl::Now();
    ++r.downloads;
  }
  void TaskHeader(int64_t round, bool train) {
    if (!train) return;
    int64_t latest = latest_round.load();
    while (round > latest &&
           !latest_round.compare_exchange_weak(latest, round)) {
    }
    absl::MutexLock lock(&mu_);
    RoundSeen& r = rounds_[round];
    r.first_task = std::min(r.first_task, absl::Now());
  }
  void PushSent(int64_t round) {
    absl::MutexLock lock(&mu_);
    rounds_[round].last_push_sent = absl::Now();
  }
  void Pushed(int64_t round, bool ok) {
    absl::MutexLock lock(&mu_);
    ++(ok ? rounds_[round].accepted : rounds_[round].rejected);
  }
  void ToldDone(Sim* s) {
    s->done = true;
    absl::MutexLock lock(&mu_);
    ++told_done_;
  }

  std::vector<std::unique_ptr<Sim>>& sims() { return sims_; }
  const ModelSpec& spec() const { return spec_; }
  // The update's chunk messages, serialized.
  const std::vector<grpc::Slice>& update() const { return update_; }
  absl::Time join_started, join_finished;

  std::map<int64_t, RoundSeen> Rounds() {
    absl::MutexLock lock(&mu_);
    return rounds_;
  }
  int64_t downloaded_bytes() const { return downloaded_bytes_.load(); }
  std::atomic<int64_t> downloaded_bytes_{0};
  std::atomic<int> verified{0};

 private:
  // Sets the model up from the first join: the update every client pushes.
  void Learn(const v1::JoinResponse& joined) {
    absl::MutexLock lock(&mu_);
    if (!update_.empty()) return;
    absl::StatusOr<ModelSpec> spec = FromProto(joined.model());
    if (!spec.ok()) {
      std::fprintf(stderr, "swarm: %s\n", spec.status().ToString().c_str());
      std::exit(1);
    }
    spec_ = *spec;
    heartbeat_interval_ms_ =
        std::max<int64_t>(100, joined.heartbeat_interval_ms());
    std::vector<float> delta(spec_.num_parameters);
    for (size_t i = 0; i < delta.size(); ++i) {
      delta[i] = (i % 2 == 0 ? 1e-4f : -1e-4f);
    }
    ChunkWriter writer(spec_, delta, kDefaultPushChunkBytes);
    v1::PushGradientRequest message;
    while (writer.Next(message.mutable_chunk())) {
      update_.push_back(SerializeToSlice(message));
      message.Clear();
    }
  }
  friend class JoinCall;

  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> raw_stubs_;
  std::vector<std::unique_ptr<Sim>> sims_;
  std::atomic<int> next_join_{0};
  int join_end_ = 0;
  std::atomic<int64_t> heartbeat_interval_ms_{5000};
  std::atomic<bool> stopping_{false};
  std::thread heartbeat_thread_;
  Timers timers_;

  absl::Mutex mu_;
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_){1};
  ModelSpec spec_;                   // set by the first join
  std::vector<grpc::Slice> update_;  // likewise, then read-only
  int joins_pending_ ABSL_GUARDED_BY(mu_) = 0;
  int told_done_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, RoundSeen> rounds_ ABSL_GUARDED_BY(mu_);
  Tally errors_ ABSL_GUARDED_BY(mu_);
  Tally late_ ABSL_GUARDED_BY(mu_);
  Tally retried_ ABSL_GUARDED_BY(mu_);
  // Every answered heartbeat: when it was sent, and its latency in ms. A
  // beat a client per interval: 16 bytes x N / 5 s, about 2 MB for 10,000
  // clients over a minute of idling and a minute of rounds.
  absl::Mutex beats_mu_;
  std::vector<std::pair<absl::Time, double>> beats_ ABSL_GUARDED_BY(beats_mu_);
};

// A push or report that arrived after its round or evaluation closed at
// quorum: the contract's answer, not an error (the coordinator cancels a
// push still streaming then, and turns a later one away).
bool IsLate(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::CANCELLED ||
         s.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
}

// A download the coordinator ended because its round (or async version)
// moved on before the weights were all sent: the contract's answer too.
bool IsRetired(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::CANCELLED &&
         absl::StrContains(s.error_message(), kMovedOnBeforeWeightsSent);
}

void Authorize(grpc::ClientContext* context, Sim& s) {
  context->AddMetadata("authorization",
                       absl::StrCat("Bearer ", s.Identity().second));
}

void Swarm::JoinNext() {
  const int i = next_join_.fetch_add(1);
  if (i >= join_end_) return;
  Join(sims_[i].get(), /*name_previous=*/false, [this] {
    JoinNext();
    absl::MutexLock lock(&mu_);
    --joins_pending_;
  });
}

// Starts the unary call `method` of `s`'s stub with `request`, within
// `timeout`, with its session token when `authorize`; `done` gets the status
// and the response once it ends.
template <typename Request, typename Response>
void CallUnary(Sim* s,
               void (v1::Coordinator::StubInterface::async_interface::*method)(
                   grpc::ClientContext*, const Request*, Response*,
                   std::function<void(grpc::Status)>),
               Request request, bool authorize, absl::Duration timeout,
               std::function<void(const grpc::Status&, const Response&)> done) {
  struct Call {
    grpc::ClientContext context;
    Request request;
    Response response;
  };
  auto* call = new Call;
  call->request = std::move(request);
  if (authorize) Authorize(&call->context, *s);
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  (s->stub->async()->*method)(&call->context, &call->request, &call->response,
                              [call, done](grpc::Status status) {
                                done(status, call->response);
                                delete call;
                              });
}

void Swarm::Join(Sim* s, bool name_previous, std::function<void()> then,
                 int attempt) {
  v1::JoinRequest request;
  request.set_display_name(absl::StrCat("swarm-", s->index));
  if (name_previous) {
    auto [id, token] = s->Identity();
    request.set_previous_client_id(id);
    request.set_previous_session_token(token);
  }
  CallUnary<v1::JoinRequest, v1::JoinResponse>(
      s, &v1::Coordinator::StubInterface::async_interface::Join,
      std::move(request), /*authorize=*/false, absl::Seconds(60),
      [this, s, name_previous, then, attempt](const grpc::Status& status,
                                              const v1::JoinResponse& joined) {
        if (status.ok()) {
          Learn(joined);
          {
            absl::MutexLock lock(&s->mu);
            s->id = joined.client_id();
            s->token = joined.session_token();
          }
          if (!joined.retired_client_id().empty()) ++retired;
          Poll(s);
        } else if (IsRetryable(FromGrpcStatus(status).code()) &&
                   attempt < kJoinAttempts) {
          Retried("Join", status);
          // The agent's defaults: 0.1 s doubling to at most 10 s.
          const absl::Duration backoff =
              Backoff(attempt - 1, absl::Milliseconds(100), absl::Seconds(10),
                      Uniform());
          timers_.At(absl::Now() + backoff,
                     [this, s, name_previous, then, attempt] {
                       Join(s, name_previous, then, attempt + 1);
                     });
          return;
        } else {
          Error("Join", status);
        }
        if (then) then();
      });
}

void Swarm::Rejoin(Sim* s, bool name_previous) {
  ++(name_previous ? restarts : departures);
  Join(s, name_previous, nullptr);
}

double Swarm::Uniform() {
  absl::MutexLock lock(&mu_);
  return std::uniform_real_distribution<double>(0, 1)(random_);
}

bool Swarm::Chance(double p) { return p > 0 && Uniform() < p; }

void Swarm::Heartbeat(Sim* s) {
  v1::HeartbeatRequest request;
  request.set_client_id(s->Identity().first);
  const absl::Time sent = absl::Now();
  CallUnary<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      s, &v1::Coordinator::StubInterface::async_interface::Heartbeat,
      std::move(request), /*authorize=*/true, absl::Seconds(30),
      [this, s, sent](const grpc::Status& status,
                      const v1::HeartbeatResponse&) {
        if (status.ok()) {
          const double ms = absl::ToDoubleMilliseconds(absl::Now() - sent);
          absl::MutexLock lock(&beats_mu_);
          beats_.emplace_back(sent, ms);
        } else if (!s->done.load()) {
          // A client told DONE may race its last beat.
          Error("Heartbeat", status);
        }
      });
}

void Swarm::Report(Sim* s, int64_t round) {
  v1::ReportEvalRequest request;
  request.set_client_id(s->Identity().first);
  request.set_round(round);
  request.set_test_loss(2.3);
  request.set_test_accuracy(0.1);
  request.set_num_examples(100);
  CallUnary<v1::ReportEvalRequest, v1::ReportEvalResponse>(
      s, &v1::Coordinator::StubInterface::async_interface::ReportEval,
      std::move(request), /*authorize=*/true, absl::Seconds(30),
      [this, s](const grpc::Status& status, const v1::ReportEvalResponse&) {
        if (IsLate(status)) {
          Late("ReportEval", status);
        } else if (!status.ok()) {
          Error("ReportEval", status);
        }
        Poll(s);
      });
}

// The methods swarm calls with raw messages (see the top of the file).
constexpr char kRequestUpdateMethod[] =
    "/fedlearn.v1.Coordinator/RequestUpdate";
constexpr char kPushGradientMethod[] = "/fedlearn.v1.Coordinator/PushGradient";

// A long poll and, for TRAIN and EVALUATE, the weights that follow: the
// server-streaming RequestUpdate, called as a stream that sends its one
// request and then only reads.
class PollCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PollCall(Swarm* swarm, Sim* s) : swarm_(swarm), s_(s) {
    Authorize(&context_, *s);
    const absl::Duration max_wait = absl::GetFlag(FLAGS_max_wait);
    // A leaving client's poll is cut off from its side after 100 ms: to the
    // coordinator, the hang-up of a process that exited.
    leaving_ = s->leaving.exchange(false);
    context_.set_deadline(absl::ToChronoTime(
        absl::Now() +
        (leaving_ ? absl::Milliseconds(100) : max_wait + absl::Minutes(5))));
    v1::RequestUpdateRequest request;
    request.set_client_id(s->Identity().first);
    request.set_max_wait_ms(absl::ToInt64Milliseconds(max_wait));
    const grpc::Slice serialized = SerializeToSlice(request);
    request_ = grpc::ByteBuffer(&serialized, 1);
    s->raw->PrepareBidiStreamingCall(&context_, kRequestUpdateMethod,
                                     grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (!have_task_) {
      v1::TaskMessage header;
      if (!grpc::SerializationTraits<v1::TaskMessage>::Deserialize(&message_,
                                                                   &header)
               .ok() ||
          !header.has_task()) {
        Malformed("the first message is not a task");
        return;
      }
      have_task_ = true;
      task_ = header.task();
      swarm_->TaskHeader(task_.round(), task_.type() == v1::TASK_TYPE_TRAIN);
      const int every = absl::GetFlag(FLAGS_verify_every);
      if (task_.payload_bytes() > 0 && every > 0 && s_->index % every == 0) {
        weights_.resize(swarm_->spec().num_parameters);
        assembler_.emplace(swarm_->spec(), absl::MakeSpan(weights_),
                           /*require_finite=*/true);
      }
    } else if (!Chunk()) {
      Malformed("after the task a message that is not a chunk");
      return;
    }
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    swarm_->downloaded_bytes_ += received_;
    Finish(status);
    delete this;
  }

 private:
  // A weights chunk, read where gRPC received it; protobuf parses only a
  // message of another shape. False for a message that is not a chunk.
  bool Chunk() {
    const bool in_place =
        ViewMessage(message_, &slices_, &pieces_) &&
        ReadChunkInPlace(pieces_, v1::TaskMessage::kChunkFieldNumber, &chunk_);
    v1::TaskMessage parsed;
    if (!in_place && (!grpc::SerializationTraits<v1::TaskMessage>::Deserialize(
                           &message_, &parsed)
                           .ok() ||
                      !parsed.has_chunk())) {
      return false;
    }
    const absl::string_view data = parsed.chunk().data();
    const absl::Span<const absl::string_view> pieces =
        in_place ? absl::MakeConstSpan(chunk_.data)
                 : absl::MakeConstSpan(&data, 1);
    for (absl::string_view piece : pieces) {
      received_ += static_cast<int64_t>(piece.size());
    }
    if (assembler_.has_value() && verify_error_.ok()) {
      verify_error_ =
          assembler_->Add(in_place ? chunk_.fields : parsed.chunk(), pieces);
    }
    slices_.clear();  // gRPC's buffers are let go before the next read
    pieces_.clear();
    message_.Clear();
    return true;
  }

  // Ends a download that breaks the contract; OnDone reports it.
  void Malformed(absl::string_view what) {
    malformed_ = std::string(what);
    context_.TryCancel();
  }

  void Finish(const grpc::Status& status) {
    if (leaving_ &&
        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      swarm_->Rejoin(s_, /*name_previous=*/false);
      return;
    }
    if (!malformed_.empty()) {
      swarm_->Error("RequestUpdate",
                    grpc::Status(grpc::StatusCode::DATA_LOSS, malformed_));
      swarm_->PollAt(s_, absl::Now() + absl::Seconds(1));
      return;
    }
    // Its round or evaluation closed while the weights were on their way:
    // the download ended at its next chunk saying so, or, its next chunk
    // waiting for this client to read what was buffered, was cut off a
    // second later, which only says CANCELLED (a TRAIN download's round is
    // then behind the latest task's; an evaluation's report could no longer
    // count). A stall cut-off says CANCELLED too: swarm.sh counts those from
    // the coordinator's /metrics. Poll again after the agent's first backoff.
    const bool cut_off = status.error_code() == grpc::StatusCode::CANCELLED &&
                         have_task_ && task_.payload_bytes() > 0;
    const bool moved_on =
        IsRetired(status) ||
        (cut_off && (task_.type() == v1::TASK_TYPE_EVALUATE ||
                     task_.round() < swarm_->latest_round.load()));
    if (moved_on) {
      swarm_->Late("RequestUpdate", status);
      swarm_->PollAt(s_, absl::Now() + absl::Milliseconds(100));
      return;
    }
    if (!status.ok() || !have_task_) {
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
          !s_->done.load()) {
        swarm_->Error("RequestUpdate", status);
      }
      // Try again later, as an agent's backoff would.
      swarm_->PollAt(s_, absl::Now() + absl::Seconds(1));
      return;
    }
    const bool weights = task_.payload_bytes() > 0;
    if (weights && received_ != task_.payload_bytes()) {
      swarm_->Error(
          "RequestUpdate",
          grpc::Status(grpc::StatusCode::DATA_LOSS,
                       absl::StrCat("received ", received_, " of ",
                                    task_.payload_bytes(), " bytes")));
    }
    if (assembler_.has_value()) {
      if (absl::Status s =
              verify_error_.ok() ? assembler_->Finish() : verify_error_;
          !s.ok()) {
        swarm_->Error("RequestUpdate", grpc::Status(grpc::StatusCode::DATA_LOSS,
                                                    std::string(s.message())));
      } else {
        ++swarm_->verified;
      }
    }
    switch (task_.type()) {
      case v1::TASK_TYPE_TRAIN:
        swarm_->Downloaded(task_.round(), true);
        swarm_->Push(s_, task_.round());
        break;
      case v1::TASK_TYPE_EVALUATE:
        swarm_->Report(s_, task_.round());
        break;
      case v1::TASK_TYPE_DONE:
        swarm_->ToldDone(s_);
        break;
      default:  // WAIT
        s_->leaving = swarm_->Chance(absl::GetFlag(FLAGS_churn));
        swarm_->PollAt(
            s_, absl::Now() + absl::Milliseconds(task_.retry_after_ms()));
    }
  }

  Swarm* const swarm_;
  Sim* const s_;
  bool leaving_ = false;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer message_;  // the message being read
  std::vector<grpc::Slice> slices_;
  std::vector<absl::string_view> pieces_;
  ChunkInPlace chunk_;
  bool have_task_ = false;
  v1::Task task_;
  int64_t received_ = 0;
  std::vector<float> weights_;
  std::optional<ChunkAssembler> assembler_;
  absl::Status verify_error_;
  std::string malformed_;  // set when a download breaks the contract
};

void Swarm::Poll(Sim* s) {
  if (s->done.load()) return;
  new PollCall(this, s);
}

// A push of the shared update: the header, then every chunk, on the
// client-streaming PushGradient called as a stream that reads one reply (its
// fields are not used: the status says what happened).
class PushCall final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  PushCall(Swarm* swarm, Sim* s, int64_t round)
      : swarm_(swarm),
        s_(s),
        round_(round),
        killed_(swarm->Chance(absl::GetFlag(FLAGS_kill_push))) {
    Authorize(&context_, *s);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(5)));
    v1::PushGradientRequest header;
    v1::UpdateHeader* h = header.mutable_header();
    h->set_client_id(s->Identity().first);
    h->set_round(round);
    h->set_num_examples(600);
    h->set_train_loss(0.5);
    h->set_train_accuracy(0.9);
    h->set_encoding(v1::ENCODING_DENSE);
    const grpc::Slice serialized = SerializeToSlice(header);
    out_ = grpc::ByteBuffer(&serialized, 1);
    s->raw->PrepareBidiStreamingCall(&context_, kPushGradientMethod,
                                     grpc::StubOptions(), this);
    StartWrite(&out_);
    StartRead(&reply_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the coordinator ended the push; OnDone says why
    const auto& chunks = swarm_->update();
    if (killed_ && next_ == 1) {
      context_.TryCancel();  // the process died with its first chunk sent
      return;
    }
    if (next_ < chunks.size()) {
      out_ = grpc::ByteBuffer(&chunks[next_++], 1);  // a reference, no copy
      StartWrite(&out_);
    } else {
      swarm_->PushSent(round_);
      StartWritesDone();
    }
  }

  void OnDone(const grpc::Status& status) override {
    if (killed_ && !status.ok()) {
      swarm_->Rejoin(s_, /*name_previous=*/true);
      delete this;
      return;
    }
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // Preempted for the staging buffer ("push it again"): the agent pushes
      // the same update again after a short jittered pause; if the round has
      // closed by then, that push is late.
      swarm_->Retried("PushGradient", status);
      swarm_->PushAt(
          absl::Now() + absl::Milliseconds(100 + 100 * swarm_->Uniform()), s_,
          round_);
      delete this;
      return;
    }
    swarm_->Pushed(round_, status.ok());
    if (!status.ok()) {
      if (IsLate(status)) {
        swarm_->Late("PushGradient", status);
      } else {
        swarm_->Error("PushGradient", status);
      }
    }
    s_->leaving = swarm_->Chance(absl::GetFlag(FLAGS_churn));
    swarm_->Poll(s_);
    delete this;
  }

 private:
  Swarm* const swarm_;
  Sim* const s_;
  const int64_t round_;
  const bool killed_;
  grpc::ClientContext context_;
  grpc::ByteBuffer out_;    // the message being written
  grpc::ByteBuffer reply_;  // the PushGradientResponse
  size_t next_ = 0;
};

void Swarm::Push(Sim* s, int64_t round) { new PushCall(this, s, round); }

// Joins, idle, rounds: each phase prints its lines as it ends.
int Run() {
  if (absl::GetFlag(FLAGS_status_only)) {
    return PrintStatus(absl::GetFlag(FLAGS_coordinator));
  }
  const int n = absl::GetFlag(FLAGS_clients);
  const int pid = absl::GetFlag(FLAGS_coordinator_pid);
  Swarm swarm;
  const int64_t rss_before = pid > 0 ? RssKb(pid) : 0;

  const absl::Time join_start = absl::Now();
  swarm.JoinRange(0, n, absl::GetFlag(FLAGS_join_concurrency));
  const absl::Duration join_time = absl::Now() - join_start;
  const double joins_per_s = n / absl::ToDoubleSeconds(join_time);
  std::printf("clients %d (%d per connection), model %s (%" PRId64
              " parameters)\n",
              n, absl::GetFlag(FLAGS_clients_per_connection),
              swarm.spec().name.c_str(), swarm.spec().num_parameters);
  std::printf("joins: %.0f/s (%d in %.2f s)\n", joins_per_s, n,
              absl::ToDoubleSeconds(join_time));
  if (absl::GetFlag(FLAGS_heartbeat)) swarm.StartHeartbeats();
  ProbeProcess prober(absl::GetFlag(FLAGS_coordinator),
                      absl::GetFlag(FLAGS_http_port));
  // By `renewal` every client has renewed its poll once; an idle window of
  // zero is that long.
  const absl::Duration renewal =
      absl::GetFlag(FLAGS_max_wait) + absl::Seconds(12);
  const absl::Duration window = absl::GetFlag(FLAGS_idle_seconds);
  const IdleFigures idle =
      Idle(n, pid, rss_before,
           window == absl::ZeroDuration() ? renewal : window, renewal);

  // The starter: one more client, and the first round opens.
  const absl::Time rounds_start = absl::Now();
  // The coordinator's resources at each round (--sample_rounds).
  std::vector<ResourceSample> samples;
  std::atomic<bool> sampling{absl::GetFlag(FLAGS_sample_rounds) && pid > 0};
  std::thread sampler([&] {
    int64_t last = 0;
    while (sampling.load()) {
      const int64_t round = swarm.latest_round.load();
      if (round > last) {
        samples.push_back(ReadResources(pid, static_cast<double>(round)));
        last = round;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  swarm.JoinRange(n, n + 1, 1);
  const bool done = swarm.AwaitDone(absl::GetFlag(FLAGS_timeout));
  sampling = false;
  sampler.join();
  const absl::Time rounds_end = absl::Now();
  const absl::Duration run_time = rounds_end - rounds_start;
  const int64_t rss_end = pid > 0 ? RssKb(pid) : 0;
  swarm.Stop();

  const RoundMedians medians = PrintRounds(swarm.Rounds());
  const Tally errors = swarm.Errors();
  int64_t error_count = errors.Total();
  for (const std::string& line : prober.Finish(&error_count)) {
    std::printf("%s\n", line.c_str());
  }
  // What a round's work makes a liveness call wait: the coordinator counts a
  // client gone after --client_timeout (20 s) without a beat or a poll.
  for (const auto& [label, from, to] :
       {std::tuple{"Heartbeat idle", join_start, rounds_start},
        std::tuple{"Heartbeat in rounds", rounds_start, rounds_end}}) {
    const Percentiles beats = swarm.HeartbeatsSent(from, to);
    if (beats.n == 0) continue;
    std::printf("%-20s p50 %7.2f ms  p99 %7.2f ms  max %7.1f ms  (%zu calls)\n",
                label, beats.p50, beats.p99, beats.max, beats.n);
  }
  swarm.Lates().Print("late (after its round closed at quorum)");
  swarm.Retries().Print("retried");
  errors.Print("error");
  if (!samples.empty()) PrintRoundSamples(samples);
  if (pid > 0) {
    std::printf("coordinator RSS at the end: %.1f MiB\n", rss_end / 1024.0);
  }
  std::printf(
      "clients restarted after a killed push %d, left and replaced %d, "
      "identities retired %d\n",
      swarm.restarts.load(), swarm.departures.load(), swarm.retired.load());
  std::printf("downloaded %.1f MB; %d downloads verified chunk by chunk\n",
              swarm.downloaded_bytes() / 1e6, swarm.verified.load());
  std::printf("run %s in %.1f s after the first round opened\n",
              done ? "DONE" : "NOT DONE", absl::ToDoubleSeconds(run_time));
  // Machine-readable: one line.
  std::printf(
      "swarm_result n=%d joins_per_s=%.0f rss_per_client_kb=%.1f "
      "idle_cpu=%.3f fanout_s=%.3f close_to_next_s=%.3f round_overhead_s=%.3f "
      "errors=%" PRId64 " done=%d\n",
      n, joins_per_s, idle.KbPerClient(n), idle.cpu, medians.fanout,
      medians.close_to_next, medians.round, error_count, done ? 1 : 0);
  return done && error_count == 0 ? 0 : 1;
}

}  // namespace
}  // namespace fedlearn

int main(int argc, char** argv) {
  // bench/swarm.sh tees the report into a pipe: each phase's lines as it
  // ends, not all of them when the run does, minutes later.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  fedlearn::ParseFlags(argc, argv,
                       "swarm --coordinator=HOST:PORT --clients=N [flags]");
  return fedlearn::Run();
}
