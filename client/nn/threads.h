#ifndef FEDLEARN_CLIENT_NN_THREADS_H_
#define FEDLEARN_CLIENT_NN_THREADS_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fedlearn::nn {

// Sets how many threads the matrix products use: Eigen's and, when the build
// routes Eigen's products to OpenBLAS (EIGEN_USE_BLAS), OpenBLAS's.
// Process-wide: agents sharing a process share the setting (fedlearn-client
// gives each agent cores / agents).
void SetComputeThreads(int threads);

// The thread count to share work out over: SetComputeThreads', else Eigen's.
// Not Eigen::nbThreads() itself, which a SingleThreadedGemm scope of another
// agent in the process may have dropped to 1 for the while: a layer that
// split its work by that would sum in a timing-dependent order.
int ComputeThreads();

// While alive, matrix products run on the thread that calls them, for code
// that shares work out over its own threads and multiplies in each of them
// (OpenBLAS, or Eigen's OpenMP, would otherwise start threads inside every
// product). Process-wide like SetComputeThreads: while any scope is alive,
// every product in the process runs on one thread; the last scope to go
// restores the SetComputeThreads count.
class SingleThreadedGemm {
 public:
  SingleThreadedGemm();
  ~SingleThreadedGemm();
  SingleThreadedGemm(const SingleThreadedGemm&) = delete;
  SingleThreadedGemm& operator=(const SingleThreadedGemm&) = delete;

 private:
  int threads_;  // restored if SetComputeThreads was never called
};

// Helper threads that sleep until Run hands them work. Blocking, not spinning,
// matters here: OpenMP's workers spin for a while after each parallel region,
// and on two cores that took the CPU from OpenBLAS's threads in the layers
// around (a B=10 training step on 2 threads ran at half speed).
class ThreadGroup {
 public:
  ThreadGroup() = default;
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  // Runs fn(0), ..., fn(n - 1) at once, fn(0) on the calling thread and the
  // others on helpers (started on first use), and returns when all are done.
  void Run(int n, const std::function<void(int)>& fn);

 private:
  void Loop(int index);

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> helpers_;  // helper i runs fn(i + 1)
  const std::function<void(int)>* job_ = nullptr;
  int64_t generation_ = 0;  // one per Run
  int taking_part_ = 0;     // n of the current Run
  int pending_ = 0;         // helpers still running it
  bool stop_ = false;
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_THREADS_H_
