// Paged attention over query blocks: rows with any number of query tokens (prefill, mixed rounds and
// decode), for XLA:CPU.
//
// Operands and result as paged_attention.cc's (the XLA FFI handler "radixflow_paged_attention_blocks"):
//   q f32[T, Hq, D]; k, v pages f32[P, page, Hkv, D]; page_table s32[R, M]; cu_seqlens s32[R + 1]
//   (cu[0] == 0, non-decreasing, cu[R] <= T; tokens from cu[R] on are padding); kv_lens s32[R].
// Attributes: scale; window (0: none); soft_cap (0: none); block (query tokens per block, >= 1).
// Result: out f32[T, Hq, D]; 0 for padding tokens and tokens without a key.
//
// Token t of row r sits at pos = kv_lens[r] - (cu[r+1] - cu[r]) + (t - cu[r]) and attends to the keys
// at positions [lo, min(pos, M * page - 1)] (lo = 0, or pos - window + 1), read through the page table
// (page ids clipped to [0, P)); logits scale q.k, then soft_cap tanh(logits / soft_cap); softmax; the
// contract of kernels/attention.py's paged_attention, which the tests compare it with.
//
// Work: row r's tokens are cut into blocks of up to `block` consecutive tokens; a task is one (block,
// KV head), and reads only the keys its block needs, [lo of its first token, pos of its last], once
// for all block x rep queries: tiles of kTile keys are gathered (K transposed, so q.K is an axpy over
// the tile; V as rows) and folded into each query's online softmax, masked per query. A round's cost
// follows the keys each row reads, not the longest row's context. Tasks run longest first. A block of
// one token takes the direct path of paged_attention.cc instead (Blocks::RunOne).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kTile = 32;  // keys per tile

// exp(x) to float precision (Cephes' polynomial, 2^n through the exponent bits), written so a loop
// over it vectorises (std::exp does not). Inputs are clamped to [-87, 88]: exp(-87) ~ 1.6e-38.
inline float Exp(float x) {
  x = std::min(std::max(x, -87.f), 88.f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return y * two_n;
}

struct Block {
  int64_t row, first, count, cost;  // row, first token, tokens, keys read x tokens (for the order)
};

struct Blocks {
  explicit Blocks(std::vector<Block> blocks, int64_t kv_heads)
      : blocks(std::move(blocks)), tasks(static_cast<int64_t>(this->blocks.size()) * kv_heads) {}
  void Run(int64_t task) const;
  void RunOne(const Block& b, int64_t kvh) const;
  const std::vector<Block> blocks;  // longest first
  const float *q, *k, *v;
  const int32_t *table, *cu, *lens;
  float* out;
  int64_t rows, q_heads, kv_heads, dim, pages, page_size, max_pages, window;
  float scale, soft_cap;
  radixflow_native::Tasks tasks;  // one per (block, KV head)
};

// Position of token t of row r (the contract's formula).
inline int64_t Position(const int32_t* cu, const int32_t* lens, int64_t r, int64_t t) {
  return static_cast<int64_t>(lens[r]) - (cu[r + 1] - cu[r]) + (t - cu[r]);
}

// A block of one token (a decoding row beside prompts, mixed_layout "packed"): its rep queries take
// dot products with each key row in place, as paged_attention.cc does; a tile's transposed gather
// would cost more than the rep queries' work over it.
void Blocks::RunOne(const Block& b, int64_t kvh) const {
  const Blocks& a = *this;
  const int64_t rep = a.q_heads / a.kv_heads, dim = a.dim, t = b.first;
  float* out = a.out + (t * a.q_heads + kvh * rep) * dim;
  std::fill(out, out + rep * dim, 0.f);
  const int64_t pos = Position(a.cu, a.lens, b.row, t);
  const int64_t hi = std::min(pos, a.max_pages * a.page_size - 1);
  const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  if (hi < lo) return;  // no key: zeros, as the tiled path gives
  const int64_t n = hi - lo + 1;
  const float* q = a.q + (t * a.q_heads + kvh * rep) * dim;
  const int32_t* table = a.table + b.row * a.max_pages;
  std::vector<float> s(rep * n);
  std::vector<const float*> vrow(n);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = lo + j;
    const int64_t page = std::clamp<int64_t>(table[p / a.page_size], 0, a.pages - 1);
    const int64_t at = ((page * a.page_size + p % a.page_size) * a.kv_heads + kvh) * dim;
    const float* key = a.k + at;
    vrow[j] = a.v + at;
    for (int64_t h = 0; h < rep; ++h) {
      const float* qh = q + h * dim;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < dim; ++c) dot += qh[c] * key[c];
      s[h * n + j] = dot * a.scale;
    }
  }
  for (int64_t h = 0; h < rep; ++h) {
    float* sh = s.data() + h * n;
    if (a.soft_cap > 0.f) {  // cap tanh(x / cap) = cap (1 - 2 / (exp(2x / cap) + 1))
      const float twice = 2.f / a.soft_cap;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) sh[j] = a.soft_cap * (1.f - 2.f / (Exp(sh[j] * twice) + 1.f));
    }
    const float m = *std::max_element(sh, sh + n);
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; ++j) {
      sh[j] = Exp(sh[j] - m);
      total += sh[j];
    }
    const float inv = 1.f / total;
    float* oh = out + h * dim;
    for (int64_t j = 0; j < n; ++j) {
      const float w = sh[j] * inv;
      const float* val = vrow[j];
#pragma omp simd
      for (int64_t c = 0; c < dim; ++c) oh[c] += w * val[c];
    }
  }
}

