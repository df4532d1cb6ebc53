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
#include <cstdint>
#include <memory>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using radixflow_native::DeltaStep;
using radixflow_native::kMaxValueDim;

struct Window {
  explicit Window(int64_t n) : tasks(n) {}
  float* pool;
  const float *q, *k, *v, *g, *beta;
  const int32_t* real;
  float* out;
  int64_t base, rows, heads, key_heads, dk, dv;
  float scale;
  radixflow_native::Tasks tasks;  // one per (row, value head)

  void Run(int64_t task) const {
    const int64_t r = task / heads, h = task % heads, hk = h / (heads / key_heads);
    DeltaStep(pool + ((base + r) * heads + h) * dk * dv, q + (r * key_heads + hk) * dk, k + (r * key_heads + hk) * dk,
              v + (r * heads + h) * dv, g[r * heads + h], beta[r * heads + h], scale, dk, dv,
              out + (r * heads + h) * dv, real[r] != 0);  // a padding row leaves its window slot as it was
  }
};

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::S32> base, ffi::Buffer<ffi::S32> real,
                ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> pool_in,
                ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> pool, float scale) {
  const auto pd = pool->dimensions(), qd = q.dimensions(), vd = v.dimensions();
  const auto kd = k.dimensions();
  if (pd.size() != 4 || qd.size() != 3 || vd.size() != 3 || kd.size() != 3 || kd[0] != qd[0] || kd[1] != qd[1] ||
      kd[2] != qd[2]) {
    return ffi::Error::InvalidArgument("gated_delta_decode_window: bad ranks");
  }
  auto w = std::make_shared<Window>(vd[0] * vd[1]);
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
  radixflow_native::RunShared(threads, w);
  return ffi::Error::Success();
}

}  // namespace

// Operands base, real, q, k, v, g, beta, pool; results out, pool; attribute scale.
XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowGatedDeltaDecodeWindow, Impl,
                              (radixflow_native::BindKernel<2, ffi::S32, ffi::S32, ffi::F32, ffi::F32, ffi::F32,
                                                            ffi::F32, ffi::F32, ffi::F32>()
                                   .Attr<float>("scale")));
