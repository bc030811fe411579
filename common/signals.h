#ifndef FEDLEARN_COMMON_SIGNALS_H_
#define FEDLEARN_COMMON_SIGNALS_H_

#include <signal.h>

namespace fedlearn {

// Blocks SIGINT and SIGTERM in the calling thread and returns the set, for a
// binary that takes them synchronously (sigtimedwait) from its main thread.
// Call it before any other thread exists, so that every thread inherits the
// mask and no thread is interrupted by them.
inline sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

}  // namespace fedlearn

#endif  // FEDLEARN_COMMON_SIGNALS_H_
