#include "common/log.h"

#include <unistd.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fedlearn {

void LogLine(const std::string& line) {
  std::string out = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(),
                                     absl::UTCTimeZone());
  out += line;
  out += '\n';
  // A single write(2) keeps lines from different threads whole.
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::write(STDERR_FILENO, out.data() + done, out.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

}  // namespace fedlearn
