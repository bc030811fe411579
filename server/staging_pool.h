#ifndef FEDLEARN_SERVER_STAGING_POOL_H_
#define FEDLEARN_SERVER_STAGING_POOL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace fedlearn {

// A fixed set of model-sized buffers that incoming updates are received into
// before they are verified and folded. An update is folded only once all of it
// has arrived and checked out, so that a rejected update changes nothing;
// bounding the buffers bounds the coordinator's memory at (buffers + 3) x model
// size whatever the number of clients: a push that finds no free buffer is not
// read until one frees up (gRPC flow control holds the client back).
// Thread-safe.
class StagingPool {
 public:
  using Buffer = std::unique_ptr<std::vector<float>>;
  // Receives a buffer, or nullptr when the wait was cancelled. Called exactly
  // once, never under the pool's lock.
  using Callback = std::function<void(Buffer)>;

  StagingPool(int num_buffers, size_t buffer_floats);

  // Hands a free buffer to `done` now, or queues `done` (first come, first
  // served). Returns an id for Cancel.
  uint64_t Acquire(Callback done);

  // If `id` is still queued, dequeues it and calls its callback with nullptr.
  void Cancel(uint64_t id);

  // Gives a buffer back; the oldest waiter, if any, receives it.
  void Release(Buffer buffer);

  // Buffers handed out right now.
  int in_use() const;

 private:
  struct Waiter {
    uint64_t id;
    Callback done;
  };

  const size_t buffer_floats_;
  mutable absl::Mutex mu_;
  std::vector<Buffer> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STAGING_POOL_H_