void Blocks::Run(int64_t task) const {
  const Blocks& a = *this;
  const Block& b = a.blocks[task / a.kv_heads];
  const int64_t kvh = task % a.kv_heads, rep = a.q_heads / a.kv_heads, dim = a.dim;
  if (b.count == 1) {
    RunOne(b, kvh);
    return;
  }
  const int64_t nq = b.count * rep, last_key = a.max_pages * a.page_size - 1;
  // per query (token i, head h at i * rep + h): its keys [qlo, qhi], scaled query, softmax state
  std::vector<int64_t> qlo(nq), qhi(nq);
  std::vector<float> qs(nq * dim), m(nq, -1e30f), l(nq, 0.f), acc(nq * dim, 0.f);
  int64_t lo = INT64_MAX, hi = -1;
  for (int64_t i = 0; i < b.count; ++i) {
    const int64_t t = b.first + i, pos = Position(a.cu, a.lens, b.row, t);
    const int64_t q_hi = std::min(pos, last_key), q_lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
    for (int64_t h = 0; h < rep; ++h) {
      const int64_t qi = i * rep + h;
      qlo[qi] = q_lo, qhi[qi] = q_hi;
      const float* src = a.q + (t * a.q_heads + kvh * rep + h) * dim;
      for (int64_t c = 0; c < dim; ++c) qs[qi * dim + c] = src[c] * a.scale;
    }
    if (q_lo <= q_hi) lo = std::min(lo, q_lo), hi = std::max(hi, q_hi);
  }
  std::vector<float> kt(dim * kTile, 0.f), vt(kTile * dim, 0.f);  // K tile transposed [dim, kTile]; V [kTile, dim]
  float s[kTile];
  const int32_t* table = a.table + b.row * a.max_pages;
  for (int64_t j0 = lo; j0 <= hi; j0 += kTile) {
    const int64_t n = std::min(kTile, hi - j0 + 1);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = j0 + j;
      const int64_t page = std::clamp<int64_t>(table[p / a.page_size], 0, a.pages - 1);
      const int64_t at = ((page * a.page_size + p % a.page_size) * a.kv_heads + kvh) * dim;
      const float *key = a.k + at, *val = a.v + at;
      for (int64_t c = 0; c < dim; ++c) kt[c * kTile + j] = key[c];
      std::memcpy(&vt[j * dim], val, dim * sizeof(float));
    }
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t from = std::max(j0, qlo[qi]) - j0, to = std::min(j0 + n - 1, qhi[qi]) - j0 + 1;  // [from, to)
      if (from >= to) continue;
      const float* qv = &qs[qi * dim];
#pragma omp simd
      for (int64_t j = 0; j < kTile; ++j) s[j] = 0.f;
      for (int64_t c = 0; c < dim; ++c) {
        const float qc = qv[c];
        const float* row = &kt[c * kTile];
#pragma omp simd
        for (int64_t j = 0; j < kTile; ++j) s[j] += qc * row[j];
      }
      if (a.soft_cap > 0.f) {  // cap tanh(x / cap) = cap (1 - 2 / (exp(2x / cap) + 1))
        const float twice = 2.f / a.soft_cap;
#pragma omp simd
        for (int64_t j = 0; j < kTile; ++j) s[j] = a.soft_cap * (1.f - 2.f / (Exp(s[j] * twice) + 1.f));
      }
      float top = m[qi];
      for (int64_t j = from; j < to; ++j) top = std::max(top, s[j]);
      const float corr = Exp(m[qi] - top);
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < kTile; ++j) {
        const float p = (j >= from && j < to) ? Exp(s[j] - top) : 0.f;
        s[j] = p;
        total += p;
      }
      m[qi] = top, l[qi] = corr * l[qi] + total;
      float* o = &acc[qi * dim];
