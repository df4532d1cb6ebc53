// What the native kernels share: the work-sharing runner over XLA's intra-op threads, the one-token
// gated delta rule on a state block, and the scans' chunk layout, pair_chunk check and row loop.
#ifndef RADIXFLOW_NATIVE_COMMON_H_
#define RADIXFLOW_NATIVE_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace radixflow_native {

constexpr int64_t kMaxValueDim = 512;  // per-head scratch of DeltaStep (MAX_VALUE_DIM in __init__.py)

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

// Runs job_for(tasks) over every (row, head) in two phases, unpaired rows first (their chunk states
// feed the paired rows); job_for builds a job (see RunShared) whose task i is tasks[i] = row * heads
// + head.
template <class MakeJob>
void RunScanPhases(xla::ffi::ThreadPool& threads, int64_t rows, int64_t heads, const int32_t* pair,
                   const MakeJob& job_for) {
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<int64_t> tasks;
    for (int64_t r = 0; r < rows; ++r) {
      if ((pair[r] >= 0) != (phase == 1)) continue;
      for (int64_t h = 0; h < heads; ++h) tasks.push_back(r * heads + h);
    }
    RunShared(threads, job_for(std::move(tasks)));
  }
}

}  // namespace radixflow_native

#endif  // RADIXFLOW_NATIVE_COMMON_H_
