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
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxValueDim = 512;

struct Scan {
  const float *q, *k, *v, *g, *beta, *init;
  const int32_t *cu, *pair;
  float *out, *final_state, *chunks;
  std::vector<int64_t> first, tasks;  // first chunk of each row; (row * heads + head) of this phase
  int64_t rows, heads, key_heads, dk, dv, num_chunks, chunk;
  float scale;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

void ScanOne(const Scan& s, int64_t task) {
  const int64_t r = task / s.heads, h = task % s.heads, hk = h / (s.heads / s.key_heads);
  const int64_t dk = s.dk, dv = s.dv, block = dk * dv;
  std::vector<float> state(block);
  const int64_t src = s.pair[r];  // checked in Impl: a used chunk of an unpaired row, written in phase 0
  const float* start = src >= 0 ? s.chunks + (src * s.heads + h) * block : s.init + (r * s.heads + h) * block;
  std::memcpy(state.data(), start, block * sizeof(float));
  float sk[kMaxValueDim], sq[kMaxValueDim], u[kMaxValueDim];
  const int64_t begin = s.cu[r], end = s.cu[r + 1];
  for (int64_t t = begin; t < end; ++t) {
    const float* k = s.k + (t * s.key_heads + hk) * dk;
    const float* q = s.q + (t * s.key_heads + hk) * dk;
    const float* v = s.v + (t * s.heads + h) * dv;
    const float a = std::exp(s.g[t * s.heads + h]), b = s.beta[t * s.heads + h];
    std::fill(sk, sk + dv, 0.f);
    std::fill(sq, sq + dv, 0.f);
    float kq = 0.f;
#pragma omp simd reduction(+ : kq)
    for (int64_t i = 0; i < dk; ++i) kq += k[i] * q[i] * s.scale;
    for (int64_t i = 0; i < dk; ++i) {
      const float ki = k[i], qi = q[i] * s.scale;
      const float* row = state.data() + i * dv;
      for (int64_t c = 0; c < dv; ++c) {
        sk[c] += row[c] * ki;
        sq[c] += row[c] * qi;
      }
    }
    float* o = s.out + (t * s.heads + h) * dv;
    for (int64_t c = 0; c < dv; ++c) {
      u[c] = b * (v[c] - a * sk[c]);
      o[c] = a * sq[c] + u[c] * kq;
    }
    for (int64_t i = 0; i < dk; ++i) {
      const float ki = k[i];
      float* row = state.data() + i * dv;
      for (int64_t c = 0; c < dv; ++c) row[c] = a * row[c] + ki * u[c];
    }
    const int64_t done_tokens = t - begin + 1;
    if (done_tokens % s.chunk == 0 || t == end - 1) {
      const int64_t j = s.first[r] + (done_tokens - 1) / s.chunk;
      std::memcpy(s.chunks + (j * s.heads + h) * block, state.data(), block * sizeof(float));
    }
  }
  std::memcpy(s.final_state + (r * s.heads + h) * block, state.data(), block * sizeof(float));
}

void Drain(Scan& s) {
  const int64_t n = static_cast<int64_t>(s.tasks.size());
  for (int64_t i; (i = s.next.fetch_add(1)) < n;) {
    ScanOne(s, s.tasks[i]);
    s.done.fetch_add(1, std::memory_order_release);
  }
}

// Runs one phase's tasks on this thread and XLA's intra-op helpers; returns when all are done.
void RunPhase(ffi::ThreadPool& threads, const std::shared_ptr<Scan>& s) {
  const int64_t n = static_cast<int64_t>(s->tasks.size());
  if (n == 0) return;
  const int64_t helpers = std::min<int64_t>({threads.num_threads(), 16, n}) - 1;
  for (int64_t i = 0; i < helpers; ++i) threads.Schedule([s] { Drain(*s); });
  Drain(*s);
  while (s->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

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
    auto s = std::make_shared<Scan>();
    s->q = q.typed_data(), s->k = k.typed_data(), s->v = v.typed_data(), s->g = g.typed_data();
    s->beta = beta.typed_data(), s->init = init.typed_data(), s->cu = c, s->pair = pair.typed_data();
    s->out = o, s->final_state = final_state->typed_data(), s->chunks = ch, s->first = first;
    s->rows = rows, s->heads = heads, s->key_heads = key_heads, s->dk = dk, s->dv = dv;
    s->num_chunks = cd[0], s->chunk = chunk, s->scale = scale;
    for (int64_t r = 0; r < rows; ++r) {
      if ((s->pair[r] >= 0) != (phase == 1)) continue;
      for (int64_t h = 0; h < heads; ++h) s->tasks.push_back(r * heads + h);
    }
    RunPhase(threads, s);
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
