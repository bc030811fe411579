#include "client/nn/threads.h"

#include <Eigen/Core>

#ifdef FEDLEARN_HAVE_OPENBLAS
// From OpenBLAS (cblas.h declares it too, but its include path differs between
// the pthread and OpenMP variants Debian ships).
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace fedlearn::nn {

namespace {

// Agents in one process share the products' thread counts. SingleThreadedGemm
// scopes may overlap (one per agent inside a Winograd layer): the first one in
// drops the counts to 1 and the last one out restores SetComputeThreads'.
std::mutex gemm_mu;
int single_scopes = 0;     // guarded by gemm_mu
int compute_threads = -1;  // SetComputeThreads' count; -1: never called
int outside_scopes = 1;    // Eigen's count before the first open scope

void SetProductThreads(int threads) {
  Eigen::setNbThreads(threads);
#ifdef FEDLEARN_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
}

}  // namespace

void SetComputeThreads(int threads) {
  if (threads < 1) threads = 1;
  std::lock_guard<std::mutex> lock(gemm_mu);
  compute_threads = threads;
  if (single_scopes == 0) SetProductThreads(threads);
}

int ComputeThreads() {
  std::lock_guard<std::mutex> lock(gemm_mu);
  if (compute_threads > 0) return compute_threads;
  return single_scopes == 0 ? Eigen::nbThreads() : outside_scopes;
}

SingleThreadedGemm::SingleThreadedGemm() : threads_(Eigen::nbThreads()) {
  std::lock_guard<std::mutex> lock(gemm_mu);
  if (single_scopes++ == 0) {
    outside_scopes = Eigen::nbThreads();
    SetProductThreads(1);
  }
}

SingleThreadedGemm::~SingleThreadedGemm() {
  std::lock_guard<std::mutex> lock(gemm_mu);
  if (--single_scopes == 0) {
    SetProductThreads(compute_threads > 0 ? compute_threads : threads_);
  }
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
