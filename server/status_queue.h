#ifndef FEDLEARN_SERVER_STATUS_QUEUE_H_
#define FEDLEARN_SERVER_STATUS_QUEUE_H_

#include <grpcpp/completion_queue.h>

#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace fedlearn {

class CoordinatorService;
class RunController;

// GetStatus on a completion queue and a thread of its own (gRPC's async API),
// so that an operator's status call is not answered behind the streams'
// callbacks. gRPC 1.51 runs every callback of the callback API through one
// first-in-first-out queue served by two threads; when a round starts, its
// downloads put thousands of write completions in that queue at once, and a
// GetStatus that came meanwhile waited 0.5-0.7 s behind them at 10,000
// clients (README, "Many clients"). Its own queue is drained by its own
// thread, which the kernel schedules beside gRPC's.
//
// Keeps kOutstanding calls requested, answers each from one status snapshot
// (RunController::GetStatus, one short lock), and stops when the server has
// shut down. Not thread-safe: its owner starts and stops it.
class StatusQueue {
 public:
  // Calls requested at a time: how many GetStatus calls are taken in at
  // once before the thread answers one.
  static constexpr int kOutstanding = 4;

  // `queue` must come from the ServerBuilder that built the server serving
  // `service` (AddCompletionQueue). `service` and `controller` must outlive
  // this.
  StatusQueue(CoordinatorService* service, const RunController* controller,
              std::unique_ptr<grpc::ServerCompletionQueue> queue);
  ~StatusQueue();  // Stop()

  // Requests the first calls and starts the thread; once the server started.
  void Start();
  // Shuts the queue down and drains it (joining the thread, if started);
  // once the server shut down, which fails the calls still requested, or
  // was never built. A call being answered meanwhile is let go of unanswered.
  // Idempotent.
  void Stop();

 private:
  struct Call;
  // Requests one more call, unless stopped: gRPC must not be asked for a call
  // or an answer on a queue that is shut down.
  void Request();
  void Run();

  CoordinatorService* const service_;
  const RunController* const controller_;
  const std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  absl::Mutex mu_;  // orders requests and answers against Stop; nothing else
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_STATUS_QUEUE_H_
