// y = x @ w^T for a few dozen rows of x, reading each weight from memory once, for XLA:CPU.
//
// Operands (the XLA FFI handler "radixflow_small_matmul"):
//   x  f32[M, K]   the rows (a decode or lean mixed round's tokens)
//   w  f32[N, K]   the weight in the HF layout [out, in], row-major
// Result: y f32[M, N].
//
// A small round's matmul is a read of the weights; the work is M multiply-adds per weight. Here it
// is computed as dot products along K: a register tile holds R weight rows by G rows of x, and per
// vector step of K it loads R weight vectors and G vectors of x (from L1) and issues R * G
// multiply-adds into R * G vector accumulators, each summed across its lanes once at the end (on
// AVX-512 four at a time). A block is kBlock output features and a task kBlocksPerTask blocks, in
// order; in a block the task walks x's rows in groups of up to kGroup, the first group reading
// the block's weights from memory while prefetching the next tile's rows (one tile ahead: without
// it, the hardware prefetcher kept the 2-core machine of 2026-12-07 at half the memory floor at 8
// rows, docs/perf-log.md), the later groups reading them back from L2.
//
// Invariants: every y[m, n] (m < M, n < N) is written exactly once, by the task owning n, as the
// sum over all of K in one order (vector steps lane by lane, the lanes' tree, then the tail) that
// does not depend on M, the group or the tile, so a row's result does not depend on the other rows;
// nothing is read past the end of x or w (a K not a multiple of the vector width finishes with a
// scalar tail). A prefetch never faults (GCC's __builtin_prefetch), so the one past
// the last tile of w is harmless.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
// 32 vector registers of 16 floats: R * G accumulators + R weight vectors + 1 x vector <= 29; a
// round of more than kOneGroup rows is split into groups of at most kGroup
constexpr int64_t kLanes = 16;
constexpr int kGroup = 8, kOneGroup = 8, kSplit = 6;
constexpr int kRowsFor[kGroup + 1] = {0, 4, 4, 4, 4, 4, 4, 3, 3};  // R for a group of G rows
#else
// 16 vector registers (AVX2: 8 floats; elsewhere the compiler splits the vector): <= 15 in use
constexpr int64_t kLanes = 8;
constexpr int kGroup = 4, kOneGroup = 4, kSplit = 4;
constexpr int kRowsFor[kGroup + 1] = {0, 4, 4, 3, 2};
#endif
constexpr int kMaxRows = 4;
constexpr int64_t kBlock = 48;  // output features per block: a multiple of every tile's R
// a task's blocks run in order, so the prefetch runs on into its next one (0.92-0.94x the time of
// one block per task at 1-16 rows, docs/perf-log.md)
constexpr int64_t kBlocksPerTask = 4;

typedef float Vec __attribute__((vector_size(kLanes * 4)));  // GCC/Clang vector extension

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// acc + a * b, as one fused multiply-add where the target has it (ISO C++ modes leave a * b + c
// unfused, which doubles the arithmetic)
inline Vec Fma(Vec a, Vec b, Vec acc) {
#if defined(__AVX512F__)
  return reinterpret_cast<Vec>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                               reinterpret_cast<__m512>(acc)));
#elif defined(__FMA__)
  return reinterpret_cast<Vec>(_mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b),
                                               reinterpret_cast<__m256>(acc)));
#else
  return acc + a * b;
#endif
}

// The sum of v's lanes, as a tree of shuffles where the target has one (lane by lane, it took a
// third of a tile's time at K = 768)
inline float Sum(Vec v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(reinterpret_cast<__m512>(v));
#elif defined(__AVX__)
  const __m256 a = reinterpret_cast<__m256>(v);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
#else
  float s = 0.f;
  for (int64_t l = 0; l < kLanes; ++l) s += v[l];
  return s;
#endif
}

#if defined(__AVX512F__)
// Lanes 0, 4, 8 and 12 hold the sums of a, b, c and d: the four reduced together (halves of 256
// bits, then of 128, then within 128), a third of the shuffles of four separate reductions. Each
// sum is the same tree whichever of the others are zero.
inline __m512 Sums4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));  // lanes [2, 3, 0, 1] of each 128 bits
  return _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));  // lanes [1, 0, 3, 2]
}
#endif

// y[g * n + r] = sum_i w[r * k + i] * x[g * k + i] for r < R, g < G; unless ``ahead`` is null, also
// prefetches the R weight rows at ``ahead`` (stride k: the next tile's), each at the offset of
// this step.
template <int R, int G>
void Tile(const float* w, const float* x, int64_t k, float* y, int64_t n, const float* ahead) {
  Vec acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = Vec{};
  const int64_t body = k - k % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    Vec wv[R];
    for (int r = 0; r < R; ++r) wv[r] = Load(w + r * k + i);
    if (ahead) {
      for (int r = 0; r < R; ++r) __builtin_prefetch(ahead + r * k + i, 0, 3);
    }
    for (int g = 0; g < G; ++g) {
      const Vec xv = Load(x + g * k + i);
      for (int r = 0; r < R; ++r) acc[r][g] = Fma(wv[r], xv, acc[r][g]);
    }
  }
