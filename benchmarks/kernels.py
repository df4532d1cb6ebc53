"""Times each hot op, reference (XLA) vs Pallas, at real layer sizes, with roofline fractions.

Shapes: one Qwen3.5-4B GDN layer (Hk 16, Hv 32, dk = dv = 128), one Nemotron-H-8B Mamba2 layer
(128 heads x 64, d_state 128, 8 groups), and Qwen3.5-4B attention (16 q / 4 kv heads x 256) over a
batch of decode rows and of 2k-token prefills. On CPU only the reference runs (Pallas needs a TPU or
GPU; interpret mode is a correctness tool, not a speed one) and the script says so.

    python benchmarks/kernels.py [--prefill 2048] [--rows 4] [--decode-rows 64] [--device h200]
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.engine.specs import get_device_spec
from radixflow_jax.kernels import attention, gated_delta, ssd


def _time(fn: Callable[[], object], reps: int = 5) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _cases(prefill: int, rows: int, decode_rows: int, dtype: jnp.dtype) -> dict[str, tuple[Callable, float, float]]:
    """name -> (callable(impl_module) -> fn, flops, bytes)."""
    k = jax.random.split(jax.random.key(0), 8)
    t = prefill * rows
    cu = jnp.arange(rows + 1, dtype=jnp.int32) * prefill
    # gated delta (one Qwen3.5-4B layer)
    hk, hv, d = 16, 32, 128
    def unit(key: jax.Array) -> jax.Array:
        z = jax.random.normal(key, (t, hk, d))
        return (z / jnp.linalg.norm(z, axis=-1, keepdims=True)).astype(dtype)

    q, kk = unit(k[0]), unit(k[1])
    v = jax.random.normal(k[2], (t, hv, d)).astype(dtype)
    g = -jax.nn.softplus(jax.random.normal(k[3], (t, hv)))
    beta = jax.nn.sigmoid(jax.random.normal(k[4], (t, hv)))
    s0 = jnp.zeros((rows, hv, d, d), jnp.float32)
    gdn_flops = t * hv * (6 * d * d + 4 * 64 * d)
    gdn_bytes = t * (2 * hk + hv) * d * 2 + rows * hv * d * d * 8
    # SSD (one Nemotron-H-8B layer)
    h, p, n, grp = 128, 64, 128, 8
    x = jax.random.normal(k[5], (t, h, p)).astype(dtype)
    dt = jax.nn.softplus(jax.random.normal(k[6], (t, h)))
    a = -jnp.exp(jax.random.normal(k[7], (h,)))
    b = jax.random.normal(k[0], (t, grp, n)).astype(dtype)
    c = jax.random.normal(k[1], (t, grp, n)).astype(dtype)
    h0 = jnp.zeros((rows, h, p, n), jnp.float32)
    ssd_flops = t * h * (6 * p * n + 4 * 128 * p)
    ssd_bytes = t * (h * p + 2 * grp * n) * 2 + rows * h * p * n * 8
    # attention decode (Qwen3.5-4B attention layer, 4k context each)
    page, ctx = 16, 4096
    pages = decode_rows * ctx // page + 1
    kp = jax.random.normal(k[2], (pages, page, 4, 256)).astype(dtype)
    vp = jax.random.normal(k[3], (pages, page, 4, 256)).astype(dtype)
    table = (1 + jnp.arange(decode_rows * (ctx // page), dtype=jnp.int32)).reshape(decode_rows, -1)
    qd = jax.random.normal(k[4], (decode_rows, 16, 256)).astype(dtype)
    cud = jnp.arange(decode_rows + 1, dtype=jnp.int32)
    lens = jnp.full((decode_rows,), ctx, jnp.int32)
    att_flops = 4 * decode_rows * 16 * 256 * ctx
    att_bytes = decode_rows * ctx * 4 * 256 * 2 * 2
    return {
        "gated_delta_chunked": (lambda m: lambda: m.gated_delta_chunked(q, kk, v, g, beta, cu, s0), gdn_flops, gdn_bytes),
        "ssd_chunked": (lambda m: lambda: m.ssd_chunked(x, dt, a, b, c, cu, h0), ssd_flops, ssd_bytes),
        "paged_attention (decode)": (
            lambda m: lambda: m.paged_attention(qd, kp, vp, table, cud, lens, scale=256**-0.5), att_flops, att_bytes
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--decode-rows", type=int, default=64)
    ap.add_argument("--device", default="h200", help="roofline reference (datasheet peaks)")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    platform = jax.default_backend()
    dev = get_device_spec(args.device)
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    impls: dict[str, dict[str, object]] = {"reference": {"gated_delta_chunked": gated_delta, "ssd_chunked": ssd,
                                                         "paged_attention (decode)": attention}}  # fmt: skip
    if platform in ("tpu", "gpu", "cuda", "rocm"):
        from radixflow_jax.kernels.pallas import gated_delta as pg, paged_attention as pa, ssd as ps

        impls["pallas"] = {"gated_delta_chunked": pg, "ssd_chunked": ps, "paged_attention (decode)": pa}
    else:
        print(f"platform {platform}: Pallas kernels need a TPU or GPU; timing the reference only")
    print(f"{'op':28s} {'impl':10s} {'ms':>9s} {'GFLOP/s':>9s} {'%flops':>7s} {'GB/s':>8s} {'%bw':>6s} ratio")
    for name, (make, flops, nbytes) in _cases(args.prefill, args.rows, args.decode_rows, dtype).items():
        base = None
        for impl, mods in impls.items():
            fn = jax.jit(make(mods[name]))
            sec = _time(fn)
            base = base or sec
            print(f"{name:28s} {impl:10s} {sec * 1e3:9.2f} {flops / sec / 1e9:9.1f} "
                  f"{100 * flops / sec / dev.peak_flops:7.3f} {nbytes / sec / 1e9:8.1f} "
                  f"{100 * nbytes / sec / dev.hbm_bandwidth:6.2f} {base / sec:5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
