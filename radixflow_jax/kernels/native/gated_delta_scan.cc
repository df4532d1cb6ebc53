// The Gated DeltaNet recurrence over a packed batch of prefill rows, token by token, for XLA:CPU.
//
// Operands (the XLA FFI handler "radixflow_gated_delta_scan"):
//   q, k  f32[T, Hk, K]; v f32[T, H, V]; g, beta f32[T, H]   (value head h reads key head h / (H / Hk))
//   cu    s32[R + 1]        row r owns tokens [cu[r], cu[r+1]); tokens from cu[R] on are padding
//   init  f32[R, H, K, V]   each row's state before its span
//   pair  s32[R]            pair[r] >= 0: row r starts from chunk_states[pair[r]] instead (policy pair;
//                           that chunk must be a used chunk of a row with pair < 0, which is computed
//                           first; anything else is refused with InvalidArgument)
// Attributes: scale (the query scale), chunk (the checkpoint grid). Results: out f32[T, H, V] (0 for
// padding tokens), final f32[R, H, K, V], chunk_states f32[N, H, K, V] with N = ceil(T / chunk) + R.
//
// Chunks follow kernels/layout.py: row r owns chunks [first[r], first[r+1]), first[r] = sum over rows
// before r of ceil(len / chunk); the state after chunk first[r] + j is the row's state after
// min((j + 1) chunk, len) tokens; unused chunks are 0. Per token, with a = exp(g):
//   u = beta (v - a S^T k),  S <- a S + k u^T,  out = S^T (scale q) = a S_old^T (scale q) + u (k . scale q),
// the recurrence the chunked kernels compute in blocks (kernels/gated_delta.py's gated_delta_naive is
// the same per-token form). Each (row, head) keeps its 64x64 state in a local buffer for its span.
#include <cstdint>
#include <string>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using radixflow_native::kMaxValueDim;

// The scan's per-token operands and its one-token update (DeltaStep), for ScanJob.
struct DeltaTokens {
  const float *q, *k, *v, *g, *beta;
  int64_t heads, key_heads, dk, dv;
  float scale;

  int64_t block() const { return dk * dv; }
  void Step(int64_t t, int64_t h, float* state, float* out) const {
    const int64_t hk = h / (heads / key_heads);
    radixflow_native::DeltaStep(state, q + (t * key_heads + hk) * dk, k + (t * key_heads + hk) * dk,
                                v + (t * heads + h) * dv, g[t * heads + h], beta[t * heads + h], scale, dk, dv,
                                out + (t * heads + h) * dv, true);
  }
};

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::S32> cu,
                ffi::Buffer<ffi::F32> init, ffi::Buffer<ffi::S32> pair, ffi::ResultBuffer<ffi::F32> out,
                ffi::ResultBuffer<ffi::F32> final_state, ffi::ResultBuffer<ffi::F32> chunk_states, float scale,
                int64_t chunk) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), id = init.dimensions();
  const auto cd = chunk_states->dimensions();
  if (qd.size() != 3 || kd.size() != 3 || vd.size() != 3 || id.size() != 4 || cd.size() != 4) {
    return ffi::Error::InvalidArgument("gated_delta_scan: bad ranks");
  }
  const int64_t tokens = vd[0], heads = vd[1], dv = vd[2], key_heads = qd[1], dk = qd[2], rows = id[0];
  if (kd[0] != qd[0] || kd[1] != qd[1] || kd[2] != qd[2] || qd[0] != tokens || key_heads < 1 ||
      heads % key_heads != 0 || dv > kMaxValueDim || id[1] != heads || id[2] != dk || id[3] != dv ||
      cu.element_count() != rows + 1 || pair.element_count() != rows || g.element_count() != tokens * heads ||
      beta.element_count() != tokens * heads || cd[1] != heads || cd[2] != dk || cd[3] != dv) {
    return ffi::Error::InvalidArgument("gated_delta_scan: shapes do not match");
  }
  DeltaTokens d;
  d.q = q.typed_data(), d.k = k.typed_data(), d.v = v.typed_data(), d.g = g.typed_data(), d.beta = beta.typed_data();
  d.heads = heads, d.key_heads = key_heads, d.dk = dk, d.dv = dv, d.scale = scale;
  const std::string bad =
      radixflow_native::RunScan(threads, d, cu, init, pair, chunk, out, final_state, chunk_states);
  if (!bad.empty()) return ffi::Error::InvalidArgument("gated_delta_scan: " + bad);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowGatedDeltaScan, Impl,
                              radixflow_native::BindScan().Attr<float>("scale").Attr<int64_t>("chunk"));
