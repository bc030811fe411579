#ifndef FEDLEARN_CLIENT_NN_DROPOUT_H_
#define FEDLEARN_CLIENT_NN_DROPOUT_H_

#include <cstdint>
#include <vector>

#include "client/nn/layer.h"

namespace fedlearn::nn {

// Inverted dropout (as Keras): in training each element is zeroed with
// probability `rate` and the survivors scaled by 1/(1-rate); at inference it is
// the identity. The mask comes from a generator seeded at construction, so
// training is reproducible.
class Dropout final : public Layer {
 public:
  Dropout(float rate, uint64_t seed) : rate_(rate), state_(seed) {}

  Shape Init(const Shape& input) override {
    shape_ = input;
    return input;
  }
  void Reserve(int max_batch) override;
  void Forward(const float* in, float* out, int batch, bool training) override;
  void Backward(const float* in, const float* out, const float* dout,
                float* din, int batch) override;
  std::string name() const override { return "dropout"; }

  void Reseed(uint64_t seed) { state_ = seed; }

 private:
  const float rate_;
  uint64_t state_;  // splitmix64
  Shape shape_;
  bool last_training_ = false;
  std::vector<float>
      mask_;  // 0 or 1/(1-rate) per element of the last training batch
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_DROPOUT_H_
