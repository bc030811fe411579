#ifndef FEDLEARN_COMMON_NN_THREADS_H_
#define FEDLEARN_COMMON_NN_THREADS_H_

namespace fedlearn::nn {

// Sets how many threads the matrix products use: Eigen's and, when the build
// routes Eigen's products to OpenBLAS (EIGEN_USE_BLAS), OpenBLAS's.
// Process-wide: agents sharing a process share the setting (fedlearn-client
// gives each agent cores / agents).
void SetComputeThreads(int threads);

}  // namespace fedlearn::nn

#endif  // FEDLEARN_COMMON_NN_THREADS_H_
