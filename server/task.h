#ifndef FEDLEARN_SERVER_TASK_H_
#define FEDLEARN_SERVER_TASK_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fedlearn/v1/coordinator.pb.h"

namespace fedlearn {

// Immutable snapshot of the global weights (spec.num_parameters floats); tasks
// share it with the streams sending it, so a new model version never copies or
// waits for a download in progress.
using Weights = std::shared_ptr<const std::vector<float>>;

// Minimum time between two polls of a client that got WAIT.
constexpr absl::Duration kWaitRetryAfter = absl::Milliseconds(200);

class CancelHandle;

// A task for one client, as RequestUpdate sends it.
struct Task {
  v1::TaskType type = v1::TASK_TYPE_WAIT;
  int64_t round = 0;
  bool run_validation = false;
  absl::Time deadline = absl::InfiniteFuture();
  absl::Duration retry_after = absl::ZeroDuration();
  Weights weights;                               // TRAIN and EVALUATE only
  std::shared_ptr<const v1::TrainingPlan> plan;  // TRAIN only
  // TRAIN and EVALUATE, once handed to a client: cancelled when the run can
  // no longer use what the client would train or report (its round or
  // evaluation attempt closed, training stopped, or in async mode its version
  // fell behind --max_staleness or out of --download_versions), so that the
  // download ends at its next chunk and lets go of its weights.
  std::shared_ptr<CancelHandle> retire;
};

// Receives a long poll's answer: the task, WAIT at its expiry, UNAVAILABLE at
// shutdown or CANCELLED. Called exactly once, never under a lock.
using PollCallback = std::function<void(absl::StatusOr<Task>)>;

// Lets the coordinator stop a push that is still streaming when it can no
// longer count (its round closed, training stopped), so that a stalled client
// cannot hold a staging buffer, and a download whose task it can no longer
// use (Task::retire). The stream arms it with its cancel action and disarms it
// before finishing; Cancel after Disarm does nothing. Thread-safe.
class CancelHandle {
 public:
  // Unarmed: the stream arms it once it has it (Arm).
  CancelHandle() = default;
  explicit CancelHandle(std::function<void()> cancel)
      : cancel_(std::move(cancel)) {}
  // Runs the cancel action under the handle's own lock, so that once Disarm
  // returns the action is not running and the stream may be destroyed.
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (cancel_) std::exchange(cancel_, nullptr)();
  }
  // Arms an unarmed handle with `cancel`, or runs it now if Cancel came first.
  void Arm(std::function<void()> cancel) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      cancel();
    } else {
      cancel_ = std::move(cancel);
    }
  }
  void Disarm() {
    absl::MutexLock lock(&mu_);
    cancel_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  std::function<void()> cancel_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// The handles of a step's calls in flight (pushes, and downloads through
// Task::retire), to cut them off when it closes. A call that ended has
// dropped its reference (use_count 1); those are let go of whenever the list
// has doubled since the last look, so a client that opens and abandons pushes
// all round long costs a list of at most twice the calls really in flight
// (plus 16), at O(1) amortised per call. Not thread-safe: the run controller
// serialises.
class InFlightCalls {
 public:
  void Track(std::shared_ptr<CancelHandle> handle) {
    if (handles_.size() >= prune_at_) {
      handles_.erase(std::remove_if(handles_.begin(), handles_.end(),
                                    [](const std::shared_ptr<CancelHandle>& h) {
                                      return h.use_count() == 1;
                                    }),
                     handles_.end());
      prune_at_ = std::max<size_t>(kMinPrune, 2 * handles_.size());
    }
    handles_.push_back(std::move(handle));
  }
  std::vector<std::shared_ptr<CancelHandle>> Take() {
    prune_at_ = kMinPrune;
    return std::exchange(handles_, {});
  }
  size_t size() const { return handles_.size(); }

 private:
  static constexpr size_t kMinPrune = 16;
  std::vector<std::shared_ptr<CancelHandle>> handles_;
  size_t prune_at_ = kMinPrune;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_TASK_H_
