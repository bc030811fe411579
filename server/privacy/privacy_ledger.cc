#include "server/privacy/privacy_ledger.h"

#include "absl/strings/str_format.h"

namespace fedlearn {

PrivacyLedger::PrivacyLedger(const DpParams& dp, double delta,
                             double max_epsilon)
    : dp_(dp), accountant_(delta, max_epsilon) {}

std::optional<double> PrivacyLedger::Restore(const v1::CoordinatorState& state,
                                             bool mid_training,
                                             std::string* log) {
  const v1::RoundRecord* last = nullptr;
  for (const v1::RoundRecord& record : state.history()) {
    if (record.dp_noise_multiplier() > 0) {
      accountant_.Charge(record.dp_sampling_rate(),
                         record.dp_noise_multiplier());
      last = &record;
    }
  }
  if (!enabled()) return std::nullopt;
  unrecorded_rounds_ = state.dp_unrecorded_rounds() + (mid_training ? 1 : 0);
  // An unrecorded round's sampling rate was decided when it opened, after the
  // last save, and is lost: it is charged at q = 1, the most a round can
  // cost (no amplification by sampling), so epsilon is never under-stated.
  for (int i = 0; i < unrecorded_rounds_; ++i) {
    accountant_.Charge(1.0, dp_.noise_multiplier);
  }
  if (accountant_.rounds() == 0) return std::nullopt;
  *log = absl::StrFormat(
      "epsilon %.4g after %d rounds, %d of them charged at q = 1 for a "
      "release a crash may have left unrecorded",
      accountant_.epsilon(), accountant_.rounds(), unrecorded_rounds_);
  if (!dp_.adaptive() || last == nullptr) return std::nullopt;
  return last->dp_next_clip_norm();
}

std::optional<std::string> PrivacyLedger::Open(int sampled, int alive) {
  if (!enabled()) return std::nullopt;
  // q is the chance that a given client is in this round.
  const double q = static_cast<double>(sampled) / alive;
  if (std::optional<std::string> refused =
          accountant_.Refuse(q, dp_.noise_multiplier)) {
    return refused;
  }
  sampling_rate_ = q;
  return std::nullopt;
}

std::string PrivacyLedger::Charge(double clip_norm, double next_clip_norm,
                                  v1::RoundRecord* record) {
  if (!enabled()) return "";
  accountant_.Charge(sampling_rate_, dp_.noise_multiplier);
  record->set_dp_epsilon(accountant_.epsilon());
  record->set_dp_sampling_rate(sampling_rate_);
  record->set_dp_noise_multiplier(dp_.noise_multiplier);
  record->set_dp_clip_norm(clip_norm);
  record->set_dp_next_clip_norm(next_clip_norm);
  return absl::StrFormat(
      ", epsilon %.4g (delta %g)%s", accountant_.epsilon(), accountant_.delta(),
      dp_.adaptive() ? absl::StrFormat(", clip norm %.4g -> %.4g", clip_norm,
                                       next_clip_norm)
                     : "");
}

void PrivacyLedger::Save(v1::CoordinatorState* state) const {
  state->set_dp_unrecorded_rounds(unrecorded_rounds_);
  state->set_dp_noise_multiplier(dp_.enabled() ? dp_.noise_multiplier : 0);
  state->set_dp_clip_norm(dp_.enabled() && !dp_.adaptive() ? dp_.clip_norm : 0);
}

void PrivacyLedger::Fill(double clip_norm, v1::PrivacyStatus* status) const {
  status->set_epsilon(accountant_.epsilon());
  status->set_delta(accountant_.delta());
  status->set_noise_multiplier(dp_.noise_multiplier);
  status->set_clip_norm(clip_norm);
  status->set_target_quantile(dp_.target_quantile);
  status->set_max_epsilon(accountant_.max_epsilon());
  status->set_rounds(accountant_.rounds());
}

}  // namespace fedlearn
