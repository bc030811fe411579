#ifndef FEDLEARN_CLIENT_NN_SOFTMAX_CROSS_ENTROPY_H_
#define FEDLEARN_CLIENT_NN_SOFTMAX_CROSS_ENTROPY_H_

#include <cstdint>

namespace fedlearn::nn {

// Softmax over each sample's logits followed by categorical cross-entropy
// against its label, computed together for numerical stability (log-sum-exp).
struct LossResult {
  double loss_sum = 0;  // sum over the batch of -log p(label)
  int correct = 0;      // samples whose largest logit is their label
};

// `logits` is classes x batch (one column per sample). When `dlogits` is not
// null it receives d(mean loss)/d(logits) = (softmax - onehot) / batch.
LossResult SoftmaxCrossEntropy(const float* logits, const uint8_t* labels,
                               int classes, int batch, float* dlogits);

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_SOFTMAX_CROSS_ENTROPY_H_
