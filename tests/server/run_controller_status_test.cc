// The run's status as GetStatus reports it (server/run_controller_status.cc):
// the client list a page at a time, forgotten clients, and the latest history
// records, over real gRPC with scripted clients.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator_server.h"
#include "server/run_controller.h"
#include "tests/server/scripted_clients.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

using testing::Header;
using testing::kWait;
using testing::SmallRun;

class RunStatusTest : public testing::ServiceTest {};

// GetStatus lists the clients a page at a time (100 by default, at most
// 1000), in join order, and counts every one of them.
TEST_F(RunStatusTest, GetStatusPagesTheClientListAndCountsThemAll) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1000;  // nobody trains: all 250 stay ready
  Start(o);
  auto clients = JoinAll(250);
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](int size, const std::string& token,
                 v1::GetStatusResponse* reply) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_client_page_size(size);
    request.set_client_page_token(token);
    return stub->GetStatus(&context, request, reply);
  };
  v1::GetStatusResponse reply;
  ASSERT_TRUE(get(0, "", &reply).ok());
  EXPECT_EQ(reply.clients_size(), 100);
  EXPECT_EQ(reply.clients(0).client_id(), clients[0]->client_id());
  EXPECT_EQ(reply.client_counts().joined(), 250);
  EXPECT_EQ(reply.client_counts().ready(), 250);
  EXPECT_FALSE(reply.next_client_page_token().empty());

  // Pages of 120 cover every client once, in join order.
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    ASSERT_TRUE(get(120, token, &reply).ok());
    for (const v1::ClientInfo& c : reply.clients())
      seen.push_back(c.client_id());
    token = reply.next_client_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  ASSERT_EQ(seen.size(), 250u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], clients[i]->client_id()) << i;
  }
  // Above the maximum, a page holds 1000.
  ASSERT_TRUE(get(5000, "", &reply).ok());
  EXPECT_EQ(reply.clients_size(), 250);
  EXPECT_TRUE(reply.next_client_page_token().empty());

  grpc::Status bad = get(-1, "", &reply);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("client_page_size -1"));
  for (const char* token : {"abc", "-5", "007", "1e3"}) {
    bad = get(10, token, &reply);
    EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << token;
    EXPECT_THAT(bad.error_message(),
                HasSubstr("is not one a status reply gave"));
  }
  // A token past the end is an empty last page.
  ASSERT_TRUE(get(10, "100000", &reply).ok());
  EXPECT_EQ(reply.clients_size(), 0);
  EXPECT_EQ(reply.client_counts().joined(), 250);
}

// Clients gone for --forget_after leave the status and must join again, so
// that clients joining and leaving cost memory for that long only; a page
// token taken before they went still pages on from where it left off.
TEST_F(RunStatusTest, ForgottenClientsLeaveTheListAndMustJoinAgain) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1000;  // nobody trains
  o.client_timeout = absl::Milliseconds(300);
  o.forget_after = absl::Milliseconds(600);
  Start(o);
  auto clients = JoinAll(4);  // 0 and 1 fall silent, 2 and 3 heartbeat
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](int size, const std::string& token) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_client_page_size(size);
    request.set_client_page_token(token);
    v1::GetStatusResponse reply;
    EXPECT_TRUE(stub->GetStatus(&context, request, &reply).ok());
    return reply;
  };
  const std::string token = get(1, "").next_client_page_token();
  ASSERT_FALSE(token.empty());  // from clients[1] on

  v1::GetStatusResponse reply;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    for (int i : {2, 3}) ASSERT_TRUE(clients[i]->Heartbeat({}).ok());
    absl::SleepFor(absl::Milliseconds(100));
    reply = get(10, "");
  } while (reply.clients_size() > 2 && absl::Now() < give_up);
  ASSERT_EQ(reply.clients_size(), 2);
  EXPECT_EQ(reply.clients(0).client_id(), clients[2]->client_id());
  EXPECT_EQ(reply.clients(1).client_id(), clients[3]->client_id());
  EXPECT_EQ(reply.client_counts().joined(), 4);  // forgotten ones included
  EXPECT_EQ(reply.client_counts().gone(), 2);
  EXPECT_EQ(reply.client_counts().ready(), 2);
  // The old token resumes at the first client still remembered after it.
  reply = get(1, token);
  ASSERT_EQ(reply.clients_size(), 1);
  EXPECT_EQ(reply.clients(0).client_id(), clients[2]->client_id());

  // A forgotten client's call is told to join again; its id is not reused.
  absl::StatusOr<v1::HeartbeatResponse> beat = clients[0]->Heartbeat({});
  EXPECT_EQ(beat.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(beat.status().message(), HasSubstr("join again"));
  EXPECT_EQ(Join()->client_id(), "client-5");
}

// GetStatus carries the latest records of the history (100 by default, at
// most 10000) and counts them all, so that a long run's status stays small.
TEST_F(RunStatusTest, GetStatusCarriesTheLatestHistoryAndCountsIt) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1;
  o.clients_per_round = 1;
  o.max_rounds = 105;
  o.convergence_threshold = -std::numeric_limits<double>::infinity();
  Start(o);
  auto client = Join();
  const std::vector<float> zero(NumParameters());
  for (int round = 1; round <= 105; ++round) {
    ASSERT_EQ(NextTask(*client).task.type(), v1::TASK_TYPE_TRAIN) << round;
    ASSERT_TRUE(client->PushUpdate(Header(round, 10, 1.0), zero).ok());
  }
  ASSERT_TRUE(server_->controller().AwaitHistory(105, kWait));
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](int history_size, v1::GetStatusResponse* reply) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_history_size(history_size);
    return stub->GetStatus(&context, request, reply);
  };
  v1::GetStatusResponse reply;
  ASSERT_TRUE(get(0, &reply).ok());
  EXPECT_EQ(reply.history_total(), 105);
  ASSERT_EQ(reply.history_size(), 100);
  EXPECT_EQ(reply.history(0).round(), 6);  // oldest first
  EXPECT_EQ(reply.history(99).round(), 105);
  ASSERT_TRUE(get(3, &reply).ok());
  ASSERT_EQ(reply.history_size(), 3);
  EXPECT_EQ(reply.history(0).round(), 103);
  EXPECT_EQ(reply.history(2).round(), 105);
  ASSERT_TRUE(get(50000, &reply).ok());
  EXPECT_EQ(reply.history_size(), 105);
  EXPECT_EQ(reply.history(0).round(), 1);
  grpc::Status bad = get(-1, &reply);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("history_size -1"));
}

