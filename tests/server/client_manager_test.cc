#include "server/client_manager.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
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
  EXPECT_EQ(clients.joined(), 2u);
}

TEST(ClientManagerTest, RefusesClientsPastTheMaximum) {
  ClientManager clients(Small(1));
  ASSERT_TRUE(clients.Register("a", t0).ok());
  auto refused = clients.Register("b", t0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("maximum of 1 clients alive"));
  EXPECT_EQ(clients.joined(), 1u);
}

// The maximum bounds the clients alive, not every client a long run has seen
// come and go; a restarted agent naming its alive old identity takes its
// place even at the maximum.
TEST(ClientManagerTest, TheMaximumCountsClientsAliveNotEveryOneSeen) {
  ClientManager clients(Small(2));
  const Client* a = *clients.Register("a", t0);
  ASSERT_TRUE(clients.Register("b", t0).ok());
  EXPECT_FALSE(clients.Register("c", t0).ok());
  // a restarts: its new identity replaces the old one, which is retired.
  const Client* previous = clients.Retirable(a->id, a->token);
  ASSERT_EQ(previous, a);
  absl::StatusOr<const Client*> a2 = clients.Register("a", t0, previous);
  ASSERT_TRUE(a2.ok()) << a2.status();
  ASSERT_TRUE(clients.Retire(a->id, a->token, **a2));
  EXPECT_EQ(clients.Retirable(a->id, a->token), nullptr);  // retired once
  EXPECT_EQ(clients.CountAlive(t0), 2);
  EXPECT_FALSE(clients.Register("c", t0).ok());
  // Everyone goes quiet past the client timeout: gone, and room again.
  const absl::Time later = t0 + absl::Seconds(21);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(clients.Register(absl::StrCat("new-", i), later).ok()) << i;
  }
  EXPECT_FALSE(clients.Register("one too many", later).ok());
  EXPECT_EQ(clients.joined(), 5u);  // the gone are remembered (ids stay unique)
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

TEST(ClientManagerTest, ReadyListsClientsInJoinOrder) {
  ClientManager clients(Small());
  ASSERT_TRUE(clients.Register("z", t0).ok());
  ASSERT_TRUE(clients.Register("y", t0 + absl::Seconds(10)).ok());
  ASSERT_TRUE(clients.Register("x", t0).ok());
  EXPECT_THAT(clients.Ready(t0 + absl::Seconds(5)),
              ElementsAre("client-1", "client-2", "client-3"));
  EXPECT_EQ(clients.CountReady(t0 + absl::Seconds(5)), 3);
  EXPECT_EQ(clients.CountAlive(t0 + absl::Seconds(5)), 3);
  EXPECT_THAT(clients.Ready(t0 + absl::Seconds(15)), ElementsAre("client-2"));
  EXPECT_EQ(clients.CountReady(t0 + absl::Seconds(15)), 1);
  EXPECT_EQ(clients.CountAlive(t0 + absl::Seconds(15)), 3);
  EXPECT_EQ(clients.CountAlive(t0 + absl::Seconds(25)), 1);
}

// The counts are kept, not recounted: a client that aged out of the ready
// and alive windows is counted again as soon as it is seen or polls, and one
// retired or hung up stops counting at once.
TEST(ClientManagerTest, CountsFollowEveryChangeOfEveryClient) {
  ClientManager clients(Small());  // alive 20 s, ready 10 s
  std::vector<Client*> all;
  for (int i = 0; i < 5; ++i) {
    all.push_back(
        *clients.Get((*clients.Register(absl::StrCat("c", i), t0))->id));
  }
  const absl::Time t1 = t0 + absl::Seconds(30);  // everyone aged out
  EXPECT_EQ(clients.CountReady(t1), 0);
  EXPECT_EQ(clients.CountAlive(t1), 0);
  clients.Seen(all[0], t1);  // a heartbeat
  ASSERT_TRUE(clients.Authorize(all[1]->id, all[1]->token, t1).ok());
  clients.PollStarted(all[1]);  // the poll that call makes
  ASSERT_TRUE(clients.Authorize(all[2]->id, all[2]->token, t1).ok());
  EXPECT_EQ(clients.CountReady(t1), 3);
  EXPECT_EQ(clients.CountAlive(t1), 3);
  EXPECT_THAT(clients.Ready(t1),
              ElementsAre("client-1", "client-2", "client-3"));
  // Held polls do not age; the others do.
  EXPECT_EQ(clients.CountReady(t1 + absl::Seconds(11)), 1);
  EXPECT_EQ(clients.CountAlive(t1 + absl::Seconds(11)), 3);
  // A hung-up poll: alive, not ready.
  const absl::Time t2 = t1 + absl::Seconds(12);
  clients.PollCancelled(all[1]);
  EXPECT_EQ(clients.CountReady(t2), 0);
  EXPECT_EQ(clients.CountAlive(t2), 3);
  // Retired by its own re-join: neither, at once.
  Client* successor = *clients.Get((*clients.Register("c0-again", t2))->id);
  ASSERT_TRUE(clients.Retire(all[0]->id, all[0]->token, *successor));
  EXPECT_EQ(clients.CountReady(t2), 1);  // the successor
  EXPECT_EQ(clients.CountAlive(t2), 3);  // 1, 2 and the successor
  EXPECT_THAT(clients.Ready(t2), ElementsAre(successor->id));
  // Every count agrees with asking every client.
  for (absl::Time t : {t2, t2 + absl::Seconds(9), t2 + absl::Seconds(19),
                       t2 + absl::Seconds(21)}) {
    int ready = 0, alive = 0;
    for (const auto& [index, c] : clients.clients()) {
      ready += clients.IsReady(*c, t) ? 1 : 0;
      alive += clients.IsAlive(*c, t) ? 1 : 0;
    }
    EXPECT_EQ(clients.CountReady(t), ready) << t;
    EXPECT_EQ(clients.CountAlive(t), alive) << t;
  }
}

