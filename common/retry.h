#ifndef FEDLEARN_COMMON_RETRY_H_
#define FEDLEARN_COMMON_RETRY_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace fedlearn {

// The failures a client answers by making the same call again after a
// backoff: the coordinator out of reach or too slow to answer, or the call
// cut off on the way. (What the agent and bench/swarm both do.)
inline bool IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kCancelled;
}

// The wait after `failures` failures in a row (0 for the first): `initial`
// doubled per failure up to `max`, times a jitter in [0.8, 1.2) drawn from
// `unit` in [0, 1), so that clients cut off together do not return together.
inline absl::Duration Backoff(int failures, absl::Duration initial,
                              absl::Duration max, double unit) {
  const int doublings = std::min(failures, 30);
  return std::min(max, initial * (int64_t{1} << doublings)) *
         (0.8 + 0.4 * unit);
}

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_RETRY_H_
