// y = x @ w^T for a few dozen rows of x, reading each weight once per tile of columns, for XLA:CPU.
//
// Operands (the XLA FFI handler "radixflow_small_matmul"):
//   x  f32[M, K]   the rows (a decode or lean mixed round's tokens)
//   w  f32[N, K]   the weight in the HF layout [out, in], row-major
// Result: y f32[M, N].
//
// XLA:CPU's matmul reads the weights at the memory floor for one row but takes about three times as
// long for four, and runs at a third of the cores' rate up to a few dozen rows (docs/perf-log.md,
// 2026-12-05, tools/perf/small_dot.py). Here y^T = w x^T is computed the way a GEMM micro-kernel
// does, with x^T packed [K, Mp] (Mp: M rounded up to the wide vector width, zeros past M): a
// register tile holds R weight rows by V vectors of x^T columns; per step of K it loads V vectors of
// x^T, broadcasts R weights and issues R * V multiply-adds into R * V accumulators, so no horizontal
// sum is needed and each weight is read once per V vectors of x's rows. A task owns kBlock output
// features; it walks x's columns in blocks of up to 3 narrow or 4 wide vectors, its weights staying
// in L2 after the first block.
//
// Invariants: every y[m, n] (m < M, n < N) is written exactly once, by the task owning n; the
// packed columns past M are zeros and never stored.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Tiles of R weight rows by V vectors of L floats. Narrow (L = 8, the 16 vector registers of AVX2):
// R = 12, 6, 4 for V = 1-3, 12 accumulators each. Wide (L = 16, only where AVX-512 gives 32
// registers): R = 12, 12, 8, 6 for V = 1-4, up to 24 accumulators; rounds of more than
// kNarrowCols rows take them (at 2-24 rows the wide tiles read the weights slower, at 32-96 they
// compute faster: docs/perf-log.md, 2026-12-06).
constexpr int64_t kNarrow = 8;
constexpr int kNarrowRows[3] = {12, 6, 4};
#if defined(__AVX512F__)
constexpr int64_t kWide = 16;
constexpr int kWideRows[4] = {12, 12, 8, 6};
#else
constexpr int64_t kWide = kNarrow;  // no wide tiles: every round takes the narrow ones
constexpr int kWideRows[3] = {12, 6, 4};
#endif
constexpr int kWideVecs = sizeof(kWideRows) / sizeof(int);
constexpr int64_t kNarrowCols = 24;
constexpr int64_t kBlock = 48;  // output features per task: a multiple of every tile's R

template <int L>
struct Lanes {
  typedef float Vec __attribute__((vector_size(L * 4)));  // GCC/Clang vector extension
};

template <class Vec>
inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Keeps v in a vector register: without it the compiler may fold each use of a loaded vector into a
// multiply-add as a memory operand, loading it once per use instead of once per step.
template <class Vec>
inline void Pin(Vec& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));  // any of the 32 vector registers
#elif defined(__x86_64__)
  asm("" : "+x"(v));
#elif defined(__aarch64__)
  asm("" : "+w"(v));
#endif
}

// For weight rows w[0..R) (stride k) and packed columns xt[0 .. V * L) (stride mp): acc = w xt over
// all of K; then y[c * n + r] = acc[r][c] for the columns c < cols (the rest are x's zero padding).
template <int L, int R, int V>
void Tile(const float* w, const float* xt, int64_t k, int64_t mp, float* y, int64_t n, int64_t cols) {
  using Vec = typename Lanes<L>::Vec;
  Vec acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = Vec{};
  for (int64_t i = 0; i < k; ++i) {
    Vec xv[V];
    for (int v = 0; v < V; ++v) {
      xv[v] = Load<Vec>(xt + i * mp + v * L);
      Pin(xv[v]);
    }
    for (int r = 0; r < R; ++r) {
      const float s = w[r * k + i];
      for (int v = 0; v < V; ++v) acc[r][v] += xv[v] * s;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      for (int64_t l = 0; l < L && v * L + l < cols; ++l) y[(v * L + l) * n + r] = acc[r][v][l];
}

using TileFn = void (*)(const float*, const float*, int64_t, int64_t, float*, int64_t, int64_t);
using TileRow = std::array<TileFn, 12>;  // [R - 1]: a block's edge uses a smaller R

template <int L, int V, int... R>
constexpr TileRow TilesOf(std::integer_sequence<int, R...>) {
  return {{Tile<L, R + 1, V>...}};
}
// kNarrowTiles[V - 1][R - 1], kWideTiles[V - 1][R - 1]: R weight rows by V vectors of columns
constexpr TileRow kNarrowTiles[3] = {
    TilesOf<kNarrow, 1>(std::make_integer_sequence<int, kNarrowRows[0]>{}),
    TilesOf<kNarrow, 2>(std::make_integer_sequence<int, kNarrowRows[1]>{}),
    TilesOf<kNarrow, 3>(std::make_integer_sequence<int, kNarrowRows[2]>{}),
};
constexpr TileRow kWideTiles[kWideVecs] = {
    TilesOf<kWide, 1>(std::make_integer_sequence<int, kWideRows[0]>{}),
    TilesOf<kWide, 2>(std::make_integer_sequence<int, kWideRows[1]>{}),
    TilesOf<kWide, 3>(std::make_integer_sequence<int, kWideRows[2]>{}),
#if defined(__AVX512F__)
    TilesOf<kWide, 4>(std::make_integer_sequence<int, kWideRows[3]>{}),
#endif
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
      // rounds of up to kNarrowCols rows, and a last block of up to kNarrow columns, take narrow
      // tiles (1-8 columns take 1 vector, 9-16 take 2); otherwise wide ones, leaving a remainder of
      // up to kNarrow columns to a narrow tile rather than padding it to a wide vector
      const int64_t left = m - c;
      const bool narrow = m <= kNarrowCols || left <= kNarrow;
      const int64_t lanes = narrow ? kNarrow : kWide;
      int64_t vecs = std::min<int64_t>(narrow ? 3 : kWideVecs, (left + lanes - 1) / lanes);
      if (!narrow && vecs > 1 && vecs * lanes >= left && left % kWide != 0 && left % kWide <= kNarrow) --vecs;
      const int64_t rows = narrow ? kNarrowRows[vecs - 1] : kWideRows[vecs - 1];
      const TileRow& tiles = narrow ? kNarrowTiles[vecs - 1] : kWideTiles[vecs - 1];
      for (int64_t o = o0; o < o1; o += rows) {
        tiles[std::min(rows, o1 - o) - 1](w + o * k, xt.data() + c, k, mp, y + c * n + o, n,
                                          std::min(vecs * lanes, left));
      }
      c += vecs * lanes;
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
  job->mp = (job->m + kWide - 1) / kWide * kWide;  // tiles read whole vectors: columns up to mp
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
