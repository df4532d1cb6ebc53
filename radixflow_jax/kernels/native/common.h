// What the native kernels share: the work-sharing runner over XLA's intra-op threads, and the
// one-token gated delta rule on a state block.
#ifndef RADIXFLOW_NATIVE_COMMON_H_
#define RADIXFLOW_NATIVE_COMMON_H_

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>

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

}  // namespace radixflow_native

#endif  // RADIXFLOW_NATIVE_COMMON_H_
