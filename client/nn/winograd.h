#ifndef FEDLEARN_CLIENT_NN_WINOGRAD_H_
#define FEDLEARN_CLIENT_NN_WINOGRAD_H_

#include <vector>

#include "client/nn/layer.h"
#include "client/nn/threads.h"

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
// dropped.
//
// The batch runs in chunks of a few samples, whose transforms take about 1 MB
// (one core's L2), whatever the batch. With several compute threads
// (SetComputeThreads) the chunks are shared out between them, each with its
// own workspace and single-threaded GEMMs; dW is summed over the threads in a
// fixed order, so a given thread count gives the same result every time. An
// instance is not thread-safe itself.
class Winograd3x3 {
 public:
  // `in` and `out` are the convolution's shapes; `pad` is 0 (valid) or 1
  // (same).
  void Init(const Shape& in, const Shape& out, int pad);
  void Reserve(int max_batch);

  // out = conv(in, weight), without bias.
  void Forward(const float* in, const float* weight, float* out, int batch);
  // weight_grad = dL/dW and, unless it is null, din = dL/dX, for `in` and the
  // weights of the last Forward.
  void Backward(const float* in, const float* dout, float* weight_grad,
                float* din, int batch);

 private:
  // Samples [first, first + samples) of a batch of `batch`.
  struct Chunk {
    int batch, first, samples;
    int64_t tiles;  // samples * tiles per sample
  };
  // One compute thread's buffers.
  struct Workspace {
    std::vector<float> v;  // [16][in][tiles]: B' d B, then dX's P = Z U'
    std::vector<float> m;  // [16][out][tiles]: forward products, then A dY A'
    std::vector<float> s;  // [16][out][in]: this thread's share of dW's S
    std::vector<float> plane;      // one zero-bordered input plane
    std::vector<float> rows;       // B' d for a row of tiles: 4 rows of plane
    std::vector<float> out_plane;  // an output plane rounded up to whole tiles
  };
  // Splits `batch` into chunks for `threads` threads and sizes their
  // workspaces.
  std::vector<Chunk> Prepare(int batch, int threads);
  int64_t TilesOf(int samples) const {
    return static_cast<int64_t>(samples) * tiles_h_ * tiles_w_;
  }
  // Runs fn(chunk, workspace) for every chunk, on `threads` threads: thread t
  // takes chunks t, t + n, ... where n = min(threads, chunks).
  template <typename Fn>
  void ForEachChunk(const std::vector<Chunk>& chunks, int threads, Fn fn);

  void TransformFilter(const float* weight);
  void TransformInput(const float* in, const Chunk& chunk, Workspace& ws);
  void TransformOutput(const Chunk& chunk, Workspace& ws, float* out);
  void TransformOutputGradient(const float* dout, const Chunk& chunk,
                               Workspace& ws);
  void TransformInputGradient(const Chunk& chunk, Workspace& ws, float* din);

  Shape in_, out_;
  int pad_ = 0;
  int tiles_h_ = 0, tiles_w_ = 0;  // tiles per sample: tiles_h_ * tiles_w_
  int64_t plane_w_ = 0;            // 2 * tiles_w_ + 2
  // A valid convolution with an even output size has tiles that cover its
  // input exactly: its planes are then read and written in place.
  bool input_is_plane_ = false;
  bool output_is_exact_ = false;       // even output height and width
  std::vector<float> u_;               // [16][out][in]: G g G'
  std::vector<Workspace> workspaces_;  // one per thread
  ThreadGroup threads_;
};

}  // namespace fedlearn::nn

#endif  // FEDLEARN_CLIENT_NN_WINOGRAD_H_
