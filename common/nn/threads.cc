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

}  // namespace fedlearn::nn
