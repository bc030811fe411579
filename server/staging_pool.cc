#include "server/staging_pool.h"

#include <utility>

namespace fedlearn {

StagingPool::StagingPool(int num_buffers, size_t buffer_floats)
    : buffer_floats_(buffer_floats) {
  // Buffers are allocated lazily, on first use, and then kept: a coordinator
  // that never sees concurrent pushes never pays for the extra buffers.
  free_.resize(num_buffers);
}

uint64_t StagingPool::Acquire(Callback done) {
  Buffer buffer;
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    if (free_.empty()) {
      waiters_.push_back(Waiter{id, std::move(done)});
      return id;
    }
    buffer = std::move(free_.back());
    free_.pop_back();
    ++in_use_;
  }
  if (buffer == nullptr)
    buffer = std::make_unique<std::vector<float>>(buffer_floats_);
  done(std::move(buffer));
  return id;
}

void StagingPool::Cancel(uint64_t id) {
  Callback done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      if (it->id == id) {
        done = std::move(it->done);
        waiters_.erase(it);
        break;
      }
    }
  }
  if (done) done(nullptr);
}

void StagingPool::Release(Buffer buffer) {
  Callback next;
  {
    absl::MutexLock lock(&mu_);
    if (waiters_.empty()) {
      free_.push_back(std::move(buffer));
      --in_use_;
      return;
    }
    next = std::move(waiters_.front().done);
    waiters_.pop_front();
  }
  next(std::move(buffer));
}

int StagingPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

}  // namespace fedlearn
