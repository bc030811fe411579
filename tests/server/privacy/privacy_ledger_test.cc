#include "server/privacy/privacy_ledger.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fedlearn {
namespace {

using ::testing::HasSubstr;

DpParams Dp(double z, double quantile = 0) {
  DpParams dp;
  dp.clip_norm = 1;
  dp.noise_multiplier = z;
  dp.target_quantile = quantile;
  return dp;
}

TEST(PrivacyLedgerTest, WithoutDpNothingIsChargedOrRefused) {
  PrivacyLedger ledger(DpParams(), 1e-5, 1.0);
  EXPECT_FALSE(ledger.enabled());
  EXPECT_EQ(ledger.Open(10, 10), std::nullopt);
  v1::RoundRecord record;
  EXPECT_EQ(ledger.Charge(1, 1, &record), "");
  EXPECT_EQ(record.dp_noise_multiplier(), 0);
  EXPECT_EQ(ledger.epsilon(), 0);
}

TEST(PrivacyLedgerTest, ChargesTheOpenRoundsSamplingRateIntoItsRecord) {
  PrivacyLedger ledger(Dp(1.0), 1e-5, 0);
  ASSERT_EQ(ledger.Open(3, 12), std::nullopt);  // q = 1/4
  v1::RoundRecord record;
  EXPECT_THAT(ledger.Charge(1.0, 1.0, &record), HasSubstr("epsilon"));
  PrivacyAccountant expected(1e-5, 0);
  expected.Charge(0.25, 1.0);
  EXPECT_DOUBLE_EQ(record.dp_epsilon(), expected.epsilon());
  EXPECT_DOUBLE_EQ(record.dp_sampling_rate(), 0.25);
  EXPECT_DOUBLE_EQ(record.dp_noise_multiplier(), 1.0);
  v1::PrivacyStatus status;
  ledger.Fill(0.5, &status);
  EXPECT_EQ(status.rounds(), 1);
  EXPECT_EQ(status.clip_norm(), 0.5);
}

TEST(PrivacyLedgerTest, RefusesTheRoundPastTheBudget) {
  PrivacyAccountant one(1e-5, 0);
  one.Charge(1.0, 1.0);
  PrivacyLedger ledger(Dp(1.0), 1e-5, one.epsilon() * 1.01);
  ASSERT_EQ(ledger.Open(5, 5), std::nullopt);
  v1::RoundRecord record;
  ledger.Charge(1, 1, &record);
  const std::optional<std::string> refused = ledger.Open(5, 5);
  ASSERT_TRUE(refused.has_value());
  EXPECT_THAT(*refused, HasSubstr("--dp_max_epsilon"));
  // A smaller sample may still fit.
  EXPECT_EQ(ledger.Open(1, 100), std::nullopt);
}

TEST(PrivacyLedgerTest, ARestoreMidTrainingChargesOneUnrecordedRound) {
  v1::CoordinatorState state;
  for (int r = 0; r < 2; ++r) {
    v1::RoundRecord* record = state.add_history();
    record->set_dp_sampling_rate(0.5);
    record->set_dp_noise_multiplier(1.0);
    record->set_dp_next_clip_norm(2.0 + r);
  }
  state.set_dp_unrecorded_rounds(1);  // one from an earlier restart
  PrivacyLedger adaptive(Dp(1.0, 0.5), 1e-5, 0);
  std::string log;
  EXPECT_EQ(adaptive.Restore(state, /*mid_training=*/true, &log), 3.0);
  // The two recorded rounds at their q; the earlier restart's and this one's
  // at q = 1: the unrecorded round's q is lost, and 1 is the most it can be.
  PrivacyAccountant expected(1e-5, 0);
  for (int r = 0; r < 2; ++r) expected.Charge(0.5, 1.0);
  for (int r = 0; r < 2; ++r) expected.Charge(1.0, 1.0);
  EXPECT_DOUBLE_EQ(adaptive.epsilon(), expected.epsilon());
  EXPECT_THAT(log, HasSubstr("2 of them charged at q = 1"));
  v1::CoordinatorState saved;
  adaptive.Save(&saved);
  EXPECT_EQ(saved.dp_unrecorded_rounds(), 2);
  // A fixed clip norm is not restored; a finished run adds no unrecorded round.
  PrivacyLedger fixed(Dp(1.0), 1e-5, 0);
  EXPECT_EQ(fixed.Restore(state, /*mid_training=*/false, &log), std::nullopt);
  fixed.Save(&saved);
  EXPECT_EQ(saved.dp_unrecorded_rounds(), 1);
}

// A crash before the first round's save: its model may have gone out with
// the next round's tasks, so a resumed run charges it although nothing is
// recorded, and at q = 1 whatever the sample was.
TEST(PrivacyLedgerTest, ARestoreBeforeAnyRecordStillChargesTheUnrecordedRound) {
  v1::CoordinatorState state;
  state.add_history()->set_outcome("abandoned");  // charged nothing
  PrivacyLedger ledger(Dp(1.5), 1e-5, 0);
  std::string log;
  EXPECT_EQ(ledger.Restore(state, /*mid_training=*/true, &log), std::nullopt);
  PrivacyAccountant expected(1e-5, 0);
  expected.Charge(1.0, 1.5);
  EXPECT_GT(ledger.epsilon(), 0);
  EXPECT_DOUBLE_EQ(ledger.epsilon(), expected.epsilon());
  EXPECT_THAT(log, HasSubstr("after 1 rounds, 1 of them"));
  // A run that had finished training releases nothing more.
  PrivacyLedger done(Dp(1.5), 1e-5, 0);
  EXPECT_EQ(done.Restore(state, /*mid_training=*/false, &log), std::nullopt);
  EXPECT_EQ(done.epsilon(), 0);
}

}  // namespace
}  // namespace fedlearn
