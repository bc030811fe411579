#include "server/client_manager.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

// A fake clock: every time is an offset from t0; nothing here sleeps.
const absl::Time t0 = absl::FromUnixSeconds(1'000'000);

ClientManager::Options Small(int max_clients = 10) {
  return {max_clients, absl::Seconds(20), /*seed=*/7};
}

TEST(ClientManagerTest, RegistersClientsWithIdsInJoinOrderAndSecretTokens) {
  ClientManager clients(Small());
  auto a = clients.Register("alice", t0);
  auto b = clients.Register("bob", t0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->id, "client-1");
  EXPECT_EQ((*b)->id, "client-2");
  EXPECT_EQ((*a)->token.size(), 32u);
  EXPECT_NE((*a)->token, (*b)->token);
  EXPECT_EQ(clients.size(), 2u);
}

TEST(ClientManagerTest, RefusesClientsPastTheMaximum) {
  ClientManager clients(Small(1));
  ASSERT_TRUE(clients.Register("a", t0).ok());
  auto refused = clients.Register("b", t0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("maximum of 1 clients"));
  EXPECT_EQ(clients.size(), 1u);
}

TEST(ClientManagerTest, AuthorizeTellsMissingWrongAndForeignTokensApart) {
  ClientManager clients(Small());
  const Client* a = *clients.Register("a", t0);
  const Client* b = *clients.Register("b", t0);
  EXPECT_TRUE(clients.Authorize(a->id, a->token, t0).ok());
  absl::Status missing = clients.Authorize(a->id, "", t0);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("client-1: missing session token"));
  absl::Status wrong = clients.Authorize(a->id, "0123", t0);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.message(), HasSubstr("client-1: invalid session token"));
  EXPECT_EQ(clients.Authorize(a->id, b->token, t0).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(clients.Authorize("client-9", a->token, t0).code(),
            absl::StatusCode::kNotFound);
}

TEST(ClientManagerTest, AClientIsAliveWhileHeardFromOrHoldingAPoll) {
  ClientManager clients(Small());
  Client* a = *clients.Get((*clients.Register("a", t0))->id);
  EXPECT_TRUE(clients.IsAlive(*a, t0 + absl::Seconds(19)));
  EXPECT_FALSE(clients.IsAlive(*a, t0 + absl::Seconds(20)));
  // Authorizing is hearing from it.
  ASSERT_TRUE(clients.Authorize(a->id, a->token, t0 + absl::Seconds(15)).ok());
  EXPECT_TRUE(clients.IsAlive(*a, t0 + absl::Seconds(34)));
  // A held poll keeps it alive however long it is held.
  clients.PollStarted(a);
  EXPECT_TRUE(clients.IsAlive(*a, t0 + absl::Hours(1)));
  // Answered: alive from then on; cancelled by the client: as before the poll.
  clients.PollAnswered(a, t0 + absl::Minutes(10));
  EXPECT_TRUE(clients.IsAlive(*a, t0 + absl::Minutes(10) + absl::Seconds(19)));
  clients.PollStarted(a);
  clients.PollCancelled(a);
  EXPECT_FALSE(clients.IsAlive(*a, t0 + absl::Minutes(11)));
}

TEST(ClientManagerTest, AliveListsClientsInJoinOrder) {
  ClientManager clients(Small());
  ASSERT_TRUE(clients.Register("z", t0).ok());
  ASSERT_TRUE(clients.Register("y", t0 + absl::Seconds(10)).ok());
  ASSERT_TRUE(clients.Register("x", t0).ok());
  EXPECT_THAT(clients.Alive(t0 + absl::Seconds(5)),
              ElementsAre("client-1", "client-2", "client-3"));
  EXPECT_THAT(clients.Alive(t0 + absl::Seconds(25)), ElementsAre("client-2"));
  EXPECT_EQ(clients.CountAlive(t0 + absl::Seconds(5)), 3);
  EXPECT_EQ(clients.CountAlive(t0 + absl::Seconds(25)), 1);
}

TEST(ClientManagerTest, SamplingIsSeededAndIgnoresJoinOrder) {
  // The same five names joined in two orders: the same named clients are
  // sampled, round after round.
  const std::vector<std::string> names = {"p0", "p1", "p2", "p3", "p4"};
  ClientManager forward(Small());
  ClientManager backward(Small());
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(forward.Register(names[i], t0).ok());
    ASSERT_TRUE(backward.Register(names[names.size() - 1 - i], t0).ok());
  }
  auto named = [](ClientManager& m, const std::vector<std::string>& ids) {
    std::vector<std::string> out;
    for (const std::string& id : ids) out.push_back(m.Find(id)->display_name);
    return out;
  };
  for (int round = 0; round < 5; ++round) {
    const auto f = forward.Sample(forward.Alive(t0), 3);
    const auto b = backward.Sample(backward.Alive(t0), 3);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(named(forward, f), named(backward, b)) << "round " << round;
  }
}

TEST(ClientManagerTest, SampleDrawsWithoutReplacementAndCapsAtTheCandidates) {
  ClientManager clients(Small());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(clients.Register("c", t0).ok());
  const std::vector<std::string> all = clients.Alive(t0);
  EXPECT_THAT(clients.Sample(all, 6), UnorderedElementsAreArray(all));
  EXPECT_THAT(clients.Sample(all, 60), UnorderedElementsAreArray(all));
  EXPECT_TRUE(clients.Sample(all, 0).empty());
}

TEST(ClientManagerTest, ARestoredSamplerSamplesAsTheOriginalWouldHave) {
  ClientManager original(Small());
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(original.Register("c" + std::to_string(i), t0).ok());
  }
  original.Sample(original.Alive(t0), 4);  // advance it
  ClientManager resumed(Small());
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(resumed.Register("c" + std::to_string(i), t0).ok());
  }
  ASSERT_TRUE(resumed.RestoreSampler(original.SamplerState()).ok());
  EXPECT_EQ(resumed.Sample(resumed.Alive(t0), 4),
            original.Sample(original.Alive(t0), 4));
  EXPECT_EQ(resumed.RestoreSampler("not a sampler").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlearn
