#include "common/nn/threads.h"

#include <Eigen/Core>

#ifdef FEDLEARN_HAVE_OPENBLAS
// From OpenBLAS (cblas.h declares it too, but its include path differs between
// the pthread and OpenMP variants Debian ships).
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace fedlearn::nn {

void SetComputeThreads(int threads) {
  if (threads < 1) threads = 1;
  Eigen::setNbThreads(threads);
#ifdef FEDLEARN_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
}

SingleThreadedGemm::SingleThreadedGemm() : threads_(Eigen::nbThreads()) {
  // Eigen's own products already stay on one thread inside an OpenMP region.
#ifdef FEDLEARN_HAVE_OPENBLAS
  if (threads_ > 1) openblas_set_num_threads(1);
#endif
}

SingleThreadedGemm::~SingleThreadedGemm() {
#ifdef FEDLEARN_HAVE_OPENBLAS
  if (threads_ > 1) openblas_set_num_threads(threads_);
#endif
}

ThreadGroup::~ThreadGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ThreadGroup::Run(int n, const std::function<void(int)>& fn) {
  if (n <= 1) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (static_cast<int>(helpers_.size()) < n - 1) {
      const int index = static_cast<int>(helpers_.size()) + 1;
      helpers_.emplace_back([this, index] { Loop(index); });
    }
    job_ = &fn;
    taking_part_ = n;
    pending_ = n - 1;
    ++generation_;
  }
  wake_.notify_all();
  fn(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadGroup::Loop(int index) {
  int64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= taking_part_) continue;  // this Run needs fewer threads
    const std::function<void(int)>& job = *job_;
    lock.unlock();
    job(index);
    lock.lock();
    if (--pending_ == 0) done_.notify_one();
  }
}

}  // namespace fedlearn::nn
