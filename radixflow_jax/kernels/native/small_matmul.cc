// y = x @ w^T for a few rows of x, reading each weight once per 16 rows, for XLA:CPU.
//
// Operands (the XLA FFI handler "radixflow_small_matmul"):
//   x  f32[M, K]   the rows (a decode or lean mixed round's tokens)
//   w  f32[N, K]   the weight in the HF layout [out, in], row-major
// Result: y f32[M, N].
//
// XLA:CPU's matmul reads the weights at the memory floor for one row but takes about three times as
// long for four, and runs at a third of the cores' rate up to a few dozen rows (docs/perf-log.md,
// 2026-12-05, tools/perf/small_dot.py). Here y^T = w x^T is computed the way a GEMM micro-kernel
// does, with x^T packed [K, Mp] (Mp: M rounded up to the vector width, zeros past M): a register
// tile holds R weight rows by V vectors of x^T columns; per step of K it loads V vectors of x^T,
// broadcasts R weights and issues R * V multiply-adds into R * V accumulators, so no horizontal sum
// is needed and each weight is read once per V * 8 rows of x. A task owns kBlock output features;
// it walks x's columns in blocks of up to 24, its weights staying in L2 after the first block.
//
// Invariants: every y[m, n] (m < M, n < N) is written exactly once, by the task owning n; the
// packed columns past M are zeros and never stored.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float Vec __attribute__((vector_size(32)));  // 8 floats (GCC/Clang vector extension)
constexpr int64_t kLanes = 8;
// weight rows of a tile over V = 1, 2, 3 vectors of x^T columns: 12 accumulators each
constexpr int kTileRows[3] = {12, 6, 4};
constexpr int64_t kBlock = 48;  // output features per task: a multiple of every kTileRows

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Keeps v in a vector register: without it the compiler may fold each use of a loaded vector into a
// multiply-add as a memory operand, loading it once per use instead of once per step.
inline void Pin(Vec& v) {
#if defined(__x86_64__)
  asm("" : "+x"(v));
#elif defined(__aarch64__)
  asm("" : "+w"(v));
#endif
}

// For weight rows w[0..R) (stride k) and packed columns xt[0 .. V * 8) (stride mp): acc = w xt over
// all of K; then y[c * n + r] = acc[r][c] for the columns c < cols (the rest are x's zero padding).
template <int R, int V>
void Tile(const float* w, const float* xt, int64_t k, int64_t mp, float* y, int64_t n, int64_t cols) {
  Vec acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = Vec{};
  for (int64_t i = 0; i < k; ++i) {
    Vec xv[V];
    for (int v = 0; v < V; ++v) {
      xv[v] = Load(xt + i * mp + v * kLanes);
      Pin(xv[v]);
    }
    for (int r = 0; r < R; ++r) {
      const float s = w[r * k + i];
      for (int v = 0; v < V; ++v) acc[r][v] += xv[v] * s;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      for (int64_t l = 0; l < kLanes && v * kLanes + l < cols; ++l) y[(v * kLanes + l) * n + r] = acc[r][v][l];
}

using TileFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t, int64_t);
// kTiles[V - 1][R - 1]: R weight rows by V vectors of columns (a block's edge uses a smaller R)
constexpr TileFn kTiles[3][12] = {
    {Tile<1, 1>, Tile<2, 1>, Tile<3, 1>, Tile<4, 1>, Tile<5, 1>, Tile<6, 1>, Tile<7, 1>, Tile<8, 1>, Tile<9, 1>,
     Tile<10, 1>, Tile<11, 1>, Tile<12, 1>},
    {Tile<1, 2>, Tile<2, 2>, Tile<3, 2>, Tile<4, 2>, Tile<5, 2>, Tile<6, 2>},
    {Tile<1, 3>, Tile<2, 3>, Tile<3, 3>, Tile<4, 3>},
};

struct SmallMatmul {
  explicit SmallMatmul(int64_t n) : tasks(n) {}
  const float* w;
  std::vector<float> xt;  // x^T packed [k, mp], zeros in the columns past m
  float* y;
  int64_t m, mp, k, n;
  radixflow_native::Tasks tasks;

  void Run(int64_t task) const {
    const int64_t o0 = task * kBlock, o1 = std::min(n, o0 + kBlock);
    for (int64_t c = 0; c < m;) {
      // as many vectors (up to 3) as the columns left fill: 1-8 columns take 1, 9-16 take 2, more 3
      const int64_t vecs = std::min<int64_t>(3, (m - c + kLanes - 1) / kLanes), rows = kTileRows[vecs - 1];
      for (int64_t o = o0; o < o1; o += rows) {
        kTiles[vecs - 1][std::min(rows, o1 - o) - 1](w + o * k, xt.data() + c, k, mp, y + c * n + o, n,
                                                     std::min(vecs * kLanes, m - c));
      }
      c += vecs * kLanes;
    }
  }
};

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || yd.size() != 2 || xd[1] != wd[1] || yd[0] != xd[0] || yd[1] != wd[0]) {
    return ffi::Error::InvalidArgument("small_matmul: shapes do not match (x [M, K], w [N, K], y [M, N])");
  }
  auto job = std::make_shared<SmallMatmul>((wd[0] + kBlock - 1) / kBlock);
  job->m = xd[0], job->k = xd[1], job->n = wd[0];
  job->mp = (job->m + kLanes - 1) / kLanes * kLanes;  // tiles read whole vectors: columns up to mp
  job->xt.assign(job->k * job->mp, 0.f);
  const float* xs = x.typed_data();
  for (int64_t r = 0; r < job->m; ++r)
    for (int64_t i = 0; i < job->k; ++i) job->xt[i * job->mp + r] = xs[r * job->k + i];
  job->w = w.typed_data(), job->y = y->typed_data();
  radixflow_native::RunShared(threads, job);
  return ffi::Error::Success();
}

}  // namespace

// Operands x, w; result y.
XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowSmallMatmul, Impl,
                              (radixflow_native::BindKernel<1, ffi::F32, ffi::F32>()));