TEST(ClientManagerTest, ReadyMeansPollingOrHeardFromWithinTheReadyWindow) {
  ClientManager clients(Small());  // alive 20 s, ready 10 s
  Client* a = *clients.Get((*clients.Register("a", t0))->id);
  // Silent for 10 s (two missed heartbeats): alive still, but not sampled.
  EXPECT_TRUE(clients.IsReady(*a, t0 + absl::Seconds(9)));
  EXPECT_FALSE(clients.IsReady(*a, t0 + absl::Seconds(10)));
  EXPECT_TRUE(clients.IsAlive(*a, t0 + absl::Seconds(10)));
  // Holding a poll: ready however long it is held.
  clients.PollStarted(a);
  EXPECT_TRUE(clients.IsReady(*a, t0 + absl::Hours(1)));
  // The client hung up its poll (a killed process does): not ready at once,
  // though alive for the rest of its client timeout...
  clients.PollCancelled(a);
  EXPECT_FALSE(clients.IsReady(*a, t0 + absl::Seconds(1)));
  EXPECT_TRUE(clients.IsAlive(*a, t0 + absl::Seconds(1)));
  // ... until it calls again.
  ASSERT_TRUE(clients.Authorize(a->id, a->token, t0 + absl::Seconds(2)).ok());
  EXPECT_TRUE(clients.IsReady(*a, t0 + absl::Seconds(3)));
  // A client holding two polls that hangs up one still holds the other.
  clients.PollStarted(a);
  clients.PollStarted(a);
  clients.PollCancelled(a);
  EXPECT_TRUE(clients.IsReady(*a, t0 + absl::Seconds(3)));
}

TEST(ClientManagerTest, AReJoinWithThePreviousTokenRetiresTheOldIdentity) {
  ClientManager clients(Small());
  Client* old = *clients.Get((*clients.Register("agent", t0))->id);
  clients.PollStarted(old);  // even while it seems to hold a poll
  const Client* other = *clients.Register("other", t0);
  const Client* again = *clients.Register("agent", t0 + absl::Seconds(1));
  // Another client's token, or none, retires nothing.
  EXPECT_FALSE(clients.Retire(old->id, other->token, *again));
  EXPECT_FALSE(clients.Retire(old->id, "", *again));
  EXPECT_FALSE(clients.Retire("client-99", old->token, *again));
  EXPECT_TRUE(clients.IsReady(*old, t0 + absl::Seconds(1)));
  ASSERT_TRUE(clients.Retire(old->id, old->token, *again));
  EXPECT_FALSE(clients.IsReady(*old, t0 + absl::Seconds(1)));
  EXPECT_FALSE(clients.IsAlive(*old, t0 + absl::Seconds(1)));
  EXPECT_THAT(clients.Ready(t0 + absl::Seconds(1)),
              ElementsAre("client-2", "client-3"));
  // Its later calls are told who replaced it; it cannot be retired twice.
  absl::Status s = clients.Authorize(old->id, old->token, t0);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("client-1 was retired when it joined "
                                     "again as client-3"));
  EXPECT_FALSE(clients.Retire(old->id, old->token, *other));
}

TEST(ClientManagerTest, NothingIsForgottenWithoutForgetAfter) {
  ClientManager clients(Small());
  const Client* a = *clients.Register("a", t0);
  EXPECT_THAT(clients.Forget(t0 + absl::Hours(24 * 365)), IsEmpty());
  EXPECT_TRUE(clients.Authorize(a->id, a->token, t0 + absl::Hours(1)).ok());
}

