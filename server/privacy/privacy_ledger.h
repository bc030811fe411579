#ifndef FEDLEARN_SERVER_PRIVACY_PRIVACY_LEDGER_H_
#define FEDLEARN_SERVER_PRIVACY_PRIVACY_LEDGER_H_

#include <optional>
#include <string>

#include "fedlearn/v1/coordinator.pb.h"
#include "fedlearn/v1/state.pb.h"
#include "server/privacy/dp_params.h"
#include "server/privacy/rdp_accountant.h"

namespace fedlearn {

// The privacy a run spends under central DP, as the run controller keeps it:
// the accountant, the sampling rate of the open round, and the rounds charged
// for releases a crash may have left unrecorded. Decides whether a round may
// open (the budget), charges a round that released a model and writes what it
// was charged into its record, saves and restores itself with the run, and
// fills GetStatus. Does nothing when DP is off. Memory: the accountant's RDP
// per order. Not thread-safe: the run controller serialises.
class PrivacyLedger {
 public:
  PrivacyLedger(const DpParams& dp, double delta, double max_epsilon);

  bool enabled() const { return dp_.enabled(); }
  double epsilon() const { return accountant_.epsilon(); }

  // A saved run resumed: charges its records' rounds again, plus, when it was
  // still training (`mid_training`), one round a crash may have released
  // without a record (its model goes out before its save), at q = 1 with the
  // run's z, as are those of earlier restarts. Returns the clip norm an
  // adaptive run had reached (nullopt otherwise) and, in `*log`, what was
  // restored (empty when nothing was charged).
  std::optional<double> Restore(const v1::CoordinatorState& state,
                                bool mid_training, std::string* log);

  // A round would open sampling `sampled` of `alive` clients: nullopt when it
  // may (its sampling rate is kept for Charge), else why not, the budget it
  // would exceed.
  std::optional<std::string> Open(int sampled, int alive);

  // The open round released a model, its updates clipped to `clip_norm` and
  // the next round's to `next_clip_norm`: charges it, writes the charge into
  // `record`, and returns the text for the round's log line.
  std::string Charge(double clip_norm, double next_clip_norm,
                     v1::RoundRecord* record);

  void Save(v1::CoordinatorState* state) const;
  // GetStatus's `privacy`, the next round clipping to `clip_norm`.
  void Fill(double clip_norm, v1::PrivacyStatus* status) const;

 private:
  const DpParams dp_;
  PrivacyAccountant accountant_;
  double sampling_rate_ = 0;  // of the open round
  int unrecorded_rounds_ = 0;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_PRIVACY_PRIVACY_LEDGER_H_
