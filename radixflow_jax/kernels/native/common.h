// What the native kernels share: their FFI binding, the work-sharing runner over XLA's intra-op
// threads, the one-token gated delta rule on a state block, and the scans' chunk layout, pair_chunk
// check, result set-up, row loop, two phases and binding.
#ifndef RADIXFLOW_NATIVE_COMMON_H_
#define RADIXFLOW_NATIVE_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace radixflow_native {

constexpr int64_t kMaxValueDim = 512;  // per-head scratch of DeltaStep (MAX_VALUE_DIM in __init__.py)

// `binding` with one buffer operand per dtype of D, Rest (in that order) appended. XLA's Binding moves
// only into its own next stage, so bindings pass through here as temporaries, never as copies.
template <xla::ffi::DataType D, xla::ffi::DataType... Rest, class Binding>
auto WithOperands(Binding&& binding) {
  if constexpr (sizeof...(Rest) == 0) {
    return std::move(binding).template Arg<xla::ffi::Buffer<D>>();
  } else {
    return WithOperands<Rest...>(std::move(binding).template Arg<xla::ffi::Buffer<D>>());
  }
}

// `binding` with n >= 1 F32 result buffers appended.
template <size_t n, class Binding>
auto WithResults(Binding&& binding) {
  static_assert(n >= 1, "every kernel has a result");
  if constexpr (n == 1) {
    return std::move(binding).template Ret<xla::ffi::Buffer<xla::ffi::F32>>();
  } else {
    return WithResults<n - 1>(std::move(binding).template Ret<xla::ffi::Buffer<xla::ffi::F32>>());
  }
}

// Every kernel's FFI binding: XLA's intra-op thread pool, one buffer operand per dtype of Operands
// (in order; Kernel.operands in __init__.py has one letter per entry), then `results` F32 result
// buffers; the kernel appends its attributes (.Attr) after these. The handler takes its parameters
// in the same order: the thread pool, the operands, the results, the attributes.
template <size_t results, xla::ffi::DataType... Operands>
auto BindKernel() {
  return WithResults<results>(WithOperands<Operands...>(xla::ffi::Ffi::Bind().Ctx<xla::ffi::ThreadPool>()));
}

// Tasks [0, n), claimed one at a time through an atomic counter by every thread that drains them.
class Tasks {
 public:
  explicit Tasks(int64_t n) : n_(n) {}
  int64_t size() const { return n_; }
  template <class F>
  void Drain(const F& run) {
    for (int64_t t; (t = next_.fetch_add(1)) < n_;) {
      run(t);
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  bool Finished() const { return done_.load(std::memory_order_acquire) >= n_; }

 private:
  const int64_t n_;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
};

// Runs job->Run(t) for every task of job->tasks on this thread and on helpers scheduled on XLA's
// intra-op pool; returns when every task is done, with their writes visible here (release/acquire on
// the done count). This thread drains too, so the call finishes even if no helper ever starts, and
// waits only for tasks a helper has already claimed (which are running). A helper that starts after
// the return finds no task left; the shared_ptr keeps the job alive for it.
template <class Job>
void RunShared(xla::ffi::ThreadPool& threads, const std::shared_ptr<Job>& job) {
  const int64_t n = job->tasks.size();
  if (n == 0) return;
  const int64_t helpers = std::min<int64_t>({threads.num_threads(), 16, n}) - 1;
  for (int64_t i = 0; i < helpers; ++i) {
    threads.Schedule([job] { job->tasks.Drain([&](int64_t t) { job->Run(t); }); });
  }
  job->tasks.Drain([&](int64_t t) { job->Run(t); });
  while (!job->tasks.Finished()) std::this_thread::yield();
}

// One token of the gated delta rule on a state block S [dk, dv] (row-major), with a = exp(g):
//   u = beta (v - a S^T k),  out = a S^T (scale q) + u (k . scale q) = S_new^T (scale q),
//   S_new = a S + k u^T, written to `state` only when `write`.
// S is read from memory once for both products; the update reads it back from cache.
inline void DeltaStep(float* state, const float* q, const float* k, const float* v, float g, float beta, float scale,
                      int64_t dk, int64_t dv, float* out, bool write) {
  const float a = std::exp(g);
  float sk[kMaxValueDim], sq[kMaxValueDim], u[kMaxValueDim];
  std::fill(sk, sk + dv, 0.f);
  std::fill(sq, sq + dv, 0.f);
  float kq = 0.f;
#pragma omp simd reduction(+ : kq)
  for (int64_t i = 0; i < dk; ++i) kq += k[i] * q[i] * scale;
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i], qi = q[i] * scale;
    const float* row = state + i * dv;
    for (int64_t c = 0; c < dv; ++c) {
      sk[c] += row[c] * ki;
      sq[c] += row[c] * qi;
    }
  }
  for (int64_t c = 0; c < dv; ++c) {
    u[c] = beta * (v[c] - a * sk[c]);
    out[c] = a * sq[c] + u[c] * kq;
  }
  if (!write) return;
  for (int64_t i = 0; i < dk; ++i) {
    const float ki = k[i];
    float* row = state + i * dv;
    for (int64_t c = 0; c < dv; ++c) row[c] = a * row[c] + ki * u[c];
  }
}