TEST(ClientManagerTest, AClientGoneForForgetAfterIsForgottenAndMustJoinAgain) {
  ClientManager::Options options = Small();
  options.forget_after = absl::Minutes(10);
  ClientManager clients(options);
  const Client* gone = *clients.Register("gone", t0);
  const std::string gone_id = gone->id, gone_token = gone->token;
  Client* polling = *clients.Get((*clients.Register("polling", t0))->id);
  clients.PollStarted(polling);
  const Client* talking = *clients.Register("talking", t0);
  const Client* old = *clients.Register("restarted", t0);
  const Client* successor = *clients.Register("restarted", t0);
  ASSERT_TRUE(clients.Retire(old->id, old->token, *successor));
  const std::string old_id = old->id;

  // Just short of forget_after nothing goes; the one that called since stays.
  const absl::Time t1 = t0 + absl::Minutes(10) - absl::Milliseconds(1);
  ASSERT_TRUE(clients.Authorize(talking->id, talking->token, t1).ok());
  EXPECT_THAT(clients.Forget(t1), IsEmpty());
  const absl::Time t2 = t0 + absl::Minutes(10);
  // The silent one and the retired one go; the successor joined at t0 too.
  const std::string successor_id = successor->id;
  EXPECT_THAT(clients.Forget(t2),
              UnorderedElementsAre(gone_id, old_id, successor_id));
  EXPECT_THAT(clients.Forget(t2), IsEmpty());  // once
  EXPECT_EQ(clients.Find(gone_id), nullptr);
  EXPECT_EQ(clients.Find(old_id), nullptr);
  EXPECT_EQ(clients.FindByToken(gone_token), nullptr);
  absl::Status s = clients.Authorize(gone_id, gone_token, t2);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("join again"));
  // A client holding a poll is never forgotten, however long it holds it.
  const std::string talking_id = talking->id;
  EXPECT_THAT(clients.Forget(t0 + absl::Hours(5)), ElementsAre(talking_id));
  EXPECT_TRUE(clients.Authorize(polling->id, polling->token, t2).ok());
  EXPECT_THAT(clients.Ready(t0 + absl::Hours(5)), ElementsAre(polling->id));
  // Ids are never reused, and joined() still counts every join.
  const Client* next = *clients.Register("next", t0 + absl::Hours(5));
  EXPECT_EQ(next->id, "client-6");
  EXPECT_EQ(clients.joined(), 6u);
  EXPECT_EQ(clients.clients().size(), 2u);  // `polling` and `next`
  EXPECT_EQ(clients.CountAlive(t0 + absl::Hours(5)), 2);
  // Its poll answered, the long-polling client is idle from then on, and
  // forgotten forget_after later.
  clients.PollAnswered(polling, t0 + absl::Hours(5));
  const std::string polling_id = polling->id, next_id = next->id;
  EXPECT_THAT(clients.Forget(t0 + absl::Hours(5) + absl::Minutes(10)),
              UnorderedElementsAre(polling_id, next_id));
  EXPECT_TRUE(clients.clients().empty());
  EXPECT_EQ(clients.CountAlive(t0 + absl::Hours(5) + absl::Minutes(10)), 0);
  EXPECT_EQ(clients.CountReady(t0 + absl::Hours(5) + absl::Minutes(10)), 0);
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
    const auto f = forward.Sample(forward.Ready(t0), 3);
    const auto b = backward.Sample(backward.Ready(t0), 3);
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(named(forward, f), named(backward, b)) << "round " << round;
  }
}

TEST(ClientManagerTest, SampleDrawsWithoutReplacementAndCapsAtTheCandidates) {
  ClientManager clients(Small());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(clients.Register("c", t0).ok());
  const std::vector<std::string> all = clients.Ready(t0);
  EXPECT_THAT(clients.Sample(all, 6), UnorderedElementsAreArray(all));
  EXPECT_THAT(clients.Sample(all, 60), UnorderedElementsAreArray(all));
  EXPECT_TRUE(clients.Sample(all, 0).empty());
}

TEST(ClientManagerTest, ARestoredSamplerSamplesAsTheOriginalWouldHave) {
  ClientManager original(Small());
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(original.Register("c" + std::to_string(i), t0).ok());
  }
  original.Sample(original.Ready(t0), 4);  // advance it
  ClientManager resumed(Small());
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(resumed.Register("c" + std::to_string(i), t0).ok());
  }
  ASSERT_TRUE(resumed.RestoreSampler(original.SamplerState()).ok());
  EXPECT_EQ(resumed.Sample(resumed.Ready(t0), 4),
            original.Sample(original.Ready(t0), 4));
  EXPECT_EQ(resumed.RestoreSampler("not a sampler").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fedlearn
