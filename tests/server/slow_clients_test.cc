// What a slow or stalled client can no longer do to the others, over real
// loopback sockets with scripted clients: uploads that stall after their first
// chunk or trickle do not keep the other updates of a round from being
// received (StagingPool::Reclaim), and a client that reads its weights at a
// trickle, or stops reading, holds only its own stream (README, "Slow
// clients").

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/sync_stream.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "common/tensor_codec.h"
#include "fedlearn/v1/coordinator.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/coordinator_service.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"

namespace fedlearn {
namespace {

using ::fedlearn::testing::Header;
using ::fedlearn::testing::NextTask;
using ::fedlearn::testing::SmallRun;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr int kSelected = 10;

class SlowClientsTest : public ::testing::Test {
 protected:
  // Ten clients, all selected for round 1, tolerance 0.3 (quorum 7), two
  // receive buffers (fewer than the slow clients, so that they must be taken
  // back), and a deadline far beyond anything a round at quorum takes here: a
  // round that waits for the slow ones is abandoned there, and the test fails.
  void Start(CoordinatorOptions o = SmallRun(), int max_rounds = 2) {
    o.max_concurrent_updates = 2;
    o.min_clients = kSelected;
    o.clients_per_round = kSelected;
    o.tolerance = 0.3;
    o.max_rounds = max_rounds;
    o.round_timeout = absl::Seconds(40);
    channel_ = testing::StartCoordinator(o, &server_);
    ASSERT_NE(channel_, nullptr);
    stub_ = v1::Coordinator::NewStub(channel_);
    for (int i = 0; i < kSelected; ++i) {
      clients_.push_back(std::make_unique<CoordinatorClient>(channel_));
      ASSERT_TRUE(clients_.back()->Join(v1::JoinRequest()).ok());
    }
  }

  // The push messages of `client`: its header for round 1, then `delta` in
  // 64 KiB chunks.
  std::vector<v1::PushGradientRequest> Messages(
      const CoordinatorClient& client, const std::vector<float>& delta) {
    std::vector<v1::PushGradientRequest> messages(1);
    *messages[0].mutable_header() = Header(1, 100, 1.0);
    messages[0].mutable_header()->set_client_id(client.client_id());
    ChunkWriter writer(client.spec(), delta, 64 << 10);
    v1::PushGradientRequest m;
    while (writer.Next(m.mutable_chunk())) messages.push_back(m);
    return messages;
  }

