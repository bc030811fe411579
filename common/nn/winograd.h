#ifndef FEDLEARN_COMMON_NN_WINOGRAD_H_
#define FEDLEARN_COMMON_NN_WINOGRAD_H_

#include <vector>

#include "common/nn/layer.h"

namespace fedlearn::nn {

// A 3x3, stride-1 convolution by Winograd's minimal filtering F(2x2, 3x3)
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
// Each 2x2 block of outputs ("tile") comes from a 4x4 block of input d as
//   Y = A' [ (G g G') .* (B' d B) ] A
// with fixed 4x4, 4x3 and 4x2 matrices B, G, A: 16 multiplications per tile
// and channel pair where the direct form takes 36. Summed over input channels,
// each of the 16 element positions xi becomes one GEMM over all tiles:
//   M[xi] (tiles x out) = V[xi] (tiles x in) * U[xi] (in x out).
//
// Backward runs the exact adjoint of that linear map, so the gradients are
// those of the convolution itself (up to rounding), not of an approximation:
//   Z  = A dY A'                       per tile (dY zero beyond the output)
//   dW = G' [ sum over tiles V[xi]' Z[xi] ] G
//   dX = B [ Z[xi] U[xi]' ] B'         scattered back over the input tiles
//
// Activations are CNHW (see layer.h) and weights [out, in, 3, 3], as Conv2D's.
// An odd output height or width gets a last tile whose extra row or column is
// dropped. Not thread-safe. The workspaces hold the transforms of a few
// samples, about 1 MB per compute thread, whatever the batch.
class Winograd3x3 {
 public:
  // `in` and `out` are the convolution's shapes; `pad` is 0 (valid) or 1
  // (same).
  void Init(const Shape& in, const Shape& out, int pad);
  void Reserve(int max_batch);

  // out = conv(in, weight), without bias.
  void Forward(const float* in, const float* weight, float* out, int batch);
  // weight_grad = dL/dW and, unless it is null, din = dL/dX, for `in` and the
  // weights of the last Forward. A batch that fitted in one chunk keeps V from
  // Forward; dX reuses its buffer, so a second Backward transforms `in` again.
  void Backward(const float* in, const float* dout, float* weight_grad,
                float* din, int batch);

 private:
  // Samples [first, first + samples) of a batch of `batch`: the transforms
  // and GEMMs run on ChunkSamples() samples or fewer at a time.
  struct Chunk {
    int batch, first, samples;
    int64_t tiles;  // samples * tiles per sample
  };
  int ChunkSamples() const;
  // Splits `batch` into chunks and makes sure the workspaces hold one.
  std::vector<Chunk> Chunks(int batch);

  void TransformFilter(const float* weight);
  void TransformInput(const float* in, const Chunk& chunk);
  void TransformOutput(const Chunk& chunk, float* out);
  void TransformOutputGradient(const float* dout, const Chunk& chunk);
  void TransformInputGradient(const Chunk& chunk, float* din);

  Shape in_, out_;
  int pad_ = 0;
  int tiles_h_ = 0, tiles_w_ = 0;  // tiles per sample: tiles_h_ * tiles_w_
  int64_t plane_w_ = 0;            // 2 * tiles_w_ + 2
  // A valid convolution with an even output size has tiles that cover its
  // input exactly: its planes are then read and written in place.
  bool input_is_plane_ = false;
  bool output_is_exact_ = false;  // even output height and width
  bool v_holds_input_ = false;    // v_ is B' d B of the last Forward's input
  std::vector<float> v_;  // [16][in][tiles]: B' d B; dX's per-tile terms later
  std::vector<float> m_;  // [16][out][tiles]: forward products, then A dY A'
  std::vector<float> u_;  // [16][out][in]: G g G'
  std::vector<float> s_;  // [16][out][in]: dW before G' . G
  std::vector<float> plane_;      // one zero-bordered input plane
  std::vector<float> rows_;       // B' d for one row of tiles: 4 rows of plane_
  std::vector<float> out_plane_;  // one output plane rounded up to whole tiles
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_COMMON_NN_WINOGRAD_H_
