#ifndef FEDLEARN_COMMON_LOG_H_
#define FEDLEARN_COMMON_LOG_H_

#include <string>

#include "absl/strings/str_format.h"

namespace fedlearn {

// Writes one line to stderr, prefixed with the UTC time: one line per event, so
// that logs of concurrent components stay readable. Thread-safe (one write per
// line).
void LogLine(const std::string& line);

// printf-style front end, checked at compile time: Logf("round %d closed", r).
template <typename... Args>
void Logf(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(absl::StrFormat(format, args...));
}

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_LOG_H_
