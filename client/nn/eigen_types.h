#ifndef FEDLEARN_CLIENT_NN_EIGEN_TYPES_H_
#define FEDLEARN_CLIENT_NN_EIGEN_TYPES_H_

#include <Eigen/Core>

namespace fedlearn::nn {

// Column-major float matrices and maps over raw buffers (no copies).
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;
using MatrixMap = Eigen::Map<Matrix>;
using ConstMatrixMap = Eigen::Map<const Matrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_EIGEN_TYPES_H_
