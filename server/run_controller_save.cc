// RunController's saves: what a save of the run holds (SnapshotLocked), the
// save run outside the lock, and what a failed one or a resume's privacy
// charge asks of the run. Split from run_controller.cc, whose job is the run's
// events; the store's own format is server/state_store.cc.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/run_controller.h"  // what it defines: part of RunController

namespace fedlearn {

SavedRun RunController::SnapshotLocked() const {
  SavedRun run;
  v1::CoordinatorState& s = run.state;
  s.set_run_id(run_id_);
  s.set_phase(phase_);
  s.set_round(RoundLocked());
  s.set_model_round(version_);
  s.set_mode(std::string(scheduler_->mode()));
  s.set_strategy(strategy_.name);
  *s.mutable_strategy_config() = strategy_.config;
  // A handle per record no save is known to have written (from History's
  // eviction mark on, which History keeps): the save writes their bytes,
  // outside the lock.
  const size_t from = std::min(history_.evictable_before(), history_.total());
  run.records_from = static_cast<int64_t>(from);
  run.records = history_.From(from);
  if (const std::optional<double> loss = stop_.previous_loss(); loss) {
    s.set_has_previous_train_loss(true);
    s.set_previous_train_loss(*loss);
  }
  s.set_stop_reason(stop_reason_);
  if (final_evaluation_.has_value()) {
    *s.mutable_final_evaluation() = *final_evaluation_;
  }
  s.set_bytes_received(history_.bytes_received());
  s.set_bytes_sent(history_.bytes_sent());
  s.set_sampler(clients_.SamplerState());
  s.set_clients_joined(static_cast<int64_t>(clients_.joined()));
  privacy_.Save(&s);
  run.weights = global_;
  run.optimizer = strategy_.optimizer->State();
  return run;
}

absl::Status RunController::Save(const SavedRun& run) {
  FEDLEARN_RETURN_IF_ERROR(store_->Save(spec_, run));
  absl::MutexLock lock(&mu_);
  // The history file holds them: memory need not. (Saves may end out of
  // order: the mark only moves on.)
  history_.AllowEvictionBefore(
      std::max(history_.evictable_before(),
               static_cast<size_t>(run.records_from) + run.records.size()));
  return absl::OkStatus();
}

std::function<void()> RunController::SaveLocked() {
  if (store_ == nullptr) return nullptr;
  return [this, run = SnapshotLocked()]() {
    if (absl::Status saved = Save(run); !saved.ok()) {
      Logf("round %d: the run could not be saved: %s", run.state.round(),
           saved.ToString());
      if (strategy_.dp.enabled()) StopAfterAFailedSave();
    }
  };
}

void RunController::StopAfterAFailedSave() {
  Effects effects;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != v1::PHASE_TRAINING &&
        phase_ != v1::PHASE_WAITING_FOR_CLIENTS) {
      return;
    }
    Logf(
        "round %d: central DP: no round is released while the last one's "
        "privacy charge is not on disk",
        version_);
    const absl::Time now = absl::Now();
    StopTrainingLocked("state_not_saved", now, &effects);
    MaybeStartLocked(now, &effects);
  }
  effects.Run();
}

absl::Status RunController::SaveResumeCharge() {
  SavedRun run;
  {
    absl::MutexLock lock(&mu_);
    if (!resume_charge_unsaved_) return absl::OkStatus();
    run = SnapshotLocked();
  }
  FEDLEARN_RETURN_IF_ERROR(Save(run));
  absl::MutexLock lock(&mu_);
  resume_charge_unsaved_ = false;
  return absl::OkStatus();
}

}  // namespace fedlearn
