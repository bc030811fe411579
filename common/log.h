#ifndef FEDLEARN_COMMON_LOG_H_
#define FEDLEARN_COMMON_LOG_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace fedlearn {

// Writes one line to stderr, prefixed with the UTC time: one line per event, so
// that logs of concurrent components stay readable. Thread-safe (one write per
// line). While a BackgroundLog exists, the line is queued for its thread
// instead, and LogLine returns without waiting for stderr.
void LogLine(const std::string& line);

// printf-style front end, checked at compile time: Logf("round %d closed", r).
template <typename... Args>
void Logf(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(absl::StrFormat(format, args...));
}

// While it exists, LogLine's lines are written to `fd` by a thread of its own,
// so that no caller (the coordinator logs under its run's lock) waits for the
// reader of stderr: a log collector that stops reading a pipe holds up that
// thread alone. Lines queue up to `max_bytes` of text; past that they are
// dropped and counted, and a line saying how many follows what was written
// before them. Destroying it writes what is queued, waiting at most `drain`
// for the reader, and LogLine writes at once again. Lines still queued when
// the process dies without destroying it (a crash) are lost. One at a time.
class BackgroundLog {
 public:
  explicit BackgroundLog(size_t max_bytes = size_t{4} << 20,
                         int fd = STDERR_FILENO,
                         absl::Duration drain = absl::Seconds(5));
  ~BackgroundLog();
  BackgroundLog(const BackgroundLog&) = delete;
  BackgroundLog& operator=(const BackgroundLog&) = delete;

  // Lines dropped so far because the queue was full.
  uint64_t dropped() const;

  struct State;  // shared with the writing thread, which may outlive this

 private:
  const absl::Duration drain_;
  std::shared_ptr<State> state_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_LOG_H_
