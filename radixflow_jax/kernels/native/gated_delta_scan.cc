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
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using radixflow_native::kMaxValueDim;

// One phase of the scan: its (row, head) tasks.
struct Scan {
  explicit Scan(std::vector<int64_t> row_heads) : row_heads(std::move(row_heads)), tasks(this->row_heads.size()) {}
  const float *q, *k, *v, *g, *beta, *init;
  const int32_t *cu, *pair;
  float *out, *final_state, *chunks;
  const std::vector<int64_t>* first;  // first chunk of each row
  const std::vector<int64_t> row_heads;  // row * heads + head of each task
  int64_t heads, key_heads, dk, dv, chunk;
  float scale;
  radixflow_native::Tasks tasks;

  void Run(int64_t task) const {
    const int64_t r = row_heads[task] / heads, h = row_heads[task] % heads, hk = h / (heads / key_heads);
    radixflow_native::ScanRow(r, h, heads, dk * dv, chunk, cu, pair, *first, init, chunks, final_state,
                              [&](int64_t t, float* state) {
                                radixflow_native::DeltaStep(state, q + (t * key_heads + hk) * dk,
                                                            k + (t * key_heads + hk) * dk, v + (t * heads + h) * dv,
                                                            g[t * heads + h], beta[t * heads + h], scale, dk, dv,
                                                            out + (t * heads + h) * dv, true);
                              });
  }
};

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::S32> cu,
                ffi::Buffer<ffi::F32> init, ffi::Buffer<ffi::S32> pair, float scale, int64_t chunk,
                ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> final_state,
                ffi::ResultBuffer<ffi::F32> chunk_states) {
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
  const int32_t *c = cu.typed_data(), *pr = pair.typed_data();
  std::vector<int64_t> first;
  const std::string bad = radixflow_native::ScanLayout(c, pr, rows, tokens, chunk, cd[0], &first);
  if (!bad.empty()) return ffi::Error::InvalidArgument("gated_delta_scan: " + bad);
  const int64_t block = dk * dv;
  float *o = out->typed_data(), *ch = chunk_states->typed_data();
  std::fill(o + c[rows] * heads * dv, o + tokens * heads * dv, 0.f);  // padding tokens
  std::fill(ch + first[rows] * heads * block, ch + cd[0] * heads * block, 0.f);  // unused chunks
  radixflow_native::RunScanPhases(threads, rows, heads, pr, [&](std::vector<int64_t> tasks) {
    auto s = std::make_shared<Scan>(std::move(tasks));
    s->q = q.typed_data(), s->k = k.typed_data(), s->v = v.typed_data(), s->g = g.typed_data();
    s->beta = beta.typed_data(), s->init = init.typed_data(), s->cu = c, s->pair = pr;
    s->out = o, s->final_state = final_state->typed_data(), s->chunks = ch, s->first = &first;
    s->heads = heads, s->key_heads = key_heads, s->dk = dk, s->dv = dv, s->chunk = chunk, s->scale = scale;
    return s;
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowGatedDeltaScan, Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("chunk")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