// The chunk layout of kernels/layout.py over a packed batch, and the pair_chunk contract, checked:
// row r owns tokens [cu[r], cu[r+1]) and chunks [first[r], first[r+1]), first[r+1] = first[r] +
// ceil(len / chunk); a paired row (pair[r] >= 0) starts from a used chunk of an unpaired row.
// Returns an empty string, or what is wrong.
inline std::string ScanLayout(const int32_t* cu, const int32_t* pair, int64_t rows, int64_t tokens, int64_t chunk,
                              int64_t num_chunks, std::vector<int64_t>* first) {
  if (chunk < 1 || cu[0] != 0 || cu[rows] > tokens) return "bad cu_seqlens or chunk size";
  first->assign(rows + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = cu[r + 1] - cu[r];
    if (len < 0) return "cu_seqlens decreases";
    (*first)[r + 1] = (*first)[r] + (len + chunk - 1) / chunk;
  }
  if ((*first)[rows] > num_chunks) return "too few chunk states";
  for (int64_t r = 0; r < rows; ++r) {
    if (pair[r] < 0) continue;
    const auto after = std::upper_bound(first->begin(), first->end(), static_cast<int64_t>(pair[r]));
    const int64_t owner = (after - first->begin()) - 1;
    if (pair[r] >= (*first)[rows] || owner < 0 || owner >= rows || pair[owner] >= 0) {
      return "pair_chunk names no used chunk of an unpaired row";
    }
  }
  return "";
}

// Readies a scan's results before any row runs: checks the chunk layout (ScanLayout over cu, pair and
// chunk_states' leading dimension, into *first), then zeroes the outputs of padding tokens (from
// cu[rows] on; out is [T, ...]) and the unused chunk states (from first[rows] on). Returns an empty
// string, or what is wrong (and then writes nothing).
inline std::string StartScan(const xla::ffi::Buffer<xla::ffi::S32>& cu, const xla::ffi::Buffer<xla::ffi::S32>& pair,
                             int64_t chunk, xla::ffi::ResultBuffer<xla::ffi::F32>& out,
                             xla::ffi::ResultBuffer<xla::ffi::F32>& chunk_states, std::vector<int64_t>* first) {
  const int64_t rows = pair.element_count(), tokens = out->dimensions()[0];
  const int64_t num_chunks = chunk_states->dimensions()[0];
  const std::string bad = ScanLayout(cu.typed_data(), pair.typed_data(), rows, tokens, chunk, num_chunks, first);
  if (!bad.empty()) return bad;
  const int64_t token_width = tokens > 0 ? out->element_count() / tokens : 0;
  const int64_t chunk_width = num_chunks > 0 ? chunk_states->element_count() / num_chunks : 0;
  float *o = out->typed_data(), *ch = chunk_states->typed_data();
  std::fill(o + cu.typed_data()[rows] * token_width, o + tokens * token_width, 0.f);  // padding tokens
  std::fill(ch + (*first)[rows] * chunk_width, ch + num_chunks * chunk_width, 0.f);  // unused chunks
  return "";
}