#if defined(__AVX512F__)
  static_assert(R <= 4, "Sums4 reduces up to four accumulators at once");
  constexpr __mmask16 kStore = (R > 0) | (R > 1) << 4 | (R > 2) << 8 | (R > 3) << 12;  // lanes 0, 4, 8, 12
  const __m512 zero = _mm512_setzero_ps();
  for (int g = 0; g < G; ++g) {
    const auto at = [&](int r) { return r < R ? reinterpret_cast<__m512>(acc[r][g]) : zero; };
    _mm512_mask_compressstoreu_ps(y + g * n, kStore, Sums4(at(0), at(1), at(2), at(3)));
  }
  if (body < k) {
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) {
        float t = 0.f;
        for (int64_t i = body; i < k; ++i) t += w[r * k + i] * x[g * k + i];
        y[g * n + r] += t;
      }
  }
#else
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) {
      float s = Sum(acc[r][g]);
      for (int64_t i = body; i < k; ++i) s += w[r * k + i] * x[g * k + i];
      y[g * n + r] = s;
    }
  }
#endif
}

using TileFn = void (*)(const float*, const float*, int64_t, float*, int64_t, const float*);
using TileTable = std::array<std::array<TileFn, kMaxRows>, kGroup>;  // [G - 1][R - 1]

template <int G, int... R>
constexpr std::array<TileFn, kMaxRows> RowsOf(std::integer_sequence<int, R...>) {
  return {{Tile<R + 1, G>...}};
}
template <int... G>
constexpr TileTable TableOf(std::integer_sequence<int, G...>) {
  return {{RowsOf<G + 1>(std::make_integer_sequence<int, kMaxRows>{})...}};
}
constexpr TileTable kTiles = TableOf(std::make_integer_sequence<int, kGroup>{});

struct SmallMatmul {
  explicit SmallMatmul(int64_t tasks) : tasks(tasks) {}
  const float *x, *w;
  float* y;
  int64_t m, k, n;
  radixflow_native::Tasks tasks;

  // Blocks [task * kBlocksPerTask, ...) in order; in each, the first group of rows prefetches the
  // next tile (at a block's end, the first tile of the next block, which is the task's own).
  void Run(int64_t task) const {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const int64_t b1 = std::min(blocks, (task + 1) * kBlocksPerTask);
    // one group up to kOneGroup rows, else groups of nearly equal size up to kSplit (e.g. 16 rows:
    // 6 + 5 + 5 on AVX-512)
    const int64_t groups = m <= kOneGroup ? 1 : (m + kSplit - 1) / kSplit;
    for (int64_t b = task * kBlocksPerTask; b < b1; ++b) {
      const int64_t o0 = b * kBlock, o1 = std::min(n, o0 + kBlock);
      for (int64_t gi = 0, c = 0; gi < groups; ++gi) {
        const int64_t size = (m - c) / (groups - gi) + ((m - c) % (groups - gi) != 0);
        const int rows = kRowsFor[size];
        const auto& tiles = kTiles[size - 1];
        for (int64_t o = o0; o < o1; o += rows) {
          const int64_t r = std::min<int64_t>(rows, o1 - o);
          tiles[r - 1](w + o * k, x + c * k, k, y + c * n + o, n, gi == 0 ? w + (o + r) * k : nullptr);
        }
        c += size;
      }
    }
  }
};

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                ffi::ResultBuffer<ffi::F32> y) {
  const auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 2 || wd.size() != 2 || yd.size() != 2 || xd[1] != wd[1] || yd[0] != xd[0] || yd[1] != wd[0]) {
    return ffi::Error::InvalidArgument("small_matmul: shapes do not match (x [M, K], w [N, K], y [M, N])");
  }
  const int64_t blocks = (wd[0] + kBlock - 1) / kBlock;
  auto job = std::make_shared<SmallMatmul>((blocks + kBlocksPerTask - 1) / kBlocksPerTask);
  job->m = xd[0], job->k = xd[1], job->n = wd[0];
  job->x = x.typed_data(), job->w = w.typed_data(), job->y = y->typed_data();
  if (job->m > 0) radixflow_native::RunShared(threads, job);
  return ffi::Error::Success();
}

}  // namespace

// Operands x, w; result y.
XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowSmallMatmul, Impl,
                              (radixflow_native::BindKernel<1, ffi::F32, ffi::F32>()));
