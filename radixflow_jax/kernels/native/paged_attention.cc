// Paged attention with one query token per row (decode rows), for XLA:CPU.
//
// Operands (the XLA FFI handler "radixflow_paged_attention_decode"):
//   q           f32[T, Hq, D]      query of token t (T == R: one token per row)
//   k, v pages  f32[P, page, Hkv, D]; Hq is a multiple of Hkv (query head h reads KV head h / (Hq / Hkv))
//   page_table  s32[R, M]          row r's pages, in order
//   cu_seqlens  s32[R + 1]         row r owns tokens [cu[r], cu[r+1]); tokens from cu[R] on are padding
//   kv_lens     s32[R]             row r's context after this call; its last token is at kv_lens[r] - 1
// Attributes: scale; window (0: none; else keys at positions > pos - window); soft_cap (0: none).
// Result: out f32[T, Hq, D]; 0 for padding tokens and tokens without a key.
//
// Token t of row r sits at position pos = kv_lens[r] - (cu[r+1] - cu[r]) + (t - cu[r]) and attends to
// the keys at positions [lo, pos] (lo = 0, or pos - window + 1), each read through the page table
// (page ids are clipped to [0, P), page-table columns to [0, M)). The logits are scale q.k, then
// soft_cap tanh(logits / soft_cap) when set; softmax over the keys; the same contract as
// kernels/attention.py's paged_attention, which the tests compare it with.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Decode {
  explicit Decode(int64_t n) : tasks(n) {}
  void Run(int64_t task) const;
  const float *q, *k, *v;
  const int32_t *table, *cu, *lens;
  float* out;
  int64_t tokens, rows, q_heads, kv_heads, dim, pages, page_size, max_pages;
  float scale, soft_cap;
  int64_t window;
  radixflow_native::Tasks tasks;  // one per (token, KV head)
};

void Decode::Run(int64_t task) const {
  const Decode& a = *this;
  const int64_t t = task / a.kv_heads, kvh = task % a.kv_heads, rep = a.q_heads / a.kv_heads, dim = a.dim;
  float* out = a.out + (t * a.q_heads + kvh * rep) * dim;
  std::fill(out, out + rep * dim, 0.f);
  if (t >= a.cu[a.rows]) return;  // padding token
  const int64_t r = std::upper_bound(a.cu, a.cu + a.rows + 1, static_cast<int32_t>(t)) - a.cu - 1;
  if (r < 0 || r >= a.rows) return;
  const int64_t pos = static_cast<int64_t>(a.lens[r]) - (a.cu[r + 1] - a.cu[r]) + (t - a.cu[r]);
  const int64_t hi = std::min(pos, a.max_pages * a.page_size - 1);
  const int64_t lo = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  if (hi < lo) return;
  const int64_t n = hi - lo + 1;
  const float* q = a.q + (t * a.q_heads + kvh * rep) * dim;
  const int32_t* table = a.table + r * a.max_pages;
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
      dot *= a.scale;
      s[h * n + j] = a.soft_cap > 0.f ? a.soft_cap * std::tanh(dot / a.soft_cap) : dot;
    }
  }
  for (int64_t h = 0; h < rep; ++h) {
    float* sh = s.data() + h * n;
    const float m = *std::max_element(sh, sh + n);
    float total = 0.f;
    for (int64_t j = 0; j < n; ++j) total += (sh[j] = std::exp(sh[j] - m));
    float* oh = out + h * dim;
    for (int64_t j = 0; j < n; ++j) {
      const float w = sh[j] / total;
      const float* val = vrow[j];
      for (int64_t c = 0; c < dim; ++c) oh[c] += w * val[c];
    }
  }
}

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k_pages,
                ffi::Buffer<ffi::F32> v_pages, ffi::Buffer<ffi::S32> page_table, ffi::Buffer<ffi::S32> cu_seqlens,
                ffi::Buffer<ffi::S32> kv_lens, ffi::ResultBuffer<ffi::F32> out, float scale, int64_t window,
                float soft_cap) {
  const auto qd = q.dimensions(), kd = k_pages.dimensions(), vd = v_pages.dimensions(), td = page_table.dimensions();
  if (qd.size() != 3 || kd.size() != 4 || vd.size() != 4 || td.size() != 2) {
    return ffi::Error::InvalidArgument("paged_attention_decode: bad ranks");
  }
  auto a = std::make_shared<Decode>(qd[0] * kd[2]);
  a->tokens = qd[0], a->q_heads = qd[1], a->dim = qd[2];
  a->pages = kd[0], a->page_size = kd[1], a->kv_heads = kd[2];
  a->rows = td[0], a->max_pages = td[1];
  for (size_t i = 0; i < 4; ++i) {
    if (kd[i] != vd[i]) return ffi::Error::InvalidArgument("paged_attention_decode: K and V pages differ in shape");
  }
  if (kd[3] != a->dim || a->kv_heads < 1 || a->q_heads % a->kv_heads != 0 || a->pages < 1 ||
      cu_seqlens.element_count() != a->rows + 1 || kv_lens.element_count() != a->rows || a->rows < 1) {
    return ffi::Error::InvalidArgument("paged_attention_decode: shapes do not match");
  }
  a->q = q.typed_data(), a->k = k_pages.typed_data(), a->v = v_pages.typed_data();
  a->table = page_table.typed_data(), a->cu = cu_seqlens.typed_data(), a->lens = kv_lens.typed_data();
  a->out = out->typed_data(), a->scale = scale, a->window = window, a->soft_cap = soft_cap;
  radixflow_native::RunShared(threads, a);
  return ffi::Error::Success();
}

}  // namespace

// Operands q, k_pages, v_pages, page_table, cu_seqlens, kv_lens; result out.
XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowPagedAttentionDecode, Impl,
                              (radixflow_native::BindKernel<1, ffi::F32, ffi::F32, ffi::F32, ffi::S32, ffi::S32,
                                                            ffi::S32>()
                                   .Attr<float>("scale")
                                   .Attr<int64_t>("window")
                                   .Attr<float>("soft_cap")));
