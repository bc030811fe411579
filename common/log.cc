#include "common/log.h"

#include <unistd.h>

#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace fedlearn {

struct BackgroundLog::State {
  explicit State(size_t max_bytes, int fd) : max_bytes(max_bytes), fd(fd) {}
  const size_t max_bytes;
  const int fd;
  absl::Mutex mu;
  std::deque<std::string> lines ABSL_GUARDED_BY(mu);
  size_t bytes ABSL_GUARDED_BY(mu) = 0;      // of `lines`
  uint64_t dropped ABSL_GUARDED_BY(mu) = 0;  // since the last notice
  uint64_t dropped_total ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;  // the thread wrote its last
};

namespace {

// A single write(2) per line keeps lines from different threads whole.
void WriteAll(int fd, const std::string& out) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(fd, out.data() + done, out.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string Stamped(absl::string_view line) {
  return absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(),
                                       absl::UTCTimeZone()),
                      line, "\n");
}

// The BackgroundLog in force, if any.
absl::Mutex installed_mu(absl::kConstInit);
std::shared_ptr<BackgroundLog::State> installed ABSL_GUARDED_BY(installed_mu);

std::shared_ptr<BackgroundLog::State> Installed() {
  absl::MutexLock lock(&installed_mu);
  return installed;
}

// The writing thread: takes what is queued, writes it with no lock held.
void Drain(const std::shared_ptr<BackgroundLog::State>& state) {
  BackgroundLog::State& s = *state;
  for (;;) {
    std::deque<std::string> batch;
    uint64_t dropped = 0;
    {
      absl::MutexLock lock(&s.mu);
      auto ready = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
        return !s.lines.empty() || s.dropped > 0 || s.stopping;
      };
      s.mu.Await(absl::Condition(&ready));
      if (s.lines.empty() && s.dropped == 0) {
        s.finished = true;  // stopping, and nothing left
        return;
      }
      batch.swap(s.lines);
      s.bytes = 0;
      dropped = std::exchange(s.dropped, 0);
    }
    for (const std::string& line : batch) WriteAll(s.fd, line);
    if (dropped > 0) {
      WriteAll(s.fd, Stamped(absl::StrCat(
                         dropped,
                         " log lines dropped: the log's reader fell behind (",
                         s.max_bytes >> 10, " KiB queued)")));
    }
  }
}

}  // namespace

void LogLine(const std::string& line) {
  std::string out = Stamped(line);
  const std::shared_ptr<BackgroundLog::State> state = Installed();
  if (state == nullptr) {
    WriteAll(STDERR_FILENO, out);
    return;
  }
  absl::MutexLock lock(&state->mu);
  if (state->bytes + out.size() > state->max_bytes) {
    ++state->dropped;
    ++state->dropped_total;
    return;
  }
  state->bytes += out.size();
  state->lines.push_back(std::move(out));
}

BackgroundLog::BackgroundLog(size_t max_bytes, int fd, absl::Duration drain)
    : drain_(drain), state_(std::make_shared<State>(max_bytes, fd)) {
  std::thread([state = state_] { Drain(state); }).detach();
  absl::MutexLock lock(&installed_mu);
  installed = state_;
}

BackgroundLog::~BackgroundLog() {
  {
    absl::MutexLock lock(&installed_mu);
    if (installed == state_) installed = nullptr;
  }
  absl::MutexLock lock(&state_->mu);
  state_->stopping = true;
  // The thread owns the state too: if the reader never comes back, it is
  // left blocked in write(2) and ends with the process.
  State& s = *state_;
  auto finished = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    return s.finished;
  };
  s.mu.AwaitWithTimeout(absl::Condition(&finished), drain_);
}

uint64_t BackgroundLog::dropped() const {
  absl::MutexLock lock(&state_->mu);
  return state_->dropped_total;
}

}  // namespace fedlearn
