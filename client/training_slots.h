#ifndef FEDLEARN_CLIENT_TRAINING_SLOTS_H_
#define FEDLEARN_CLIENT_TRAINING_SLOTS_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace fedlearn {

// Lets at most `slots` agents of a process train at the same time. Agents on
// fewer cores than there are agents then take turns, each on cores and caches
// of its own, instead of all training at once and evicting each other's
// weights (10 agents' working sets are ~10x the L3 cache): a round takes the
// same CPU time, with less of it lost to cache misses and context switches.
// Thread-safe.
class TrainingSlots {
 public:
  explicit TrainingSlots(int slots) : free_(slots < 1 ? 1 : slots) {}

  // Takes a slot, waiting for one; gives up (returning false) once `stop`
  // returns true, which is checked at least every 100 ms.
  bool Acquire(const std::function<bool()>& stop) {
    absl::MutexLock lock(&mu_);
    auto available = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return free_ > 0;
    };
    while (!mu_.AwaitWithTimeout(absl::Condition(&available),
                                 absl::Milliseconds(100))) {
      if (stop()) return false;
    }
    --free_;
    return true;
  }

  void Release() {
    absl::MutexLock lock(&mu_);
    ++free_;
  }

 private:
  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fedlearn

#endif  // FEDLEARN_CLIENT_TRAINING_SLOTS_H_
