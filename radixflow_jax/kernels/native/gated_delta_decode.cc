// One-step Gated DeltaNet update of a contiguous window of a state pool, in place, for XLA:CPU.
//
// Operands (the XLA FFI handler "radixflow_gated_delta_decode_window"):
//   base  s32[1]            first slot of the window; the caller guarantees 0 <= base <= S - d
//   real  s32[d]            row r writes its new state only when real[r] != 0
//   q, k  f32[d, Hk, K]     query and key (already L2-normalised where the model asks for it)
//   v     f32[d, H, V]      value; H is a multiple of Hk (value head h reads key head h / (H / Hk))
//   g     f32[d, H]         log decay; beta f32[d, H]: the update's step size
//   pool  f32[S, H, K, V]   aliased to the second result: only the window's real rows change
// Attribute: scale (the query scale). Results: out f32[d, H, V], the pool.
//
// Per row r and value head h, with S = pool[base + r, h] and a = exp(g):
//   u = beta (v - a S^T k),  out = a S^T (scale q) + u (k . scale q),  S <- a S + k u^T.
// This is the algebra of kernels/fast.py's gated_delta_decode (tested against the reference
// kernels/gated_delta.py); the state is read from memory once (both products in one pass) and
// written once (the second pass reads the 16 KB block back from cache).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxValueDim = 512;

struct Window {
  float* pool;
  const float *q, *k, *v, *g, *beta;
  const int32_t* real;
  float* out;
  int64_t base, rows, heads, key_heads, dk, dv;
  float scale;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

void UpdateOne(const Window& w, int64_t task) {
  const int64_t r = task / w.heads, h = task % w.heads, hk = h / (w.heads / w.key_heads);
  const int64_t dk = w.dk, dv = w.dv;
  float* state = w.pool + ((w.base + r) * w.heads + h) * dk * dv;
  const float* k = w.k + (r * w.key_heads + hk) * dk;
  const float* q = w.q + (r * w.key_heads + hk) * dk;
  const float* v = w.v + (r * w.heads + h) * dv;
  float* out = w.out + (r * w.heads + h) * dv;
  const float a = std::exp(w.g[r * w.heads + h]), b = w.beta[r * w.heads + h];
  float sk[kMaxValueDim], sq[kMaxValueDim], u[kMaxValueDim];
  std::fill(sk, sk + dv, 0.f);
  std::fill(sq, sq + dv, 0.f);
  float kq = 0.f;
#pragma omp simd reduction(+ : kq)
  for (int64_t i = 0; i < dk; ++i) kq += k[i] * q[i] * w.scale;
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i], qi = q[i] * w.scale;
    const float* row = state + i * dv;
    for (int64_t c = 0; c < dv; ++c) {
      sk[c] += row[c] * ki;
      sq[c] += row[c] * qi;
    }
  }
  for (int64_t c = 0; c < dv; ++c) {
    u[c] = b * (v[c] - a * sk[c]);
    out[c] = a * sq[c] + u[c] * kq;
  }
  if (!w.real[r]) return;  // a padding row leaves its window slot as it was
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i];
    float* row = state + i * dv;
    for (int64_t c = 0; c < dv; ++c) row[c] = a * row[c] + ki * u[c];
  }
}

// Claims (row, head) tasks until none is left. Every thread that runs this shares the work.
void Drain(Window& w) {
  const int64_t n = w.rows * w.heads;
  for (int64_t t; (t = w.next.fetch_add(1)) < n;) {
    UpdateOne(w, t);
    w.done.fetch_add(1, std::memory_order_release);
  }
}

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::S32> base, ffi::Buffer<ffi::S32> real,
                ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> pool_in,
                float scale, ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> pool) {
  const auto pd = pool->dimensions(), qd = q.dimensions(), vd = v.dimensions();
  const auto kd = k.dimensions();
  if (pd.size() != 4 || qd.size() != 3 || vd.size() != 3 || kd.size() != 3 || kd[0] != qd[0] || kd[1] != qd[1] ||
      kd[2] != qd[2]) {
    return ffi::Error::InvalidArgument("gated_delta_decode_window: bad ranks");
  }
  auto w = std::make_shared<Window>();
  w->rows = vd[0], w->heads = vd[1], w->dv = vd[2], w->key_heads = qd[1], w->dk = qd[2];
  w->base = base.typed_data()[0];
  if (qd[0] != w->rows || pd[1] != w->heads || pd[2] != w->dk || pd[3] != w->dv || w->key_heads < 1 ||
      w->heads % w->key_heads != 0 || w->dv > kMaxValueDim || g.element_count() != w->rows * w->heads ||
      beta.element_count() != w->rows * w->heads || real.element_count() != w->rows) {
    return ffi::Error::InvalidArgument("gated_delta_decode_window: shapes do not match");
  }
  if (w->base < 0 || w->base + w->rows > pd[0]) {
    return ffi::Error::InvalidArgument("gated_delta_decode_window: the window leaves the pool");
  }
  if (pool_in.typed_data() != pool->typed_data()) {
    return ffi::Error::InvalidArgument("gated_delta_decode_window: the pool operand is not aliased to its result");
  }
  w->pool = pool->typed_data(), w->out = out->typed_data(), w->real = real.typed_data();
  w->q = q.typed_data(), w->k = k.typed_data(), w->v = v.typed_data();
  w->g = g.typed_data(), w->beta = beta.typed_data(), w->scale = scale;
  // Helpers on XLA's intra-op pool share the tasks; this thread drains too, so the call finishes
  // even if no helper ever starts, and waits only for tasks a helper has already claimed.
  const int64_t helpers = std::min<int64_t>(threads.num_threads(), 16) - 1;
  for (int64_t i = 0; i < helpers; ++i) threads.Schedule([w] { Drain(*w); });
  Drain(*w);
  while (w->done.load(std::memory_order_acquire) < w->rows * w->heads) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowGatedDeltaDecodeWindow, Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
