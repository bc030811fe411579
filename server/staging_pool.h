#ifndef FEDLEARN_SERVER_STAGING_POOL_H_
#define FEDLEARN_SERVER_STAGING_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/aligned_vector.h"

namespace fedlearn {

// When StagingPool takes a buffer back (see there).
struct StagingPolicy {
  absl::Duration idle_timeout = absl::Seconds(10);
  double min_rate = 1 << 20;  // bytes/s
  absl::Duration grace = absl::Seconds(1);
};

// A fixed set of model-sized buffers that incoming updates are received into
// before they are verified and folded. An update is folded only once all of it
// has arrived and checked out, so that a rejected update changes nothing;
// bounding the buffers bounds the coordinator's memory at (buffers + 4) x model
// size whatever the number of clients (the global model and the one before it,
// the double accumulator, and the snapshots downloads and saves still hold,
// besides): a push that finds no free buffer is not
// read until one frees up (gRPC flow control holds the client back).
//
// A buffer goes only to an upload that is actually sending. Reclaim takes a
// buffer back from
//   - an upload that sent nothing for `idle_timeout` (a stalled client), and
//   - while other uploads wait for a buffer, one that has held its buffer for
//     at least `grace` and received less than its bar since (a client on a
//     trickle): it would otherwise keep every faster client's update from
//     being received, and the round from closing at quorum. The bar is
//     `min_rate` bytes/s, lowered to kPeerRateFraction of the median rate of
//     the last kRecentUploads uploads that finished here when that is less: a
//     coordinator short of CPU reads every upload slowly, and then an upload
//     as slow as its peers is not the client's fault. A trickle is still
//     far below its peers.
// The owner of a reclaimed buffer is told through its `preempt` callback and
// gives the buffer back with Release as usual; its update is dropped whole
// (nothing of it was folded) and the client may push again.
// Thread-safe.
class StagingPool {
 public:
  using Buffer = std::unique_ptr<AlignedVector<float>>;
  // Receives a queued lease's buffer, or nullptr when the wait was cancelled.
  // Called once, never under the pool's lock, on the thread that released the
  // buffer (or cancelled the wait).
  using Callback = std::function<void(Buffer)>;
  // Tells a buffer's holder that it is being reclaimed, and why.
  using Preempt = std::function<void(const std::string& reason)>;

  using Policy = StagingPolicy;
  StagingPool(int num_buffers, size_t buffer_floats, Policy policy = Policy());

  // The bar for a trickle next to its peers (above), and how many finished
  // uploads' rates it is taken from.
  static constexpr double kPeerRateFraction = 0.125;
  static constexpr size_t kRecentUploads = 16;

  // A lease: its id, for Progress, Release and Cancel, and its buffer when
  // one was free (then `done` is never called).
  struct Lease {
    uint64_t id = 0;
    Buffer buffer;
  };
  // Takes a free buffer now, or queues `done` for one (first come, first
  // served).
  Lease Acquire(Callback done, Preempt preempt, absl::Time now);

  // If `id` is still queued, dequeues it and calls its callback with nullptr.
  void Cancel(uint64_t id);

  // The holder of lease `id` received `bytes` more at `now`.
  void Progress(uint64_t id, int64_t bytes, absl::Time now);

  // Gives lease `id`'s buffer back; the oldest waiter, if any, receives it.
  // A lease that was not reclaimed and received bytes adds its rate to the
  // recent uploads' rates.
  void Release(uint64_t id, Buffer buffer, absl::Time now);

  // A buffer to be taken back, and why (for its holder's error and the log).
  struct Reclaimed {
    uint64_t id = 0;
    Preempt preempt;
    std::string reason;
    // Runs `preempt` with the reason.
    void Run() const { preempt(reason); }
  };
  // Decides which leases to take back at `now` (see above); the caller runs
  // them, outside any lock. A lease is reclaimed once.
  std::vector<Reclaimed> Reclaim(absl::Time now);

  // Buffers handed out right now, and uploads waiting for one.
  int in_use() const;
  int waiting() const;

 private:
  struct Waiter {
    uint64_t id;
    Callback done;
    Preempt preempt;
  };
  struct Held {
    Preempt preempt;
    absl::Time granted;
    absl::Time last_progress;
    int64_t bytes = 0;
    bool reclaimed = false;
  };

  // Drops the cancelled waiters (tombstones) at both ends of the queue, so
  // that its front, if any, is a live waiter.
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants a buffer to `waiter` at `now` (under the lock).
  void GrantLocked(Waiter& waiter, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rate below which a lease gives way to waiters, and what set it.
  std::pair<double, std::string> SlowBarLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t buffer_floats_;
  const Policy policy_;
  mutable absl::Mutex mu_;
  std::vector<Buffer> free_ ABSL_GUARDED_BY(mu_);
  // In id order; a cancelled one stays as a tombstone (no callback) until it
  // reaches either end. num_waiting_ counts the live ones.
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  size_t num_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Held> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Bytes/s of the last kRecentUploads finished uploads, oldest first.
  std::deque<double> recent_rates_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STAGING_POOL_H_
