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
#include <cstring>
#include <memory>
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
  std::vector<int64_t> first;  // first chunk of each row
  const std::vector<int64_t> row_heads;  // row * heads + head of each task
  int64_t heads, key_heads, dk, dv, chunk;
  float scale;
  radixflow_native::Tasks tasks;

  void Run(int64_t task) const {
    const int64_t r = row_heads[task] / heads, h = row_heads[task] % heads, hk = h / (heads / key_heads);
    const int64_t block = dk * dv, src = pair[r];  // src: checked in Impl (a used chunk of an unpaired row)
    std::vector<float> state(block);
    const float* start = src >= 0 ? chunks + (src * heads + h) * block : init + (r * heads + h) * block;
    std::memcpy(state.data(), start, block * sizeof(float));
    const int64_t begin = cu[r], end = cu[r + 1];
    for (int64_t t = begin; t < end; ++t) {
      radixflow_native::DeltaStep(state.data(), q + (t * key_heads + hk) * dk, k + (t * key_heads + hk) * dk,
                                  v + (t * heads + h) * dv, g[t * heads + h], beta[t * heads + h], scale, dk, dv,
                                  out + (t * heads + h) * dv, true);
      const int64_t done_tokens = t - begin + 1;
      if (done_tokens % chunk == 0 || t == end - 1) {
        const int64_t j = first[r] + (done_tokens - 1) / chunk;
        std::memcpy(chunks + (j * heads + h) * block, state.data(), block * sizeof(float));
      }
    }
    std::memcpy(final_state + (r * heads + h) * block, state.data(), block * sizeof(float));
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
      beta.element_count() != tokens * heads || chunk < 1 || cd[1] != heads || cd[2] != dk || cd[3] != dv) {
    return ffi::Error::InvalidArgument("gated_delta_scan: shapes do not match");
  }
  const int32_t* c = cu.typed_data();
  const int64_t block = dk * dv, used_tokens = c[rows];
  if (c[0] != 0 || used_tokens > tokens) return ffi::Error::InvalidArgument("gated_delta_scan: bad cu_seqlens");
  std::vector<int64_t> first(rows + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = c[r + 1] - c[r];
    if (len < 0) return ffi::Error::InvalidArgument("gated_delta_scan: cu_seqlens decreases");
    first[r + 1] = first[r] + (len + chunk - 1) / chunk;
  }
  if (first[rows] > cd[0]) return ffi::Error::InvalidArgument("gated_delta_scan: too few chunk states");
  const int32_t* pr = pair.typed_data();
  for (int64_t r = 0; r < rows; ++r) {  // a paired row starts from a used chunk of an unpaired row
    if (pr[r] < 0) continue;
    const int64_t owner = std::upper_bound(first.begin(), first.end(), static_cast<int64_t>(pr[r])) - first.begin() - 1;
    if (pr[r] >= first[rows] || owner < 0 || owner >= rows || pr[owner] >= 0) {
      return ffi::Error::InvalidArgument("gated_delta_scan: pair_chunk names no used chunk of an unpaired row");
    }
  }
  float* o = out->typed_data();
  std::fill(o + used_tokens * heads * dv, o + tokens * heads * dv, 0.f);
  float* ch = chunk_states->typed_data();
  std::fill(ch + first[rows] * heads * block, ch + cd[0] * heads * block, 0.f);
  for (int phase = 0; phase < 2; ++phase) {  // unpaired rows first: their chunk states feed paired rows
    std::vector<int64_t> row_heads;
    for (int64_t r = 0; r < rows; ++r) {
      if ((pr[r] >= 0) != (phase == 1)) continue;
      for (int64_t h = 0; h < heads; ++h) row_heads.push_back(r * heads + h);
    }
    auto s = std::make_shared<Scan>(std::move(row_heads));
    s->q = q.typed_data(), s->k = k.typed_data(), s->v = v.typed_data(), s->g = g.typed_data();
    s->beta = beta.typed_data(), s->init = init.typed_data(), s->cu = c, s->pair = pr;
    s->out = o, s->final_state = final_state->typed_data(), s->chunks = ch, s->first = first;
    s->heads = heads, s->key_heads = key_heads, s->dk = dk, s->dv = dv, s->chunk = chunk, s->scale = scale;
    radixflow_native::RunShared(threads, s);
  }
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
