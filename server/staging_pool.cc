#include "server/staging_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"

namespace fedlearn {

StagingPool::StagingPool(int num_buffers, size_t buffer_floats, Policy policy)
    : buffer_floats_(buffer_floats), policy_(policy) {
  // The first buffer is made (and its pages touched) now, since every run
  // needs it: the first push would otherwise wait for its page faults before
  // its go-ahead (14 ms for mnist_cnn's 4.8 MB in 4 KiB pages on this
  // project's test VM; AlignedVector asks for huge pages, which cut that where
  // the kernel grants them). The others are allocated on first use and then
  // kept: a coordinator that never sees concurrent pushes never pays for them.
  free_.resize(num_buffers);
  if (!free_.empty()) {
    free_.back() = std::make_unique<AlignedVector<float>>(buffer_floats_);
  }
}

void StagingPool::GrantLocked(Waiter& waiter, absl::Time now) {
  Held& lease = leases_[waiter.id];
  lease.preempt = std::move(waiter.preempt);
  lease.granted = now;
  lease.last_progress = now;
}

StagingPool::Lease StagingPool::Acquire(Callback done, Preempt preempt,
                                        absl::Time now) {
  Lease lease;
  {
    absl::MutexLock lock(&mu_);
    lease.id = next_id_++;
    Waiter waiter{lease.id, std::move(done), std::move(preempt)};
    if (free_.empty()) {
      waiters_.push_back(std::move(waiter));
      ++num_waiting_;
      return lease;
    }
    lease.buffer = std::move(free_.back());
    free_.pop_back();
    GrantLocked(waiter, now);
  }
  // Allocated on first use, outside the lock.
  if (lease.buffer == nullptr)
    lease.buffer = std::make_unique<AlignedVector<float>>(buffer_floats_);
  return lease;
}

void StagingPool::Cancel(uint64_t id) {
  Callback done;
  {
    absl::MutexLock lock(&mu_);
    // Ids are handed out in order, and waiters queue in order: a binary
    // search, and the waiter left in place as a tombstone (no callback), so
    // that a quorum's close cancelling W waiting pushes costs O(W log W), not
    // O(W^2). A lease already granted is not found.
    auto it = std::lower_bound(
        waiters_.begin(), waiters_.end(), id,
        [](const Waiter& w, uint64_t wanted) { return w.id < wanted; });
    if (it == waiters_.end() || it->id != id || !it->done) return;
    done = std::move(it->done);
    it->done = nullptr;
    it->preempt = nullptr;
    --num_waiting_;
    TrimLocked();
  }
  done(nullptr);
}

void StagingPool::TrimLocked() {
  while (!waiters_.empty() && !waiters_.front().done) waiters_.pop_front();
  while (!waiters_.empty() && !waiters_.back().done) waiters_.pop_back();
}

void StagingPool::Progress(uint64_t id, int64_t bytes, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  it->second.bytes += bytes;
  it->second.last_progress = now;
}

void StagingPool::Release(uint64_t id, Buffer buffer, absl::Time now) {
  Callback next;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it != leases_.end()) {
      const Held& held = it->second;
      const double seconds = absl::ToDoubleSeconds(now - held.granted);
      if (!held.reclaimed && held.bytes > 0 && seconds > 0) {
        const double rate = static_cast<double>(held.bytes) / seconds;
        if (recent_rates_.size() == kRecentUploads) recent_rates_.pop_front();
        recent_rates_.push_back(rate);
      }
      leases_.erase(it);
    }
    if (waiters_.empty()) {
      free_.push_back(std::move(buffer));
      return;
    }
    Waiter& waiter = waiters_.front();  // live: TrimLocked keeps it so
    GrantLocked(waiter, now);
    next = std::move(waiter.done);
    waiters_.pop_front();
    --num_waiting_;
    TrimLocked();
  }
  next(std::move(buffer));
}

std::pair<double, std::string> StagingPool::SlowBarLocked() const {
  std::pair<double, std::string> bar{
      policy_.min_rate,
      absl::StrFormat("--min_upload_rate=%.0f bytes/s", policy_.min_rate)};
  if (recent_rates_.empty()) return bar;
  std::vector<double> rates(recent_rates_.begin(), recent_rates_.end());
  auto middle = rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2);
  std::nth_element(rates.begin(), middle, rates.end());
  const double peers = kPeerRateFraction * *middle;
  if (peers < bar.first) {
    bar = {peers,
           absl::StrFormat("%.0f bytes/s (1/%.0f of the median rate of "
                           "the last %d uploads; --min_upload_rate=%.0f)",
                           peers, 1 / kPeerRateFraction, rates.size(),
                           policy_.min_rate)};
  }
  return bar;
}

std::vector<StagingPool::Reclaimed> StagingPool::Reclaim(absl::Time now) {
  std::vector<Reclaimed> out;
  absl::MutexLock lock(&mu_);
  auto take = [&out](uint64_t id, Held& lease, std::string reason) {
    lease.reclaimed = true;
    out.push_back(Reclaimed{id, lease.preempt, std::move(reason)});
  };
  // Stalled: nothing arrived for idle_timeout, whoever waits.
  for (auto& [id, lease] : leases_) {
    if (lease.reclaimed || now - lease.last_progress < policy_.idle_timeout) {
      continue;
    }
    take(id, lease,
         absl::StrFormat("upload stalled: nothing received for %s "
                         "(--stall_timeout)",
                         absl::FormatDuration(now - lease.last_progress)));
  }
  // Trickling while others wait: the slowest first, one per waiter.
  size_t wanted = num_waiting_;
  if (wanted == 0) return out;
  wanted -= std::min(wanted, out.size());
  struct Slow {
    double rate;
    uint64_t id;
  };
  const auto [bar, bar_reason] = SlowBarLocked();
  std::vector<Slow> slow;
  for (const auto& [id, lease] : leases_) {
    const absl::Duration held = now - lease.granted;
    if (lease.reclaimed || held < policy_.grace) continue;
    const double rate =
        static_cast<double>(lease.bytes) / absl::ToDoubleSeconds(held);
    if (rate < bar) slow.push_back({rate, id});
  }
  std::sort(slow.begin(), slow.end(), [](const Slow& a, const Slow& b) {
    return a.rate < b.rate || (a.rate == b.rate && a.id < b.id);
  });
  for (size_t i = 0; i < slow.size() && i < wanted; ++i) {
    take(slow[i].id, leases_[slow[i].id],
         absl::StrFormat(
             "upload too slow: %.0f bytes/s over %s, below %s, while %d "
             "other upload(s) waited for its buffer",
             slow[i].rate,
             absl::FormatDuration(absl::Trunc(now - leases_[slow[i].id].granted,
                                              absl::Milliseconds(1))),
             bar_reason, num_waiting_));
  }
  return out;
}

int StagingPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(leases_.size());
}

int StagingPool::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(num_waiting_);
}

}  // namespace fedlearn