#pragma omp simd
      for (int64_t c = 0; c < dim; ++c) o[c] *= corr;
      for (int64_t j = from; j < to; ++j) {
        const float p = s[j];
        const float* val = &vt[j * dim];
#pragma omp simd
        for (int64_t c = 0; c < dim; ++c) o[c] += p * val[c];
      }
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t i = qi / rep, h = qi % rep;
    float* dst = a.out + ((b.first + i) * a.q_heads + kvh * rep + h) * dim;
    const float inv = l[qi] > 0.f ? 1.f / l[qi] : 0.f;
    for (int64_t c = 0; c < dim; ++c) dst[c] = acc[qi * dim + c] * inv;
  }
}

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k_pages,
                ffi::Buffer<ffi::F32> v_pages, ffi::Buffer<ffi::S32> page_table, ffi::Buffer<ffi::S32> cu_seqlens,
                ffi::Buffer<ffi::S32> kv_lens, ffi::ResultBuffer<ffi::F32> out, float scale, int64_t window,
                float soft_cap, int64_t block) {
  const auto qd = q.dimensions(), kd = k_pages.dimensions(), vd = v_pages.dimensions(), td = page_table.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || vd.size() != 4 || td.size() != 2) {
    return ffi::Error::InvalidArgument("paged_attention_blocks: bad ranks");
  }
  for (size_t i = 0; i < 4; ++i) {
    if (kd[i] != vd[i]) return ffi::Error::InvalidArgument("paged_attention_blocks: K and V pages differ in shape");
  }
  const int64_t tokens = qd[0], q_heads = qd[1], dim = qd[2], kv_heads = kd[2], rows = td[0];
  if (kd[3] != dim || kv_heads < 1 || q_heads % kv_heads != 0 || kd[0] < 1 || rows < 1 ||
      cu_seqlens.element_count() != rows + 1 || kv_lens.element_count() != rows || block < 1) {
    return ffi::Error::InvalidArgument("paged_attention_blocks: shapes do not match");
  }
  const int32_t *cu = cu_seqlens.typed_data(), *lens = kv_lens.typed_data();
  if (cu[0] != 0 || cu[rows] > tokens) return ffi::Error::InvalidArgument("paged_attention_blocks: bad cu_seqlens");
  std::vector<Block> blocks;
  for (int64_t r = 0; r < rows; ++r) {
    if (cu[r + 1] < cu[r]) return ffi::Error::InvalidArgument("paged_attention_blocks: cu_seqlens decreases");
    for (int64_t t = cu[r]; t < cu[r + 1]; t += block) {
      const int64_t count = std::min<int64_t>(block, cu[r + 1] - t);
      const int64_t keys = std::max<int64_t>(0, Position(cu, lens, r, t + count - 1) + 1);
      blocks.push_back({r, t, count, count * (window > 0 ? std::min(keys, window + count) : keys)});
    }
  }
  std::stable_sort(blocks.begin(), blocks.end(), [](const Block& x, const Block& y) { return x.cost > y.cost; });
  auto a = std::make_shared<Blocks>(std::move(blocks), kv_heads);
  a->rows = rows, a->q_heads = q_heads, a->kv_heads = kv_heads, a->dim = dim;
  a->pages = kd[0], a->page_size = kd[1], a->max_pages = td[1], a->window = window;
  a->q = q.typed_data(), a->k = k_pages.typed_data(), a->v = v_pages.typed_data();
  a->table = page_table.typed_data(), a->cu = cu, a->lens = lens;
  a->out = out->typed_data(), a->scale = scale, a->soft_cap = soft_cap;
  float* o = out->typed_data();
  std::fill(o + cu[rows] * q_heads * dim, o + tokens * q_heads * dim, 0.f);  // padding tokens
  radixflow_native::RunShared(threads, a);
  return ffi::Error::Success();
}

}  // namespace

// Operands q, k_pages, v_pages, page_table, cu_seqlens, kv_lens; result out.
XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowPagedAttentionBlocks, Impl,
                              (radixflow_native::BindKernel<1, ffi::F32, ffi::F32, ffi::F32, ffi::S32, ffi::S32,
                                                            ffi::S32>()
                                   .Attr<float>("scale")
                                   .Attr<int64_t>("window")
                                   .Attr<float>("soft_cap")
                                   .Attr<int64_t>("block")));
