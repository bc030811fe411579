// scripts/test-tsan.sh's check of its own set-up, built with the flags of
// build-tsan/: two threads add to a counter 1,000 times each under an
// absl::Mutex, and, given any argument, once more each without it. Under the
// TSan build with abseil's synchronization instrumented, the locked run must
// pass without a report (TSan sees the Mutex) and the unlocked one must be
// reported (the suppressions hide nothing of ours). Exit code: 0 when the count
// is right, 66 when TSan reported.
#include <thread>

#include "absl/synchronization/mutex.h"

namespace {

absl::Mutex mu;
int guarded = 0;
int unguarded = 0;

void Add(bool race) {
  for (int i = 0; i < 1000; ++i) {
    absl::MutexLock lock(&mu);
    ++guarded;
  }
  if (race) ++unguarded;
}

}  // namespace

int main(int argc, char**) {
  const bool race = argc > 1;
  std::thread other(Add, race);
  Add(race);
  other.join();
  return guarded == 2000 ? 0 : 1;
}
