#include "common/nn/winograd.h"

#include <algorithm>

#include "common/nn/eigen_types.h"

namespace fedlearn::nn {
namespace {

constexpr int kXi = 16;  // element positions of a 4x4 tile

// Workspace (V and M) per pass and compute thread, about one core's L2: the
// transforms then read what the GEMMs just wrote while it is still in cache.
// For mnist_cnn's second layer that is one sample per pass and thread (885
// kB). In alternating runs, 10 agents on 2 cores trained rounds 5-10% faster
// with one sample per pass than with whole batches of 10, and the workspace
// no longer grows with the batch (an evaluation batch of 50 would take 44 MB).
constexpr int64_t kChunkBytes = 1 << 20;

}  // namespace

void Winograd3x3::Init(const Shape& in, const Shape& out, int pad) {
  in_ = in;
  out_ = out;
  pad_ = pad;
  tiles_h_ = static_cast<int>((out.h + 1) / 2);
  tiles_w_ = static_cast<int>((out.w + 1) / 2);
  plane_w_ = 2 * tiles_w_ + 2;
  u_.resize(static_cast<size_t>(kXi) * in.c * out.c);
  s_.resize(u_.size());
  // Tiles start every 2 rows and columns and reach 2 beyond: the plane covers
  // the input and its zero border (pad on the top and left, the rest of the
  // last tile on the bottom and right).
  plane_.assign(static_cast<size_t>(2 * tiles_h_ + 2) * plane_w_, 0.0f);
  input_is_plane_ = pad == 0 && in.h == 2 * tiles_h_ + 2 && in.w == plane_w_;
  output_is_exact_ = out.h == 2 * tiles_h_ && out.w == 2 * tiles_w_;
  rows_.resize(static_cast<size_t>(4) * plane_w_);
  out_plane_.resize(static_cast<size_t>(4) * tiles_h_ * tiles_w_);
}

void Winograd3x3::Reserve(int max_batch) {
  const size_t tiles =
      static_cast<size_t>(std::min(max_batch, ChunkSamples())) * tiles_h_ *
      tiles_w_;
  if (v_.size() < kXi * tiles * in_.c) v_.resize(kXi * tiles * in_.c);
  if (m_.size() < kXi * tiles * out_.c) m_.resize(kXi * tiles * out_.c);
}

int Winograd3x3::ChunkSamples() const {
  const int64_t per_sample = static_cast<int64_t>(sizeof(float)) * kXi *
                             tiles_h_ * tiles_w_ * (in_.c + out_.c);
  const int64_t budget = kChunkBytes * std::max(1, Eigen::nbThreads());
  return static_cast<int>(std::clamp<int64_t>(budget / per_sample, 1, 1024));
}

std::vector<Winograd3x3::Chunk> Winograd3x3::Chunks(int batch) {
  // Even parts: 10 samples at most 4 at a time run as 4 + 3 + 3, not 4 + 4 + 2.
  const int most = ChunkSamples();
  const int parts = (batch + most - 1) / most;
  Reserve(std::min(batch, most));
  std::vector<Chunk> chunks;
  for (int i = 0, b0 = 0; i < parts; ++i) {
    const int nb = batch / parts + (i < batch % parts ? 1 : 0);
    chunks.push_back(
        Chunk{batch, b0, nb, static_cast<int64_t>(nb) * tiles_h_ * tiles_w_});
    b0 += nb;
  }
  return chunks;
}

// V = B' d B for every tile and input channel, where
//   B' = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
// One row of tiles at a time: first B' d down the columns of its four input
// rows (into rows_), then . B along those rows, tile by tile.
void Winograd3x3::TransformInput(const float* in, const Chunk& chunk) {
  const int64_t w = plane_w_;
  const int64_t stride = in_.c * chunk.tiles;  // between element positions
  const int n = tiles_w_;
  float* t = rows_.data();
  for (int64_t ci = 0; ci < in_.c; ++ci) {
    for (int b = 0; b < chunk.samples; ++b) {
      const float* src =
          in + (ci * chunk.batch + chunk.first + b) * in_.h * in_.w;
      const float* padded = src;
      if (!input_is_plane_) {
        // The zero border stays zero: only the input's own area is written.
        for (int64_t y = 0; y < in_.h; ++y) {
          std::copy(src + y * in_.w, src + (y + 1) * in_.w,
                    plane_.data() + (y + pad_) * w + pad_);
        }
        padded = plane_.data();
      }
      float* v = v_.data() + ci * chunk.tiles +
                 static_cast<int64_t>(b) * tiles_h_ * tiles_w_;
      for (int ty = 0; ty < tiles_h_; ++ty, v += n) {
        const float* d = padded + 2 * ty * w;
#pragma omp simd
        for (int64_t x = 0; x < w; ++x) {
          const float d0 = d[x], d1 = d[w + x];
          const float d2 = d[2 * w + x], d3 = d[3 * w + x];
          t[x] = d0 - d2;
          t[w + x] = d1 + d2;
          t[2 * w + x] = d2 - d1;
          t[3 * w + x] = d1 - d3;
        }
        for (int i = 0; i < 4; ++i) {
          const float* ti = t + i * w;
          float* vi = v + 4 * i * stride;
#pragma omp simd
          for (int tx = 0; tx < n; ++tx) {
            const float t0 = ti[2 * tx], t1 = ti[2 * tx + 1];
            const float t2 = ti[2 * tx + 2], t3 = ti[2 * tx + 3];
            vi[tx] = t0 - t2;
            vi[stride + tx] = t1 + t2;
            vi[2 * stride + tx] = t2 - t1;
            vi[3 * stride + tx] = t1 - t3;
          }
        }
      }
    }
  }
}

// U = G g G' for every channel pair, where
//   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
void Winograd3x3::TransformFilter(const float* weight) {
  const int64_t pairs = in_.c * out_.c;
  for (int64_t p = 0; p < pairs; ++p) {  // p = co * in + ci, as in weight
    const float* g = weight + 9 * p;
    float t[4][3];  // G g
    for (int j = 0; j < 3; ++j) {
      t[0][j] = g[j];
      t[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
      t[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
      t[3][j] = g[6 + j];
    }
    for (int i = 0; i < 4; ++i) {  // (G g) G'
      float* u = u_.data() + 4 * i * pairs + p;
      u[0] = t[i][0];
      u[pairs] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
      u[2 * pairs] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
      u[3 * pairs] = t[i][2];
    }
  }
}

// Y = A' M A per tile, A' = [1 1 1 0; 0 1 -1 -1]. An odd height or width
// goes through out_plane_ and is cut to size.
void Winograd3x3::TransformOutput(const Chunk& chunk, float* out) {
  const int64_t stride = out_.c * chunk.tiles;
  const int n = tiles_w_;
  for (int64_t c = 0; c < out_.c; ++c) {
    for (int b = 0; b < chunk.samples; ++b) {
      float* plane =
          out + (c * chunk.batch + chunk.first + b) * out_.h * out_.w;
      float* y = output_is_exact_ ? plane : out_plane_.data();
      const float* m = m_.data() + c * chunk.tiles +
                       static_cast<int64_t>(b) * tiles_h_ * tiles_w_;
      for (int ty = 0; ty < tiles_h_; ++ty, m += n, y += 4 * n) {
#pragma omp simd
        for (int tx = 0; tx < n; ++tx) {
          float r[2][4];  // A' M
          for (int j = 0; j < 4; ++j) {
            const float m0 = m[j * stride + tx], m1 = m[(4 + j) * stride + tx];
            const float m2 = m[(8 + j) * stride + tx];
            const float m3 = m[(12 + j) * stride + tx];
            r[0][j] = m0 + m1 + m2;
            r[1][j] = m1 - m2 - m3;
          }
          for (int i = 0; i < 2; ++i) {  // (A' M) A
            y[2 * i * n + 2 * tx] = r[i][0] + r[i][1] + r[i][2];
            y[2 * i * n + 2 * tx + 1] = r[i][1] - r[i][2] - r[i][3];
          }
        }
      }
      if (!output_is_exact_) {
        for (int64_t row = 0; row < out_.h; ++row) {
          const float* src = out_plane_.data() + row * 2 * n;
          std::copy(src, src + out_.w, plane + row * out_.w);
        }
      }
    }
  }
}

// Z = A dY A' per tile, the adjoint of TransformOutput, into m_:
//   A = [1 0; 1 1; 1 -1; 0 -1].
void Winograd3x3::TransformOutputGradient(const float* dout,
                                          const Chunk& chunk) {
  const int64_t stride = out_.c * chunk.tiles;
  const int n = tiles_w_;
  for (int64_t c = 0; c < out_.c; ++c) {
    for (int b = 0; b < chunk.samples; ++b) {
      const float* plane =
          dout + (c * chunk.batch + chunk.first + b) * out_.h * out_.w;
      const float* g = plane;
      if (!output_is_exact_) {  // dY is zero where last tiles have no output
        std::fill(out_plane_.begin(), out_plane_.end(), 0.0f);
        for (int64_t row = 0; row < out_.h; ++row) {
          std::copy(plane + row * out_.w, plane + (row + 1) * out_.w,
                    out_plane_.data() + row * 2 * n);
        }
        g = out_plane_.data();
      }
      float* z = m_.data() + c * chunk.tiles +
                 static_cast<int64_t>(b) * tiles_h_ * tiles_w_;
      for (int ty = 0; ty < tiles_h_; ++ty, z += n, g += 4 * n) {
#pragma omp simd
        for (int tx = 0; tx < n; ++tx) {
          const float g00 = g[2 * tx], g01 = g[2 * tx + 1];
          const float g10 = g[2 * n + 2 * tx], g11 = g[2 * n + 2 * tx + 1];
          const float t[4][2] = {{g00, g01},  // A dY
                                 {g00 + g10, g01 + g11},
                                 {g00 - g10, g01 - g11},
                                 {-g10, -g11}};
          for (int i = 0; i < 4; ++i) {  // (A dY) A'
            z[(4 * i + 0) * stride + tx] = t[i][0];
            z[(4 * i + 1) * stride + tx] = t[i][0] + t[i][1];
            z[(4 * i + 2) * stride + tx] = t[i][0] - t[i][1];
            z[(4 * i + 3) * stride + tx] = -t[i][1];
          }
        }
      }
    }
  }
}

// din = B P B' per tile, the adjoint of TransformInput, from P in v_. Tiles
// overlap, so each input position sums the terms of every tile it is in.
void Winograd3x3::TransformInputGradient(const Chunk& chunk, float* din) {
  const int64_t w = plane_w_;
  const int64_t stride = in_.c * chunk.tiles;
  const int n = tiles_w_;
  for (int64_t c = 0; c < in_.c; ++c) {
    for (int b = 0; b < chunk.samples; ++b) {
      float* dst = din + (c * chunk.batch + chunk.first + b) * in_.h * in_.w;
      float* padded = input_is_plane_ ? dst : plane_.data();
      std::fill(padded, padded + plane_.size(), 0.0f);
      const float* p = v_.data() + c * chunk.tiles +
                       static_cast<int64_t>(b) * tiles_h_ * tiles_w_;
      for (int ty = 0; ty < tiles_h_; ++ty, p += n) {
        float* d = padded + 2 * ty * w;
        // Neighbouring tiles share two columns: columns 0 and 1 of every tile
        // are added in one pass, columns 2 and 3 in another, so that no pass
        // writes a column twice. e = two columns of P B' (B' as above); B e
        // goes into the tile's four rows.
        const auto add_rows = [&](int64_t x, const float(&e)[4]) {
          d[x] += e[0];
          d[w + x] += e[1] - e[2] + e[3];
          d[2 * w + x] += e[1] + e[2] - e[0];
          d[3 * w + x] -= e[3];
        };
#pragma omp simd
        for (int tx = 0; tx < n; ++tx) {
          float e0[4], e1[4];
          for (int i = 0; i < 4; ++i) {
            const float p0 = p[(4 * i + 0) * stride + tx];
            const float p1 = p[(4 * i + 1) * stride + tx];
            const float p2 = p[(4 * i + 2) * stride + tx];
            const float p3 = p[(4 * i + 3) * stride + tx];
            e0[i] = p0;
            e1[i] = p1 - p2 + p3;
          }
          add_rows(2 * tx, e0);
          add_rows(2 * tx + 1, e1);
        }
#pragma omp simd
        for (int tx = 0; tx < n; ++tx) {
          float e2[4], e3[4];
          for (int i = 0; i < 4; ++i) {
            const float p0 = p[(4 * i + 0) * stride + tx];
            const float p1 = p[(4 * i + 1) * stride + tx];
            const float p2 = p[(4 * i + 2) * stride + tx];
            const float p3 = p[(4 * i + 3) * stride + tx];
            e2[i] = p1 + p2 - p0;
            e3[i] = -p3;
          }
          add_rows(2 * tx + 2, e2);
          add_rows(2 * tx + 3, e3);
        }
      }
      if (input_is_plane_) continue;
      // The border is the padding (or the dropped part of a last tile): only
      // the input's own area goes to din.
      for (int64_t y = 0; y < in_.h; ++y) {
        const float* row = plane_.data() + (y + pad_) * w + pad_;
        std::copy(row, row + in_.w, dst + y * in_.w);
      }
    }
  }
  // TransformInput's copies assume a zero border; leave it that way.
  if (!input_is_plane_) std::fill(plane_.begin(), plane_.end(), 0.0f);
}

void Winograd3x3::Forward(const float* in, const float* weight, float* out,
                          int batch) {
  TransformFilter(weight);
  const std::vector<Chunk> chunks = Chunks(batch);
  for (const Chunk& chunk : chunks) {
    TransformInput(in, chunk);
    // M[xi] (tiles x out) = V[xi] (tiles x in) * U[xi] (in x out).
    for (int xi = 0; xi < kXi; ++xi) {
      MatrixMap(m_.data() + xi * out_.c * chunk.tiles, chunk.tiles, out_.c)
          .noalias() =
          ConstMatrixMap(v_.data() + xi * in_.c * chunk.tiles, chunk.tiles,
                         in_.c) *
          ConstMatrixMap(u_.data() + xi * in_.c * out_.c, in_.c, out_.c);
    }
    TransformOutput(chunk, out);
  }
  v_holds_input_ = chunks.size() == 1;
}

void Winograd3x3::Backward(const float* in, const float* dout,
                           float* weight_grad, float* din, int batch) {
  const std::vector<Chunk> chunks = Chunks(batch);
  for (size_t k = 0; k < chunks.size(); ++k) {
    const Chunk& chunk = chunks[k];
    if (!v_holds_input_) TransformInput(in, chunk);
    TransformOutputGradient(dout, chunk);
    // S[xi] (in x out) = sum over tiles of V[xi]' Z[xi]; dW = G' S G below.
    for (int xi = 0; xi < kXi; ++xi) {
      ConstMatrixMap v(v_.data() + xi * in_.c * chunk.tiles, chunk.tiles,
                       in_.c);
      ConstMatrixMap z(m_.data() + xi * out_.c * chunk.tiles, chunk.tiles,
                       out_.c);
      MatrixMap s(s_.data() + xi * in_.c * out_.c, in_.c, out_.c);
      if (k == 0) {
        s.noalias() = v.transpose() * z;
      } else {
        s.noalias() += v.transpose() * z;
      }
    }
    if (din == nullptr) continue;
    // P[xi] (tiles x in) = Z[xi] U[xi]' with Forward's U, into v_: V is
    // needed no more.
    for (int xi = 0; xi < kXi; ++xi) {
      MatrixMap(v_.data() + xi * in_.c * chunk.tiles, chunk.tiles, in_.c)
          .noalias() =
          ConstMatrixMap(m_.data() + xi * out_.c * chunk.tiles, chunk.tiles,
                         out_.c) *
          ConstMatrixMap(u_.data() + xi * in_.c * out_.c, in_.c, out_.c)
              .transpose();
    }
    v_holds_input_ = false;
    TransformInputGradient(chunk, din);
  }
  // dW = G' S G, G' = [1 1/2 1/2 0; 0 1/2 -1/2 0; 0 1/2 1/2 1].
  const int64_t pairs = in_.c * out_.c;
  for (int64_t p = 0; p < pairs; ++p) {
    float t[3][4];  // G' S
    for (int j = 0; j < 4; ++j) {
      const float* s = s_.data() + j * pairs + p;
      const float s0 = s[0], s1 = s[4 * pairs];
      const float s2 = s[8 * pairs], s3 = s[12 * pairs];
      t[0][j] = s0 + 0.5f * (s1 + s2);
      t[1][j] = 0.5f * (s1 - s2);
      t[2][j] = 0.5f * (s1 + s2) + s3;
    }
    float* g = weight_grad + 9 * p;
    for (int i = 0; i < 3; ++i) {  // (G' S) G
      g[3 * i + 0] = t[i][0] + 0.5f * (t[i][1] + t[i][2]);
      g[3 * i + 1] = 0.5f * (t[i][1] - t[i][2]);
      g[3 * i + 2] = 0.5f * (t[i][1] + t[i][2]) + t[i][3];
    }
  }
}

}  // namespace fedlearn::nn