  // A stub on a connection of its own, whose receive window opens only as far
  // as its reader reads (no BDP probing, 64 KiB of lookahead): gRPC's defaults
  // would take in a whole download on the client's side while a test sleeps.
  std::unique_ptr<v1::Coordinator::Stub> SlowReaderStub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(4 << 20);
    return v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                  grpc::InsecureChannelCredentials(), args));
  }

  void Authorize(const CoordinatorClient& client,
                 grpc::ClientContext* context) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", client.session_token()));
  }

  // How a download read one message every `pause` went.
  struct SlowRead {
    grpc::Status status;
    absl::Time ended;
    int chunks = 0;     // weights chunks read
    int64_t round = 0;  // the task's
    v1::TaskType type = v1::TASK_TYPE_UNSPECIFIED;
  };
  // Polls for `client` on `stub` and reads what comes one message every
  // `pause` until the coordinator ends the stream; notifies `has_task` once
  // the task's header is read (unless null).
  SlowRead ReadSlowly(v1::Coordinator::Stub& stub,
                      const CoordinatorClient& client, absl::Duration pause,
                      absl::Notification* has_task) {
    SlowRead read;
    grpc::ClientContext context;
    Authorize(client, &context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::RequestUpdateRequest request;
    request.set_client_id(client.client_id());
    auto reader = stub.RequestUpdate(&context, request);
    v1::TaskMessage message;
    while (reader->Read(&message)) {
      if (message.has_task()) {
        read.round = message.task().round();
        read.type = message.task().type();
        if (has_task != nullptr) has_task->Notify();
      }
      if (message.has_chunk()) ++read.chunks;
      absl::SleepFor(pause);
    }
    read.status = reader->Finish();
    read.ended = absl::Now();
    return read;
  }

  // Clients 1 to 7 take round 1's TRAIN task and push 0.5 everywhere, which
  // closes it at quorum; returns once it is in the history.
  void CloseRoundOneWithSeven() {
    for (int i = 1; i <= 7; ++i) {
      CoordinatorClient& c = *clients_[i];
      ASSERT_EQ(NextTask(c).task.type(), v1::TASK_TYPE_TRAIN);
      const std::vector<float> delta(c.spec().num_parameters, 0.5f);
      EXPECT_TRUE(c.PushUpdate(Header(1, 100, 1.0), delta).ok());
    }
    ASSERT_TRUE(server_->controller().AwaitHistory(1, testing::kWait));
  }

  // Client 0 polling on a connection of its own (SlowReaderStub) and reading
  // what comes a message every 200 ms until the coordinator ends the stream:
  // ReadSlowly on a thread; `read` holds how it went once that is joined.
  std::thread ClientZeroReadsSlowly(SlowRead* read,
                                    absl::Notification* has_task) {
    slow_stub_ = SlowReaderStub();
    return std::thread([this, read, has_task] {
      *read = ReadSlowly(*slow_stub_, *clients_[0], absl::Milliseconds(200),
                         has_task);
    });
  }

  // Pushes `client`'s update one message at a time, `pause` after each
  // chunk, but sends only the header and `max_chunks` chunks; then waits,
  // silent and without closing its side, for the coordinator to end the call.
  // Returns the push's status.
  grpc::Status SlowPush(const CoordinatorClient& client, absl::Duration pause,
                        int max_chunks) {
    grpc::ClientContext context;
    Authorize(client, &context);
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::PushGradientResponse response;
    auto writer = stub_->PushGradient(&context, &response);
    const std::vector<v1::PushGradientRequest> messages =
        Messages(client, std::vector<float>(client.spec().num_parameters, 1));
    bool open = writer->Write(messages[0]);
    for (int i = 1;
         open && i <= max_chunks && i < static_cast<int>(messages.size());
         ++i) {
      open = writer->Write(messages[i]);
      absl::SleepFor(pause);
    }
    return writer->Finish();  // no WritesDone: the stream stays open
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::vector<std::unique_ptr<CoordinatorClient>> clients_;
  std::unique_ptr<v1::Coordinator::Stub> slow_stub_;  // ClientZeroReadsSlowly
};

TEST_F(SlowClientsTest, StalledAndTricklingUploadsDoNotHoldTheRound) {
  Start();
  for (auto& c : clients_) {
    ASSERT_EQ(NextTask(*c).task.type(), v1::TASK_TYPE_TRAIN);
  }
  const std::vector<float> before = *server_->controller().global_weights();
  // Three of the ten go first and take both receive buffers (and the queue):
  // two stall after their first chunk, one sends a 64 KiB chunk every 500 ms
  // (128 KiB/s, below the default --min_upload_rate of 1 MiB/s).
  std::vector<grpc::Status> slow(3);
  std::vector<std::thread> slow_threads;
  slow_threads.emplace_back(
      [&] { slow[0] = SlowPush(*clients_[0], absl::ZeroDuration(), 1); });
  slow_threads.emplace_back(
      [&] { slow[1] = SlowPush(*clients_[1], absl::ZeroDuration(), 1); });
  slow_threads.emplace_back(
      [&] { slow[2] = SlowPush(*clients_[2], absl::Milliseconds(500), 1000); });
  // Until they hold both buffers and the third waits for one: the seven
  // fast pushes then queue behind them.
  const absl::Time deadline = absl::Now() + testing::kWait;
  while ((server_->service().staging().in_use() < 2 ||
          server_->service().staging().waiting() < 1) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(server_->service().staging().in_use(), 2);
  // The seven others push whole updates of 0.5 at once.
  std::vector<std::thread> fast;
  std::atomic<int> accepted{0};
  for (int i = 3; i < kSelected; ++i) {
    fast.emplace_back([&, i] {
      const std::vector<float> delta(clients_[i]->spec().num_parameters, 0.5f);
      auto pushed = clients_[i]->PushUpdate(Header(1, 100, 1.0), delta);
      EXPECT_TRUE(pushed.ok()) << pushed.status();
      if (pushed.ok()) accepted.fetch_add(1);
    });
  }
  for (std::thread& t : fast) t.join();
  EXPECT_EQ(accepted.load(), 7);
  for (std::thread& t : slow_threads) t.join();

  // The round closed at quorum with the seven whole updates and nothing of
  // the slow ones: every weight moved by exactly 0.5.
  ASSERT_TRUE(server_->controller().AwaitHistory(1, testing::kWait));
  const v1::GetStatusResponse status = server_->controller().GetStatus();
  const v1::RoundRecord& round = status.history(0);
  EXPECT_EQ(round.outcome(), "quorum");
  EXPECT_EQ(round.responded(), 7);
  EXPECT_GE(round.rejected().too_slow(), 1);
  const std::vector<float> after = *server_->controller().global_weights();
  for (size_t j = 0; j < after.size(); ++j) {
    ASSERT_EQ(after[j], static_cast<float>(double{before[j]} + 0.5)) << j;
  }
  // Each slow push was cut off: preempted with a message saying why, or, if
  // it still held no buffer, when the round closed.
  for (const grpc::Status& s : slow) {
    EXPECT_THAT(s.error_code(), AnyOf(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                      grpc::StatusCode::CANCELLED))
        << s.error_message();
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      EXPECT_THAT(s.error_message(), AnyOf(HasSubstr("upload too slow"),
                                           HasSubstr("upload stalled")));
      EXPECT_THAT(s.error_message(), HasSubstr("push it again"));
    }
  }
}

TEST_F(SlowClientsTest, AStalledUploadIsCutOffWhenNobodyWaits) {
  CoordinatorOptions o = SmallRun();
  o.stall_timeout = absl::Seconds(1);
  Start(o);
  ASSERT_EQ(NextTask(*clients_[0]).task.type(), v1::TASK_TYPE_TRAIN);
  // Alone, with buffers to spare: only its own silence ends it.
  const grpc::Status s = SlowPush(*clients_[0], absl::ZeroDuration(), 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("client ", clients_[0]->client_id(),
                                     ": upload stalled: nothing received")));
  // The buffer is free again, and the client may push its update after all.
  const std::vector<float> delta(clients_[0]->spec().num_parameters, 0.25f);
  EXPECT_TRUE(clients_[0]->PushUpdate(Header(1, 100, 1.0), delta).ok());
  EXPECT_EQ(
      server_->controller().GetStatus().current_round().rejected().too_slow(),
      1);
}

