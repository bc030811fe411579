#ifndef FEDLEARN_CLIENT_NN_LAYER_H_
#define FEDLEARN_CLIENT_NN_LAYER_H_

#include <cstdint>
#include <string>

namespace fedlearn::nn {

// The shape of one sample's activations. Two memory layouts are used for a
// batch of B samples, chosen so that every GEMM runs on the buffers as they
// are:
//  - spatial (c, h, w): "CNHW", element (c, b, y, x) at ((c*B + b)*h + y)*w +
//  x. A conv is
//    then one GEMM over all B*h*w positions, with PyTorch's [out, in, kh, kw]
//    weights.
//  - flat (h == w == 1): one column per sample, element (f, b) at b*c + f.
struct Shape {
  int64_t c = 0, h = 1, w = 1;
  bool spatial = false;
  int64_t size() const { return c * h * w; }  // per sample
};

// One layer of a sequential network: forward, backward, and its parameters as
// views into the network's flat parameter and gradient vectors (in the model
// spec's wire order, so parameters travel without copies). A layer keeps what
// backward needs from forward in its own workspace, sized once by Reserve. Not
// thread-safe: one network, one thread.
class Layer {
 public:
  virtual ~Layer() = default;

  // Fixes the input shape; returns the output shape.
  virtual Shape Init(const Shape& input) = 0;

  // Sizes workspaces for batches of up to `max_batch` samples.
  virtual void Reserve(int max_batch) { (void)max_batch; }

  // out = f(in) for `batch` samples. `training` switches dropout on.
  virtual void Forward(const float* in, float* out, int batch,
                       bool training) = 0;

  // Given dL/d(out), writes dL/d(parameters) into the bound gradients and
  // dL/d(in) (skipped when `din` is null: the network's first layer). `in` and
  // `out` are the buffers of the last Forward.
  virtual void Backward(const float* in, const float* out, const float* dout,
                        float* din, int batch) = 0;

  // Number of parameter tensors (weight, bias: 2; none: 0), in the order Bind
  // takes them.
  virtual int num_parameter_tensors() const { return 0; }
  // Element count of the i-th parameter tensor (valid after Init).
  virtual int64_t parameter_size(int i) const {
    (void)i;
    return 0;
  }
  // Points the layer's i-th tensor at `values` and its gradient at `grads`.
  virtual void Bind(int i, float* values, float* grads) {
    (void)i, (void)values, (void)grads;
  }

  virtual std::string name() const = 0;
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_LAYER_H_