// One (row, head) of a scan: the state block starts from init_block (or, for a paired row, from its
// source chunk), step(t, state) advances it by token t for t in [cu[r], cu[r+1]), the state after
// every full chunk and after the span goes to chunks[first[r] + j], and the last to final_block.
template <class Step>
void ScanRow(int64_t r, int64_t h, int64_t heads, int64_t block, int64_t chunk, const int32_t* cu,
             const int32_t* pair, const std::vector<int64_t>& first, const float* init, float* chunks,
             float* final_state, const Step& step) {
  std::vector<float> state(block);
  const float* start = pair[r] >= 0 ? chunks + (pair[r] * heads + h) * block : init + (r * heads + h) * block;
  std::memcpy(state.data(), start, block * sizeof(float));
  const int64_t begin = cu[r], end = cu[r + 1];
  for (int64_t t = begin; t < end; ++t) {
    step(t, state.data());
    const int64_t done = t - begin + 1;
    if (done % chunk == 0 || t == end - 1) {
      std::memcpy(chunks + ((first[r] + (done - 1) / chunk) * heads + h) * block, state.data(), block * sizeof(float));
    }
  }
  std::memcpy(final_state + (r * heads + h) * block, state.data(), block * sizeof(float));
}

// A scan phase's job (see RunShared): task i runs (row, head) r, h = divmod(row_heads[i], heads)
// through ScanRow, advancing the state block (tokens.block() floats) by tokens.Step(t, h, state, out),
// the kernel's one-token update of head h by token t, which also writes that token's output to out.
template <class Tokens>
struct ScanJob {
  ScanJob(const Tokens& tokens, std::vector<int64_t> row_heads)
      : tokens(tokens), row_heads(std::move(row_heads)), tasks(this->row_heads.size()) {}
  const Tokens tokens;
  const std::vector<int64_t> row_heads;  // row * heads + head of each task
  const int32_t *cu, *pair;
  const float* init;
  float *out, *final_state, *chunks;
  const std::vector<int64_t>* first;  // first chunk of each row
  int64_t heads, chunk;
  Tasks tasks;

  void Run(int64_t task) const {
    const int64_t r = row_heads[task] / heads, h = row_heads[task] % heads;
    ScanRow(r, h, heads, tokens.block(), chunk, cu, pair, *first, init, chunks, final_state,
            [&](int64_t t, float* state) { tokens.Step(t, h, state, out); });
  }
};

// A scan over a packed batch (init [R, H, ...]): StartScan, then every (row, head) as a ScanJob in
// two phases, unpaired rows first (their chunk states feed the paired rows). Returns an empty string,
// or what is wrong with the layout (and then runs nothing).
template <class Tokens>
std::string RunScan(xla::ffi::ThreadPool& threads, const Tokens& tokens, const xla::ffi::Buffer<xla::ffi::S32>& cu,
                    const xla::ffi::Buffer<xla::ffi::F32>& init, const xla::ffi::Buffer<xla::ffi::S32>& pair,
                    int64_t chunk, xla::ffi::ResultBuffer<xla::ffi::F32>& out,
                    xla::ffi::ResultBuffer<xla::ffi::F32>& final_state,
                    xla::ffi::ResultBuffer<xla::ffi::F32>& chunk_states) {
  std::vector<int64_t> first;
  const std::string bad = StartScan(cu, pair, chunk, out, chunk_states, &first);
  if (!bad.empty()) return bad;
  const int64_t rows = pair.element_count(), heads = init.dimensions()[1];
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<int64_t> row_heads;
    for (int64_t r = 0; r < rows; ++r) {
      if ((pair.typed_data()[r] >= 0) != (phase == 1)) continue;
      for (int64_t h = 0; h < heads; ++h) row_heads.push_back(r * heads + h);
    }
    auto job = std::make_shared<ScanJob<Tokens>>(tokens, std::move(row_heads));
    job->cu = cu.typed_data(), job->pair = pair.typed_data(), job->init = init.typed_data();
    job->out = out->typed_data(), job->final_state = final_state->typed_data();
    job->chunks = chunk_states->typed_data(), job->first = &first, job->heads = heads, job->chunk = chunk;
    RunShared(threads, job);
  }
  return "";
}

// The scans' binding: per-token operands (five F32 buffers: q, k, v, g, beta or x, dt, A, B, C), cu
// (S32), init (F32), pair (S32); results out, final, chunk_states; the kernel appends its attributes.
inline auto BindScan() {
  using xla::ffi::F32, xla::ffi::S32;
  return BindKernel<3, F32, F32, F32, F32, F32, S32, F32, S32>();
}

}  // namespace radixflow_native

#endif  // RADIXFLOW_NATIVE_COMMON_H_
