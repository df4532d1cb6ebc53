"""Times each hot op: the pure-jnp reference, the faster XLA formulation (``kernels/fast.py``,
``xla``) where one exists, and Pallas on a TPU/GPU, with roofline fractions and the ratio to the
reference.

Shapes: one Qwen3.5-4B GDN layer (Hk 16, Hv 32, dk = dv = 128), one Nemotron-H-8B Mamba2 layer
(128 heads x 64, d_state 128, 8 groups), and Qwen3.5-4B attention (16 q / 4 kv heads x 256) over a
batch of decode rows (4k context each) and over the prefill rows themselves (causal, context =
span). ``--small`` uses the sizes of ``benchmarks/vs_transformers.py``'s model instead (GDN 4/8
heads x 64, attention 8 q / 2 kv heads x 64, 4 rows of 256 tokens, 64 decode rows at 300 tokens),
which is what a 2-core CPU can time in a minute. On CPU Pallas does not run (interpret mode is a
correctness tool, not a speed one) and the script says so.

    python benchmarks/kernels.py [--small] [--prefill 2048] [--rows 4] [--decode-rows 64] [--device h200]

``--sub-chunks 64,16`` also times the xla Gated DeltaNet kernel at those sub-chunk sizes
(``xla/subN``; 64 is the form before sub-chunks), interleaved with the others.

On the CPU with float32 (``--small``), ``native`` times the C++ kernels of ``kernels/native``: the
token-by-token Gated DeltaNet and SSD scans; for decode rows, ``gated_delta_decode (window)``, their update
of their state window in a donated pool (the reference and xla rows: the window slice, the one-step
update and one ``dynamic_update_slice``, as the step ran it before the native kernel), and the
decode ``paged_attention``.
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from types import SimpleNamespace
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.sim.specs import get_device_spec
from radixflow_jax.kernels import attention, fast, gated_delta, native, ssd


def _time_interleaved(fns: dict[str, Callable[[], object]], reps: int = 5) -> dict[str, tuple[float, float]]:
    """Median and (max - min) seconds per implementation; each is compiled and run once first, then
    the implementations take turns rep by rep, so a load change on a shared machine hits all alike."""
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t)
    return {name: (float(np.median(ts)), max(ts) - min(ts)) for name, ts in times.items()}


def _cases(
    prefill: int, rows: int, decode_rows: int, dtype: jnp.dtype, small: bool
) -> dict[str, tuple[Callable, float, float]]:
    """name -> (callable(impl_module) -> fn, flops, bytes)."""
    k = jax.random.split(jax.random.key(0), 8)
    t = prefill * rows
    cu = jnp.arange(rows + 1, dtype=jnp.int32) * prefill
    # gated delta (one Qwen3.5-4B layer, or the vs_transformers model's)
    hk, hv, d = (4, 8, 64) if small else (16, 32, 128)
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
    h, p, n, grp = (16, 64, 64, 1) if small else (128, 64, 128, 8)
    x = jax.random.normal(k[5], (t, h, p)).astype(dtype)
    dt = jax.nn.softplus(jax.random.normal(k[6], (t, h)))
    a = -jnp.exp(jax.random.normal(k[7], (h,)))
    b = jax.random.normal(k[0], (t, grp, n)).astype(dtype)
    c = jax.random.normal(k[1], (t, grp, n)).astype(dtype)
    h0 = jnp.zeros((rows, h, p, n), jnp.float32)
    ssd_flops = t * h * (6 * p * n + 4 * 128 * p)
    ssd_bytes = t * (h * p + 2 * grp * n) * 2 + rows * h * p * n * 8
    # attention decode (Qwen3.5-4B attention layer, 4k context each) and prefill (context = span)
    page, ctx = 16, (304 if small else 4096)
    hq, hkv, hd = (8, 2, 64) if small else (16, 4, 256)
    max_pages = max(ctx, prefill) // page + 1
    pages = (decode_rows + rows) * max_pages + 1
    kp = jax.random.normal(k[2], (pages, page, hkv, hd)).astype(dtype)
    vp = jax.random.normal(k[3], (pages, page, hkv, hd)).astype(dtype)
    table = (1 + jnp.arange(decode_rows * max_pages, dtype=jnp.int32)).reshape(decode_rows, -1)
    qd = jax.random.normal(k[4], (decode_rows, hq, hd)).astype(dtype)
    cud = jnp.arange(decode_rows + 1, dtype=jnp.int32)
    lens = jnp.full((decode_rows,), ctx, jnp.int32)
    att_flops = 4 * decode_rows * hq * hd * ctx
    att_bytes = decode_rows * ctx * hkv * hd * 2 * 2
    table_p = (1 + decode_rows * max_pages + jnp.arange(rows * max_pages, dtype=jnp.int32)).reshape(rows, -1)
    qp = jax.random.normal(k[5], (t, hq, hd)).astype(dtype)
    lens_p = jnp.full((rows,), prefill, jnp.int32)
    pre_flops = 2 * rows * hq * hd * prefill * prefill  # causal half of 4 * T * ctx
    pre_bytes = rows * prefill * hkv * hd * 2 * 2
    # the decode rows' state window (decode_rows rows, a pool of decode_rows + 1 slots, window at slot 1)
    qw, kw_ = unit(k[5])[:decode_rows], unit(k[6])[:decode_rows]
    vw, gw, bw = v[:decode_rows], g[:decode_rows], beta[:decode_rows]
    real = jnp.ones((decode_rows,), bool)
    pool_shape = (decode_rows + 1, hv, d, d)
    win_flops = decode_rows * hv * 8 * d * d
    win_bytes = decode_rows * hv * d * d * 4 * 2
    return {
        "gated_delta_decode (window)": (
            lambda m: _donated_pool(m, pool_shape, (qw, kw_, vw, gw, bw), real), win_flops, win_bytes
        ),
        "gated_delta_chunked": (lambda m: lambda: m.gated_delta_chunked(q, kk, v, g, beta, cu, s0), gdn_flops, gdn_bytes),
        "ssd_chunked": (lambda m: lambda: m.ssd_chunked(x, dt, a, b, c, cu, h0), ssd_flops, ssd_bytes),
        "paged_attention (decode)": (
            lambda m: lambda: m.paged_attention(qd, kp, vp, table, cud, lens, scale=hd**-0.5), att_flops, att_bytes
        ),
        "paged_attention (prefill)": (
            lambda m: lambda: m.paged_attention(qp, kp, vp, table_p, cu, lens_p, scale=hd**-0.5), pre_flops, pre_bytes
        ),
    }


def _window_update(decode: Callable) -> Callable:
    """The window update as the step ran it before the native kernel: slice, one step, one write."""

    def update(q, k, v, g, beta, pool, base, real):
        window = jax.lax.dynamic_slice_in_dim(pool, base, v.shape[0], 0)
        out, new = decode(q, k, v, g, beta, window)
        new = jnp.where(real[:, None, None, None], new, window)
        return out, jax.lax.dynamic_update_slice_in_dim(pool, new, base, 0)

    return update


def _donated_pool(m: object, shape: tuple[int, ...], xs: tuple, real: jax.Array) -> Callable[[], object]:
    """A call of ``m.gated_delta_decode_window`` on a pool it donates and gets back (so every
    implementation updates in place and none pays a copy of the pool)."""
    step = jax.jit(lambda pool: m.gated_delta_decode_window(*xs, pool, jnp.int32(1), real), donate_argnums=0)
    box = [jnp.zeros(shape, jnp.float32)]

    def call() -> object:
        out, box[0] = step(box[0])
        return out

    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=None, help="tokens per prefill row (2048; 256 with --small)")
    ap.add_argument("--rows", type=int, default=None, help="prefill rows (2; 4 with --small)")
    ap.add_argument("--decode-rows", type=int, default=64)
    ap.add_argument("--device", default="h200", help="roofline reference (datasheet peaks)")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--small", action="store_true", help="the vs_transformers model's sizes (CPU-friendly)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--sub-chunks", default="64", help="also time the xla GDN kernel in these sub-chunk sizes "
                    "(64: the form before sub-chunks; '' for none)")  # fmt: skip
    args = ap.parse_args()
    if args.small:
        args.dtype = "float32"
    args.prefill = args.prefill or (256 if args.small else 2048)
    args.rows = args.rows or (4 if args.small else 2)
    platform = jax.default_backend()
    dev = get_device_spec(args.device)
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    impls: dict[str, dict[str, object]] = {
        "reference": {"gated_delta_chunked": gated_delta, "ssd_chunked": ssd, "paged_attention (decode)": attention,
                      "paged_attention (prefill)": attention,
                      "gated_delta_decode (window)": SimpleNamespace(
                          gated_delta_decode_window=_window_update(gated_delta.gated_delta_decode))},
        "xla": {"gated_delta_chunked": fast, "paged_attention (decode)": fast, "paged_attention (prefill)": fast,
                "gated_delta_decode (window)": SimpleNamespace(
                    gated_delta_decode_window=_window_update(fast.gated_delta_decode))},
    }  # fmt: skip
    if platform == "cpu" and dtype == jnp.float32 and native.enabled():
        impls["native"] = {
            "gated_delta_decode (window)": native,
            "gated_delta_chunked": SimpleNamespace(gated_delta_chunked=native.gated_delta_scan),
            "ssd_chunked": SimpleNamespace(ssd_chunked=native.ssd_scan),
            "paged_attention (decode)": SimpleNamespace(paged_attention=native.paged_attention_decode),
        }
    for size in filter(None, args.sub_chunks.split(",")):  # side by side with the default sub-chunk size
        sized = partial(fast.gated_delta_chunked, sub_chunk=int(size))
        impls[f"xla/sub{int(size)}"] = {"gated_delta_chunked": SimpleNamespace(gated_delta_chunked=sized)}
    if platform in ("tpu", "gpu", "cuda", "rocm"):
        from radixflow_jax.kernels.pallas import gated_delta as pg, paged_attention as pa, ssd as ps

        impls["pallas"] = {"gated_delta_chunked": pg, "ssd_chunked": ps, "paged_attention (decode)": pa,
                           "paged_attention (prefill)": pa}  # fmt: skip
    else:
        print(f"platform {platform}: Pallas kernels need a TPU or GPU; timing the reference and xla forms only")
    load_before = os.getloadavg()
    print(f"load average (1/5/15 min) before: {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}")
    print(f"{'op':28s} {'impl':10s} {'ms':>9s} {'spread':>7s} {'GFLOP/s':>9s} {'%flops':>7s} {'GB/s':>8s} {'%bw':>6s} ratio")
    cases = _cases(args.prefill, args.rows, args.decode_rows, dtype, args.small)
    for name, (make, flops, nbytes) in cases.items():
        fns = {impl: _jitted(name, make(mods[name])) for impl, mods in impls.items() if name in mods}
        timed = _time_interleaved(fns, args.reps)
        base = timed["reference"][0]
        for impl, (sec, spread) in timed.items():
            print(f"{name:28s} {impl:10s} {sec * 1e3:9.2f} {spread * 1e3:7.2f} {flops / sec / 1e9:9.1f} "
                  f"{100 * flops / sec / dev.peak_flops:7.3f} {nbytes / sec / 1e9:8.1f} "
                  f"{100 * nbytes / sec / dev.hbm_bandwidth:6.2f} {base / sec:5.2f}x")  # fmt: skip
    load = os.getloadavg()
    print(f"load average (1/5/15 min) after: {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")


def _jitted(name: str, fn: Callable[[], object]) -> Callable[[], object]:
    return fn if name == "gated_delta_decode (window)" else jax.jit(fn)  # that one jits its own step


if __name__ == "__main__":
    main()
