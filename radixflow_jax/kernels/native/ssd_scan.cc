// The Mamba2 (SSD) recurrence over a packed batch of prefill rows, token by token, for XLA:CPU.
//
// Operands (the XLA FFI handler "radixflow_ssd_scan"):
//   x     f32[T, H, P]; dt f32[T, H] (> 0, softplus'ed); A f32[H] (< 0); B, C f32[T, G, N]
//         (head h reads group h / (H / G))
//   cu    s32[R + 1]; init f32[R, H, P, N]; pair s32[R]: as in gated_delta_scan.cc (common.h ScanLayout)
// Attribute: chunk (the checkpoint grid). Results: y f32[T, H, P] (0 for padding tokens),
// final f32[R, H, P, N], chunk_states f32[ceil(T / chunk) + R, H, P, N] (unused chunks 0).
//
// Per token, with a = exp(dt A[h]):  S <- a S + dt x B^T,  y = S C   (S [P, N]); no D skip term and
// no gate (the caller adds them), the recurrence of kernels/ssd.py, whose ssd_naive is this
// per-token form. Each (row, head) keeps its state in a local buffer for its span.
#include <cmath>
#include <cstdint>
#include <string>

#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One token of the SSD recurrence on a state block S [p, n], with y = S_new C.
inline void SsdStep(float* state, const float* x, float dt, float a_log, const float* b, const float* c, int64_t p,
                    int64_t n, float* y) {
  const float a = std::exp(dt * a_log);
  for (int64_t i = 0; i < p; ++i) {
    const float dx = dt * x[i];
    float* row = state + i * n;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < n; ++j) {
      row[j] = a * row[j] + dx * b[j];
      acc += row[j] * c[j];
    }
    y[i] = acc;
  }
}

// The scan's per-token operands and its one-token update (SsdStep), for ScanJob.
struct SsdTokens {
  const float *x, *dt, *a, *b, *c;
  int64_t heads, groups, p, n;

  int64_t block() const { return p * n; }
  void Step(int64_t t, int64_t h, float* state, float* y) const {
    const int64_t grp = h / (heads / groups);
    SsdStep(state, x + (t * heads + h) * p, dt[t * heads + h], a[h], b + (t * groups + grp) * n,
            c + (t * groups + grp) * n, p, n, y + (t * heads + h) * p);
  }
};

ffi::Error Impl(ffi::ThreadPool threads, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dt, ffi::Buffer<ffi::F32> a,
                ffi::Buffer<ffi::F32> b, ffi::Buffer<ffi::F32> c, ffi::Buffer<ffi::S32> cu,
                ffi::Buffer<ffi::F32> init, ffi::Buffer<ffi::S32> pair, ffi::ResultBuffer<ffi::F32> y,
                ffi::ResultBuffer<ffi::F32> final_state, ffi::ResultBuffer<ffi::F32> chunk_states, int64_t chunk) {
  const auto xd = x.dimensions(), bd = b.dimensions(), cdim = c.dimensions(), id = init.dimensions();
  const auto dd = dt.dimensions();
  const auto sd = chunk_states->dimensions();
  if (xd.size() != 3 || bd.size() != 3 || cdim.size() != 3 || id.size() != 4 || sd.size() != 4 || dd.size() != 2) {
    return ffi::Error::InvalidArgument("ssd_scan: bad ranks");
  }
  const int64_t tokens = xd[0], heads = xd[1], p = xd[2], groups = bd[1], n = bd[2], rows = id[0];
  if (bd[0] != tokens || cdim[0] != tokens || cdim[1] != groups || cdim[2] != n || groups < 1 ||
      heads % groups != 0 || dd[0] != tokens || dd[1] != heads || a.element_count() != heads ||
      id[1] != heads || id[2] != p || id[3] != n || cu.element_count() != rows + 1 ||
      pair.element_count() != rows || sd[1] != heads || sd[2] != p || sd[3] != n) {
    return ffi::Error::InvalidArgument("ssd_scan: shapes do not match");
  }
  SsdTokens s;
  s.x = x.typed_data(), s.dt = dt.typed_data(), s.a = a.typed_data(), s.b = b.typed_data(), s.c = c.typed_data();
  s.heads = heads, s.groups = groups, s.p = p, s.n = n;
  const std::string bad = radixflow_native::RunScan(threads, s, cu, init, pair, chunk, y, final_state, chunk_states);
  if (!bad.empty()) return ffi::Error::InvalidArgument("ssd_scan: " + bad);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RadixflowSsdScan, Impl,
                              radixflow_native::BindScan().Attr<int64_t>("chunk"));