TEST_F(SlowClientsTest, ATrickleOrStalledDownloadHoldsOnlyItsOwnStream) {
  CoordinatorOptions o = SmallRun();
  o.model = "mnist_cnn";  // 4.8 MB of weights: no buffer swallows them whole
  o.stall_timeout = absl::Seconds(2);
  Start(o);
  // Clients 0 and 1 read their TRAIN weights one 64 KiB chunk a second until
  // the round is over; client 2 reads the header, stops reading for twice
  // --stall_timeout, then reads as fast as it can.
  auto slow_stub = SlowReaderStub();
  std::vector<grpc::Status> slow(3);
  std::vector<int> chunks_read(3, 0);
  std::atomic<bool> round_over{false};
  std::vector<std::thread> slow_threads;
  for (int i = 0; i < 3; ++i) {
    slow_threads.emplace_back([&, i] {
      grpc::ClientContext context;
      Authorize(*clients_[i], &context);
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      v1::RequestUpdateRequest request;
      request.set_client_id(clients_[i]->client_id());
      auto reader = slow_stub->RequestUpdate(&context, request);
      v1::TaskMessage message;
      while ((i == 2 || !round_over.load()) && reader->Read(&message)) {
        if (message.has_chunk()) ++chunks_read[i];
        if (i == 2) {
          if (message.has_task()) absl::SleepFor(absl::Seconds(4));
        } else {
          absl::SleepFor(absl::Seconds(1));
        }
      }
      if (i != 2) context.TryCancel();
      slow[i] = reader->Finish();
    });
  }
  // The seven others download and push as usual, and close the round.
  for (int i = 3; i < kSelected; ++i) {
    CoordinatorClient& c = *clients_[i];
    ASSERT_EQ(NextTask(c).task.type(), v1::TASK_TYPE_TRAIN);
    const std::vector<float> delta(c.spec().num_parameters, 0.5f);
    EXPECT_TRUE(c.PushUpdate(Header(1, 100, 1.0), delta).ok());
  }
  ASSERT_TRUE(server_->controller().AwaitHistory(1, testing::kWait));
  EXPECT_EQ(server_->controller().GetStatus().history(0).outcome(), "quorum");
  round_over = true;
  for (std::thread& t : slow_threads) t.join();
  // The trickling readers were still reading when the round closed, far from
  // the weights' 74 chunks.
  EXPECT_LT(chunks_read[0], 74);
  EXPECT_LT(chunks_read[1], 74);
  // The one that stopped reading was cut off after --stall_timeout: when it
  // read again, what was buffered on its side was all it got.
  EXPECT_LT(chunks_read[2], 74);
  EXPECT_EQ(slow[2].error_code(), grpc::StatusCode::CANCELLED)
      << slow[2].error_message();
}

