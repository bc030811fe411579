#include "client/nn/winograd.h"

#include <algorithm>

#include "client/nn/eigen_types.h"
#include "client/nn/threads.h"

namespace fedlearn::nn {
namespace {

constexpr int kXi = 16;  // element positions of a 4x4 tile

// V and M of one chunk, about one core's L2: the transforms then read what
// the GEMMs just wrote while it is still in cache. For mnist_cnn's second
// layer that is one sample per chunk (885 kB). In alternating runs, 10 agents
// on 2 cores trained rounds 5-10% faster with one sample per chunk than with
// whole batches of 10, and the workspace no longer grows with the batch (an
// evaluation batch of 50 would take 44 MB).
constexpr int64_t kChunkBytes = 1 << 20;

// Element position xi of a [16][cols][rows] buffer (V, M, Z, P: rows are
// tiles; U, S: rows are input channels), as a rows x cols matrix.
MatrixMap AtPosition(std::vector<float>& buffer, int xi, int64_t rows,
                     int64_t cols) {
  return MatrixMap(buffer.data() + xi * rows * cols, rows, cols);
}

}  // namespace

void Winograd3x3::Init(const Shape& in, const Shape& out, int pad) {
  in_ = in;
  out_ = out;
  pad_ = pad;
  tiles_h_ = static_cast<int>((out.h + 1) / 2);
  tiles_w_ = static_cast<int>((out.w + 1) / 2);
  plane_w_ = 2 * tiles_w_ + 2;
  u_.resize(static_cast<size_t>(kXi) * in.c * out.c);
  input_is_plane_ = pad == 0 && in.h == 2 * tiles_h_ + 2 && in.w == plane_w_;
  output_is_exact_ = out.h == 2 * tiles_h_ && out.w == 2 * tiles_w_;
  workspaces_.clear();
}

void Winograd3x3::Reserve(int max_batch) {
  Prepare(max_batch, std::max(1, ComputeThreads()));
}

std::vector<Winograd3x3::Chunk> Winograd3x3::Prepare(int batch, int threads) {
  const int64_t per_sample =
      std::max<int64_t>(1, static_cast<int64_t>(sizeof(float)) * kXi *
                               tiles_h_ * tiles_w_ * (in_.c + out_.c));
  const int by_size =
      static_cast<int>(std::clamp<int64_t>(kChunkBytes / per_sample, 1, 1024));
  // At least one chunk per thread when the batch has the samples for it
  // (batch / threads rounded down), and even parts: 10 samples at most 4 at a
  // time run as 4 + 3 + 3, not 4 + 4 + 2.
  const int most = std::max(1, std::min(by_size, batch / threads));
  const int parts = (batch + most - 1) / most;
  std::vector<Chunk> chunks;
  for (int i = 0, b0 = 0; i < parts; ++i) {
    const int nb = batch / parts + (i < batch % parts ? 1 : 0);
    chunks.push_back(Chunk{batch, b0, nb, TilesOf(nb)});
    b0 += nb;
  }
  const size_t used = std::min<size_t>(threads, chunks.size());
  if (workspaces_.size() < used) workspaces_.resize(used);
  const size_t tiles = TilesOf(most);
  for (size_t t = 0; t < used; ++t) {
    Workspace& ws = workspaces_[t];
    if (ws.v.size() < kXi * tiles * in_.c) ws.v.resize(kXi * tiles * in_.c);
    if (ws.m.size() < kXi * tiles * out_.c) ws.m.resize(kXi * tiles * out_.c);
    if (ws.plane.empty()) {  // a workspace's first use
      ws.s.resize(u_.size());
      // Tiles start every 2 rows and columns and reach 2 beyond: the plane
      // covers the input and its zero border (pad on the top and left, the
      // rest of the last tile on the bottom and right).
      ws.plane.assign(static_cast<size_t>(2 * tiles_h_ + 2) * plane_w_, 0.0f);
      ws.rows.resize(static_cast<size_t>(4) * plane_w_);
      ws.out_plane.resize(static_cast<size_t>(4) * tiles_h_ * tiles_w_);
    }
  }
  return chunks;
}

template <typename Fn>
void Winograd3x3::ForEachChunk(const std::vector<Chunk>& chunks, int threads,
                               Fn fn) {
  const int used = static_cast<int>(std::min<size_t>(threads, chunks.size()));
  if (used <= 1) {
    for (size_t k = 0; k < chunks.size(); ++k) {
      fn(chunks[k], workspaces_[0], k == 0);
    }
    return;
  }
  // Each thread runs its own GEMMs: OpenBLAS must not split them again.
  SingleThreadedGemm single;
  threads_.Run(used, [&](int t) {
    for (size_t k = t; k < chunks.size(); k += used) {
      fn(chunks[k], workspaces_[t], k == static_cast<size_t>(t));
    }
  });
}

// V = B' d B for every tile and input channel, where
//   B' = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
// One row of tiles at a time: first B' d down the columns of its four input
// rows (into ws.rows), then . B along those rows, tile by tile.
void Winograd3x3::TransformInput(const float* in, const Chunk& chunk,
                                 Workspace& ws) {
  const int64_t w = plane_w_;
  const int64_t stride = in_.c * chunk.tiles;  // between element positions
  const int n = tiles_w_;
  float* t = ws.rows.data();
  for (int64_t ci = 0; ci < in_.c; ++ci) {
    for (int b = 0; b < chunk.samples; ++b) {
      const float* src =
          in + (ci * chunk.batch + chunk.first + b) * in_.h * in_.w;
      const float* padded = src;
      if (!input_is_plane_) {
        // The zero border stays zero: only the input's own area is written.
        for (int64_t y = 0; y < in_.h; ++y) {
          std::copy(src + y * in_.w, src + (y + 1) * in_.w,
                    ws.plane.data() + (y + pad_) * w + pad_);
        }
        padded = ws.plane.data();
      }
      float* v = ws.v.data() + ci * chunk.tiles + TilesOf(b);
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
// goes through ws.out_plane and is cut to size.
void Winograd3x3::TransformOutput(const Chunk& chunk, Workspace& ws,
                                  float* out) {
  const int64_t stride = out_.c * chunk.tiles;
  const int n = tiles_w_;
  for (int64_t c = 0; c < out_.c; ++c) {
    for (int b = 0; b < chunk.samples; ++b) {
      float* plane =
          out + (c * chunk.batch + chunk.first + b) * out_.h * out_.w;
      float* y = output_is_exact_ ? plane : ws.out_plane.data();
      const float* m = ws.m.data() + c * chunk.tiles + TilesOf(b);
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
          const float* src = ws.out_plane.data() + row * 2 * n;
          std::copy(src, src + out_.w, plane + row * out_.w);
        }
      }
    }
  }
}

// Z = A dY A' per tile, the adjoint of TransformOutput, into ws.m:
//   A = [1 0; 1 1; 1 -1; 0 -1].
void Winograd3x3::TransformOutputGradient(const float* dout, const Chunk& chunk,
                                          Workspace& ws) {
  const int64_t stride = out_.c * chunk.tiles;
  const int n = tiles_w_;
  for (int64_t c = 0; c < out_.c; ++c) {
    for (int b = 0; b < chunk.samples; ++b) {
      const float* plane =
          dout + (c * chunk.batch + chunk.first + b) * out_.h * out_.w;
      const float* g = plane;
      if (!output_is_exact_) {  // dY is zero where last tiles have no output
        std::fill(ws.out_plane.begin(), ws.out_plane.end(), 0.0f);
        for (int64_t row = 0; row < out_.h; ++row) {
          std::copy(plane + row * out_.w, plane + (row + 1) * out_.w,
                    ws.out_plane.data() + row * 2 * n);
        }
        g = ws.out_plane.data();
      }
      float* z = ws.m.data() + c * chunk.tiles + TilesOf(b);
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

// din = B P B' per tile, the adjoint of TransformInput, from P in ws.v. Tiles
// overlap, so each input position sums the terms of every tile it is in.
void Winograd3x3::TransformInputGradient(const Chunk& chunk, Workspace& ws,
                                         float* din) {
  const int64_t w = plane_w_;
  const int64_t stride = in_.c * chunk.tiles;
  const int n = tiles_w_;
  for (int64_t c = 0; c < in_.c; ++c) {
    for (int b = 0; b < chunk.samples; ++b) {
      float* dst = din + (c * chunk.batch + chunk.first + b) * in_.h * in_.w;
      float* padded = input_is_plane_ ? dst : ws.plane.data();
      std::fill(padded, padded + ws.plane.size(), 0.0f);
      const float* p = ws.v.data() + c * chunk.tiles + TilesOf(b);
      for (int ty = 0; ty < tiles_h_; ++ty, p += n) {
        float* d = padded + 2 * ty * w;
        // Neighbouring tiles share two columns: columns 0 and 1 of every tile
        // are added in one pass, columns 2 and 3 in another, so that no pass
        // writes a column twice. e = two columns of P B' (B' as above); B e
        // goes into the tile's four rows. Both passes spell out their loads:
        // with a shared helper for them GCC 12 no longer vectorises the loops.
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
        const float* row = ws.plane.data() + (y + pad_) * w + pad_;
        std::copy(row, row + in_.w, dst + y * in_.w);
      }
    }
  }
  // TransformInput's copies assume a zero border; leave it that way.
  if (!input_is_plane_) std::fill(ws.plane.begin(), ws.plane.end(), 0.0f);
}

void Winograd3x3::Forward(const float* in, const float* weight, float* out,
                          int batch) {
  TransformFilter(weight);
  const int threads = std::max(1, ComputeThreads());
  const std::vector<Chunk> chunks = Prepare(batch, threads);
  ForEachChunk(chunks, threads,
               [&](const Chunk& chunk, Workspace& ws, bool /*first*/) {
                 TransformInput(in, chunk, ws);
                 // M[xi] (tiles x out) = V[xi] (tiles x in) * U[xi] (in x out)
                 for (int xi = 0; xi < kXi; ++xi) {
                   AtPosition(ws.m, xi, chunk.tiles, out_.c).noalias() =
                       AtPosition(ws.v, xi, chunk.tiles, in_.c) *
                       AtPosition(u_, xi, in_.c, out_.c);
                 }
                 TransformOutput(chunk, ws, out);
               });
}

void Winograd3x3::Backward(const float* in, const float* dout,
                           float* weight_grad, float* din, int batch) {
  if (batch <= 0) {  // nothing to sum: dW = 0, and din has no samples
    std::fill(weight_grad, weight_grad + 9 * in_.c * out_.c, 0.0f);
    return;
  }
  const int threads = std::max(1, ComputeThreads());
  const std::vector<Chunk> chunks = Prepare(batch, threads);
  const auto backward = [&](const Chunk& chunk, Workspace& ws, bool first) {
    // V again rather than kept from Forward: a chunk's V is overwritten by
    // the next chunk's, and the transform costs little next to the GEMMs.
    TransformInput(in, chunk, ws);
    TransformOutputGradient(dout, chunk, ws);
    // S[xi] (in x out) = sum over tiles of V[xi]' Z[xi], this thread's share.
    for (int xi = 0; xi < kXi; ++xi) {
      MatrixMap s = AtPosition(ws.s, xi, in_.c, out_.c);
      MatrixMap v = AtPosition(ws.v, xi, chunk.tiles, in_.c);
      MatrixMap z = AtPosition(ws.m, xi, chunk.tiles, out_.c);
      if (first) {
        s.noalias() = v.transpose() * z;
      } else {
        s.noalias() += v.transpose() * z;
      }
    }
    if (din == nullptr) return;
    // P[xi] (tiles x in) = Z[xi] U[xi]' with Forward's U, into ws.v: V is
    // needed no more.
    for (int xi = 0; xi < kXi; ++xi) {
      AtPosition(ws.v, xi, chunk.tiles, in_.c).noalias() =
          AtPosition(ws.m, xi, chunk.tiles, out_.c) *
          AtPosition(u_, xi, in_.c, out_.c).transpose();
    }
    TransformInputGradient(chunk, ws, din);
  };
  ForEachChunk(chunks, threads, backward);
  // The threads' shares, summed in thread order.
  std::vector<float>& s = workspaces_[0].s;
  const size_t used = std::min<size_t>(threads, chunks.size());
  for (size_t t = 1; t < used; ++t) {
    const std::vector<float>& share = workspaces_[t].s;
    for (size_t i = 0; i < s.size(); ++i) s[i] += share[i];
  }
  // dW = G' S G, G' = [1 1/2 1/2 0; 0 1/2 -1/2 0; 0 1/2 1/2 1].
  const int64_t pairs = in_.c * out_.c;
  for (int64_t p = 0; p < pairs; ++p) {
    float t[3][4];  // G' S
    for (int j = 0; j < 4; ++j) {
      const float* sj = s.data() + j * pairs + p;
      const float s0 = sj[0], s1 = sj[4 * pairs];
      const float s2 = sj[8 * pairs], s3 = sj[12 * pairs];
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
