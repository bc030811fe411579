#include "client/nn/softmax_cross_entropy.h"

#include <algorithm>
#include <cmath>

namespace fedlearn::nn {

LossResult SoftmaxCrossEntropy(const float* logits, const uint8_t* labels,
                               int classes, int batch, float* dlogits) {
  LossResult result;
  for (int b = 0; b < batch; ++b) {
    const float* z = logits + b * classes;
    const int label = labels[b];
    int argmax = 0;
    for (int i = 1; i < classes; ++i) {
      if (z[i] > z[argmax]) argmax = i;
    }
    const double top = z[argmax];
    double sum = 0;
    for (int i = 0; i < classes; ++i) sum += std::exp(z[i] - top);
    const double log_sum = std::log(sum) + top;
    result.loss_sum += log_sum - z[label];
    result.correct += argmax == label;
    if (dlogits != nullptr) {
      float* dz = dlogits + b * classes;
      for (int i = 0; i < classes; ++i) {
        const double p = std::exp(z[i] - log_sum);
        dz[i] = static_cast<float>((p - (i == label ? 1.0 : 0.0)) / batch);
      }
    }
  }
  return result;
}

}  // namespace fedlearn::nn
