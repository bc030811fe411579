#ifndef FEDLEARN_SERVER_HAPPENS_BEFORE_H_
#define FEDLEARN_SERVER_HAPPENS_BEFORE_H_

#include "absl/base/config.h"

#ifdef ABSL_HAVE_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace fedlearn {

// Orderings that gRPC guarantees and ThreadSanitizer cannot see: a reactor's
// callbacks run on whichever thread completes its operation, ordered by gRPC's
// core (an operation's callback after the Start* that began it, OnDone after
// every other callback), and Debian's gRPC core is not built with TSan. A
// reactor calls HappensBefore(this) before each Start* or Finish and at the end
// of OnCancel, and HappensAfter(this) first thing in each callback, so that the
// TSan build (scripts/tsan-build.sh) checks its members across callbacks as
// gRPC orders them, and still reports two callbacks that really overlap.
// Nothing in any other build.
inline void HappensBefore(void* tag) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_release(tag);
#else
  (void)tag;
#endif
}

inline void HappensAfter(void* tag) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_acquire(tag);
#else
  (void)tag;
#endif
}

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_HAPPENS_BEFORE_H_