TEST_F(RunStatusTest, GetStatusListsRecordsClientsOnlyWhenAsked) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 2;
  o.clients_per_round = 2;
  o.tolerance = 0;
  Start(o);
  auto clients = JoinAll(2);
  const std::vector<float> zero(NumParameters());
  ASSERT_EQ(NextTask(*clients[0]).task.type(), v1::TASK_TYPE_TRAIN);
  ASSERT_EQ(NextTask(*clients[1]).task.type(), v1::TASK_TYPE_TRAIN);
  ASSERT_TRUE(clients[1]->PushUpdate(Header(1, 10, 1.0), zero).ok());
  auto stub = v1::Coordinator::NewStub(channel_);
  auto get = [&](bool client_ids) {
    grpc::ClientContext context;
    v1::GetStatusRequest request;
    request.set_client_ids(client_ids);
    v1::GetStatusResponse reply;
    EXPECT_TRUE(stub->GetStatus(&context, request, &reply).ok());
    return reply;
  };
  // The open round: both selected, one answered.
  v1::GetStatusResponse reply = get(false);
  ASSERT_TRUE(reply.has_current_round());
  EXPECT_EQ(reply.current_round().selected(), 2);
  EXPECT_EQ(reply.current_round().responded(), 1);
  EXPECT_EQ(reply.current_round().selected_clients_size(), 0);
  EXPECT_EQ(reply.current_round().accepted_clients_size(), 0);
  reply = get(true);
  EXPECT_EQ(reply.current_round().selected_clients_size(), 2);
  EXPECT_THAT(reply.current_round().accepted_clients(),
              ::testing::ElementsAre(clients[1]->client_id()));

  ASSERT_TRUE(clients[0]->PushUpdate(Header(1, 10, 1.0), zero).ok());
  ASSERT_TRUE(server_->controller().AwaitHistory(1, kWait));
  reply = get(false);
  ASSERT_GE(reply.history_size(), 1);
  EXPECT_EQ(reply.history(0).responded(), 2);
  EXPECT_EQ(reply.history(0).selected_clients_size(), 0);
  EXPECT_EQ(reply.history(0).accepted_clients_size(), 0);
  reply = get(true);
  ASSERT_GE(reply.history_size(), 1);
  EXPECT_THAT(
      reply.history(0).accepted_clients(),
      ::testing::ElementsAre(clients[1]->client_id(), clients[0]->client_id()));
  EXPECT_THAT(reply.history(0).selected_clients(),
              ::testing::UnorderedElementsAre(clients[0]->client_id(),
                                              clients[1]->client_id()));
}

// GetStatus is answered on a queue of its own (StatusQueue), a few calls
// taken in at a time: callers at once, more of them than it takes in, each
// get their own answer, and a bad request among them its own error; a call
// still waiting when the server shuts down ends instead of hanging.
TEST_F(RunStatusTest, StatusCallsAtOnceAreEachAnsweredAndShutdownEndsTheRest) {
  CoordinatorOptions o = SmallRun();
  o.min_clients = 1000;  // nobody trains
  Start(o);
  auto clients = JoinAll(5);
  auto stub = v1::Coordinator::NewStub(channel_);
  constexpr int kCallers = 16;
  constexpr int kCalls = 25;
  std::vector<int> answered(kCallers, 0);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int k = 0; k < kCalls; ++k) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
        v1::GetStatusRequest request;
        // Caller 0 asks for a page no reply gave.
        request.set_client_page_token(i == 0 ? "abc" : "");
        request.set_client_page_size(1 + i % 5);
        v1::GetStatusResponse reply;
        const grpc::Status s = stub->GetStatus(&context, request, &reply);
        if (i == 0) {
          EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
          continue;
        }
        ASSERT_TRUE(s.ok()) << s.error_message();
        EXPECT_EQ(reply.client_counts().joined(), 5);
        EXPECT_EQ(reply.clients_size(), 1 + i % 5) << i;
        ++answered[i];
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int i = 1; i < kCallers; ++i) EXPECT_EQ(answered[i], kCalls) << i;

  // Callers calling again and again while the server shuts down: the calls
  // in flight then end (answered, or UNAVAILABLE or CANCELLED), none hangs
  // until its deadline, and the coordinator shuts down cleanly.
  std::atomic<int> answered_before_shutdown{0};
  std::vector<std::thread> late;
  for (int i = 0; i < 8; ++i) {
    late.emplace_back([&] {
      for (;;) {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
        v1::GetStatusResponse reply;
        const grpc::Status s = stub->GetStatus(&context, {}, &reply);
        if (!s.ok()) {
          EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
          return;
        }
        answered_before_shutdown.fetch_add(1);
      }
    });
  }
  while (answered_before_shutdown.load() < 50) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  server_->Shutdown(absl::ZeroDuration());
  for (std::thread& t : late) t.join();
}

}  // namespace
}  // namespace fedlearn