TEST_F(SlowClientsTest, ADownloadOfAClosedRoundEndsSoonAfter) {
  CoordinatorOptions o = SmallRun();
  o.model = "mnist_cnn";  // 80 chunks of at most 64 KiB
  // Far beyond the test's bound below: the watchdog is not what ends it.
  o.stall_timeout = absl::Seconds(60);
  Start(o);
  // Client 0 reads its TRAIN weights one chunk every 200 ms and goes on
  // reading until the coordinator ends the stream.
  SlowRead slow;
  absl::Notification has_task;
  std::thread slow_thread = ClientZeroReadsSlowly(&slow, &has_task);
  // /metrics shows what it holds: one download, of one model version.
  ASSERT_TRUE(has_task.WaitForNotificationWithTimeout(testing::kWait));
  TransferStats held = server_->service().transfers();
  EXPECT_EQ(held.downloads, 1);
  EXPECT_EQ(held.download_versions, 1);
  EXPECT_EQ(held.download_version_bytes,
            clients_[0]->spec().num_parameters * 4);
  // Seven others close round 1 at quorum; clients 8 and 9 stay silent.
  CloseRoundOneWithSeven();
  const absl::Time closed = absl::Now();
  EXPECT_EQ(server_->controller().GetStatus().history(0).outcome(), "quorum");
  slow_thread.join();
  // Its round gone, the download ended soon after (not after
  // --stall_timeout), long before the weights were all sent: at its next
  // chunk, saying why, or, when that chunk waits for the reader to take what
  // is buffered for it (gRPC's client updates a slow reader's window lazily),
  // cut off a second after the close.
  EXPECT_EQ(slow.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_THAT(slow.status.error_message(),
              AnyOf(AllOf(HasSubstr(clients_[0]->client_id()),
                          HasSubstr("round 1 moved on before its weights were "
                                    "all sent")),
                    HasSubstr("Cancelled on the server side")));
  EXPECT_EQ(slow.round, 1);
  EXPECT_LT(slow.chunks, 80);
  EXPECT_LT(slow.ended - closed, absl::Seconds(15));
  // Counted as ended by the run moving on, and holding nothing now.
  held = server_->service().transfers();
  EXPECT_EQ(held.downloads_moved_on, 1);
  EXPECT_EQ(held.downloads_stalled, 0);
  EXPECT_EQ(held.downloads, 0);
  EXPECT_EQ(held.download_versions, 0);
}

TEST_F(SlowClientsTest, AnEvaluationDownloadEndsSoonAfterTheEvaluationCloses) {
  CoordinatorOptions o = SmallRun();
  o.model = "mnist_cnn";
  o.stall_timeout = absl::Seconds(60);
  Start(o, /*max_rounds=*/1);
  // Round 1 closes at quorum with seven updates, and training stops there.
  CloseRoundOneWithSeven();
  ASSERT_EQ(server_->controller().GetStatus().phase(), v1::PHASE_EVALUATING);
  // Client 0 reads its EVALUATE weights a chunk every 200 ms.
  SlowRead slow;
  absl::Notification has_task;
  std::thread slow_thread = ClientZeroReadsSlowly(&slow, &has_task);
  ASSERT_TRUE(has_task.WaitForNotificationWithTimeout(testing::kWait));
  // The others report until the evaluation closes at quorum.
  for (int i = 1; i < kSelected && server_->controller().GetStatus().phase() ==
                                       v1::PHASE_EVALUATING;
       ++i) {
    testing::Evaluate(*clients_[i], 0.5, 0.9, 100);
  }
  ASSERT_TRUE(server_->controller().AwaitHistory(2, testing::kWait));
  const absl::Time closed = absl::Now();
  EXPECT_EQ(server_->controller().GetStatus().phase(), v1::PHASE_DONE);
  slow_thread.join();
  // Its report could no longer count: the download ended soon after, long
  // before the weights were all sent (80 chunks, 16 s).
  EXPECT_EQ(slow.type, v1::TASK_TYPE_EVALUATE);
  EXPECT_EQ(slow.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_THAT(slow.status.error_message(),
              AnyOf(HasSubstr("moved on before its weights were all sent"),
                    HasSubstr("Cancelled on the server side")));
  EXPECT_LT(slow.chunks, 80);
  EXPECT_LT(slow.ended - closed, absl::Seconds(10));
  EXPECT_EQ(server_->service().transfers().downloads_moved_on, 1);
}

TEST_F(SlowClientsTest, AStalledDownloadIsCutOffAndCounted) {
  CoordinatorOptions o = SmallRun();
  o.model = "mnist_cnn";
  o.stall_timeout = absl::Seconds(1);
  Start(o);
  // Client 0 reads its task's header and then nothing for three seconds;
  // the round stays open (nobody pushes), so only the stall can end it.
  auto slow_stub = SlowReaderStub();
  grpc::ClientContext context;
  Authorize(*clients_[0], &context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::RequestUpdateRequest request;
  request.set_client_id(clients_[0]->client_id());
  auto reader = slow_stub->RequestUpdate(&context, request);
  v1::TaskMessage message;
  ASSERT_TRUE(reader->Read(&message));
  ASSERT_EQ(message.task().type(), v1::TASK_TYPE_TRAIN);
  EXPECT_EQ(server_->service().transfers().downloads, 1);
  const absl::Time deadline = absl::Now() + testing::kWait;
  while (server_->service().transfers().downloads_stalled == 0 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const TransferStats after = server_->service().transfers();
  EXPECT_EQ(after.downloads_stalled, 1);
  EXPECT_EQ(after.downloads_moved_on, 0);
  EXPECT_EQ(after.downloads, 0);
  EXPECT_EQ(after.download_versions, 0);
  // Reading again, the client gets what was buffered on its side, then the
  // cut.
  int chunks = 0;
  while (reader->Read(&message)) ++chunks;
  EXPECT_LT(chunks, 80);
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(SlowClientsTest, AnAsyncDownloadTooStaleToCountEndsSoonAfter) {
  CoordinatorOptions o = SmallRun();
  o.mode = Mode::kAsync;  // a version per update
  o.model = "mnist_cnn";
  o.max_staleness = 1;
  o.stall_timeout = absl::Seconds(60);
  Start(o, /*max_rounds=*/10);  // training goes on past the test
  // Client 0 takes round 1 (version 0) and reads it a chunk every 200 ms.
  SlowRead slow;
  absl::Notification has_task;
  std::thread slow_thread = ClientZeroReadsSlowly(&slow, &has_task);
  ASSERT_TRUE(has_task.WaitForNotificationWithTimeout(testing::kWait));
  // Two updates make versions 1 and 2. At version 1 an update for round 1
  // would be 1 stale and still taken; at version 2 it would not.
  for (int i = 1; i <= 2; ++i) {
    CoordinatorClient& c = *clients_[i];
    const CoordinatorClient::ReceivedTask task = NextTask(c);
    ASSERT_EQ(task.task.type(), v1::TASK_TYPE_TRAIN);
    const std::vector<float> delta(c.spec().num_parameters, 0.5f);
    EXPECT_TRUE(c.PushUpdate(Header(task.task.round(), 100, 1.0), delta).ok());
  }
  ASSERT_TRUE(server_->controller().AwaitHistory(2, testing::kWait));
  const absl::Time too_stale = absl::Now();
  slow_thread.join();
  EXPECT_EQ(slow.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_THAT(slow.status.error_message(),
              AnyOf(HasSubstr("round 1 moved on before its weights were all "
                              "sent"),
                    HasSubstr("Cancelled on the server side")));
  EXPECT_EQ(slow.round, 1);
  EXPECT_LT(slow.chunks, 80);
  EXPECT_LT(slow.ended - too_stale, absl::Seconds(10));  // the whole takes 16 s
  // The run goes on: it was the staleness, not the end of training.
  EXPECT_EQ(server_->controller().GetStatus().phase(), v1::PHASE_TRAINING);
}

}  // namespace
}  // namespace fedlearn
