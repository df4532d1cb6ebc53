"""The prepared GPU check (issue 35 part 2), run by ``benchmarks/gpu_check.sh``: one row per
measurement, printed as soon as it is measured (and appended to ``$OUT/gpu_check.tsv`` when ``OUT``
is set), so a run cut short keeps what it measured.

Stages (``--stages``, default all):
  * ``ceilings``: device-to-device copy bandwidth (bytes read + written) and the bf16 matrix rate,
    measured once on random data: the roofline every later row is a fraction of.
  * ``kernels``: each Pallas kernel (chunked gated delta, chunked SSD, paged attention) with its
    platform lowering (not interpret mode) against the pure-jnp reference in float32 on upcast
    inputs (``rel_err = |out - ref| / |ref|``, fresh random inputs, NaN never passes), then timed
    against its XLA form (``ops`` under backend ``xla``); the kernel's fewest bytes (inputs read
    once, outputs written once) over its time, as a fraction of the copy bandwidth.
  * ``step``: the whole jitted round at the Qwen3.5-4B shape (random bf16 weights): decode at 64
    rows with a 1024-token context and a 2048-token prefill (64 rows x 32 tokens), time per round
    against its floor (weights + KV + state traffic at the measured bandwidth; for the prefill also
    2 x params x tokens FLOPs at the measured matrix rate); and the fixed per-round cost, what is
    left of a one-row decode round after its weight and state traffic at the measured bandwidth.

``--dry-run`` runs every stage on the CPU at toy sizes (Pallas in interpret mode, the tiny hybrid's
shape), so the script is known to run before device time is spent (``tests/bench/test_gpu_check.py``
runs it in CI). Imports only ``kernels/``, ``models/`` and ``runner/`` (with the plain-Python round
plan the runner's inputs are built from): the GPU machine may lack the server's dependencies.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.kernels import attention as ref_attention
from radixflow_jax.kernels import gated_delta as ref_gated_delta
from radixflow_jax.kernels import ops
from radixflow_jax.kernels import ssd as ref_ssd
from radixflow_jax.kernels.pallas import gated_delta as pallas_gated_delta
from radixflow_jax.kernels.pallas import paged_attention as pallas_attention
from radixflow_jax.kernels.pallas import ssd as pallas_ssd

STAGES = ("ceilings", "kernels", "step")


def median_time(fn: Callable[[], Any], reps: int) -> float:
    """Median seconds of ``fn()`` (its result blocked on), after two untimed calls."""
    for _ in range(2):
        jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Table:
    """Rows printed at once and appended to ``$OUT/gpu_check.tsv``."""

    def __init__(self) -> None:
        out = os.environ.get("OUT")
        self.path = os.path.join(out, "gpu_check.tsv") if out else None

    def row(self, stage: str, name: str, **fields: Any) -> None:
        text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        print(f"{stage:>9s} {name:<28s} {text}", flush=True)
        if self.path:
            with open(self.path, "a") as f:
                f.write("\t".join([stage, name, text]) + "\n")


def ceilings(table: Table, dry: bool, reps: int) -> tuple[float, float]:
    """``(copy bytes/s, bf16 matmul FLOP/s)``."""
    key = jax.random.key(0)
    n = (1 << 20) if dry else (1 << 30)  # 2 GiB of bf16 on the device
    x = jax.random.normal(key, (n,), jnp.bfloat16)
    copy = jax.jit(lambda a: a * 1)  # one read and one write of every element
    t = median_time(lambda: copy(x), reps)
    bandwidth = 2 * x.nbytes / t
    table.row("ceilings", "copy", bytes=2 * x.nbytes, s=t, tb_per_s=bandwidth / 1e12)
    m = 256 if dry else 8192
    a, b = jax.random.normal(key, (m, m), jnp.bfloat16), jax.random.normal(jax.random.key(1), (m, m), jnp.bfloat16)
    mm = jax.jit(lambda p, q: p @ q)
    t = median_time(lambda: mm(a, b), reps)
    rate = 2 * m**3 / t
    table.row("ceilings", "matmul_bf16", n=m, s=t, tflop_per_s=rate / 1e12)
    host_link(table, dry, reps)
    return bandwidth, rate


def host_link(table: Table, dry: bool, reps: int) -> None:
    """The host tier's link (``sim/specs.py`` assumes 64 GB/s per direction on an H200): one
    checkpoint-sized copy each way (49 MiB, one Qwen3.5-9B checkpoint), from pageable host memory
    as ``runner/hoststates.py`` holds it."""
    h = np.ones(((1 << 16) if dry else (49 << 18),), np.float32)
    t = median_time(lambda: jax.device_put(h), reps)
    table.row("ceilings", "host_to_device", bytes=h.nbytes, s=t, gb_per_s=h.nbytes / t / 1e9)
    d = jax.device_put(h)
    fresh = jax.jit(lambda a: a * 1)  # a new device array each time (a fetched one caches its host copy)
    times = []
    for i in range(reps + 2):
        src = jax.block_until_ready(fresh(d))
        start = time.perf_counter()
        np.asarray(src)
        if i >= 2:
            times.append(time.perf_counter() - start)
    t = statistics.median(times)
    table.row("ceilings", "device_to_host", bytes=h.nbytes, s=t, gb_per_s=h.nbytes / t / 1e9)


def _rel_err(got: Any, want: Any) -> float:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.isfinite(g).all():
        return float("nan")
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def _kernel_cases(dry: bool) -> dict[str, tuple[Callable, Callable, Callable, tuple]]:
    """``name -> (pallas fn, reference fn, xla fn, args)`` on fresh random bf16 inputs."""
    t, r = (128, 2) if dry else (8192, 16)
    rng = np.random.default_rng(int(time.time()))

    def arr(shape: tuple[int, ...], dtype: Any = jnp.bfloat16, scale: float = 0.5) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape) * scale, dtype)

    cu = jnp.asarray(np.linspace(0, t, r + 1).astype(np.int32))
    hk, hv, dk = (2, 4, 32) if dry else (16, 32, 128)
    gd = (arr((t, hk, dk)), arr((t, hk, dk)), arr((t, hv, dk)), -jnp.abs(arr((t, hv), jnp.float32, 0.1)),
          jax.nn.sigmoid(arr((t, hv), jnp.float32)), cu, arr((r, hv, dk, dk), jnp.float32, 0.1))  # fmt: skip
    heads, groups, p, n = (4, 2, 32, 16) if dry else (128, 8, 64, 128)
    sd = (arr((t, heads, p)), jax.nn.softplus(arr((t, heads), jnp.float32)), -jnp.abs(arr((heads,), jnp.float32)),
          arr((t, groups, n)), arr((t, groups, n)), cu, arr((r, heads, p, n), jnp.float32, 0.1))  # fmt: skip
    hq, hkv, d, ps = (4, 2, 32, 16) if dry else (16, 4, 256, 16)
    ctx = t // r
    pages = r * math.ceil(ctx / ps) + 1
    table = jnp.asarray(1 + np.arange(r * math.ceil(ctx / ps)).reshape(r, -1), jnp.int32)
    at = (arr((t, hq, d)), arr((pages, ps, hkv, d)), arr((pages, ps, hkv, d)), table, cu,
          jnp.full((r,), ctx, jnp.int32))  # fmt: skip
    variant = dict(backend="gpu", interpret=dry)
    chunk = 64
    return {
        "gated_delta_chunked": (
            lambda *a: pallas_gated_delta.gated_delta_chunked(*a, chunk_size=chunk, block_v=64, **variant),
            lambda *a: ref_gated_delta.gated_delta_chunked(*a, chunk_size=chunk),
            lambda *a: ops.gated_delta_chunked(*a, chunk_size=chunk), gd),
        "ssd_chunked": (
            lambda *a: pallas_ssd.ssd_chunked(*a, chunk_size=chunk, **variant),
            lambda *a: ref_ssd.ssd_chunked(*a, chunk_size=chunk),
            lambda *a: ops.ssd_chunked(*a, chunk_size=chunk), sd),
        "paged_attention": (
            lambda *a: pallas_attention.paged_attention(*a, scale=d**-0.5, block_q=16, **variant),
            lambda *a: ref_attention.paged_attention(*a, scale=d**-0.5),
            lambda *a: ops.paged_attention(*a, scale=d**-0.5), at),
    }  # fmt: skip


def kernels(table: Table, dry: bool, reps: int, bandwidth: float) -> None:
    for name, (pallas, reference, xla, args) in _kernel_cases(dry).items():
        up = tuple(a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a for a in args)
        want = jax.jit(reference)(*up)
        got = jax.jit(pallas)(*args)
        errs = [_rel_err(g, w) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
        moved = sum(a.nbytes for a in args) + sum(o.nbytes for o in jax.tree.leaves(got))
        fast = jax.jit(pallas)
        with ops.use_backend("xla"):
            slow = jax.jit(xla)
            t_xla = median_time(lambda: slow(*args), reps)
        t_pallas = median_time(lambda: fast(*args), reps)
        table.row("kernels", name, rel_err=max(errs), pallas_s=t_pallas, xla_s=t_xla, speedup=t_xla / t_pallas,
                  roofline=moved / t_pallas / bandwidth)  # fmt: skip


def _model(dry: bool) -> tuple[Any, Any, Any]:
    """``(config, graphdef, params)``: the Qwen3.5-4B shape with random bf16 weights on the device
    (the tiny hybrid's shape in a dry run)."""
    from flax import nnx

    from radixflow_jax.models.hf_config import parse_hf_config
    from radixflow_jax.models.hybrid import HybridLM
    from radixflow_jax.models.presets import PRESETS
    from radixflow_jax.models.serving_configs import serving_config

    cfg = parse_hf_config(PRESETS["tiny-qwen3.5"]) if dry else serving_config("qwen3.5-4b")
    graphdef, params = nnx.split(HybridLM(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    return cfg, graphdef, params


def _round(rows: int, ctx: int, span: int, page_size: int) -> Any:
    """A round of ``rows`` requests: decode (``span`` 1, context ``ctx``) or fresh prefills of
    ``span`` tokens, each in its own pages and state slot (``1 + r``), prefills checkpointing their
    last token into slot ``1 + rows + r``."""
    from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan

    per = math.ceil(ctx / page_size)
    plan_rows = []
    for r in range(rows):
        pages = tuple(1 + r * per + i for i in range(per))
        if span == 1:
            row = RowPlan(
                request_id=r,
                tokens=(5 + r,),
                start=ctx - 1,
                pages=pages,
                slot=1 + r,
                copy_from=None,
                emits=(),
                sample=True,
            )
        else:
            row = RowPlan(
                request_id=r,
                tokens=tuple(5 + (r + i) % 200 for i in range(span)),
                start=0,
                pages=pages,
                slot=1 + r,
                copy_from=None,
                emits=((span, 1 + rows + r),),
                sample=True,
            )
        plan_rows.append(row)
    return RoundPlan(rows=tuple(plan_rows), num_decode=rows if span == 1 else 0, stats=RoundStats())


def _time_round(cfg: Any, graphdef: Any, params: Any, plan: Any, ctx: int, reps: int) -> float:
    from radixflow_jax.models.batch import init_cache
    from radixflow_jax.runner.inputs import SamplingRow, build_arrays
    from radixflow_jax.runner.shapes import ShapeConfig
    from radixflow_jax.runner.step import make_step, out_rows
    from radixflow_jax.runner.window import variant_for

    ps, rows = 16, len(plan.rows)
    grid = math.lcm(ps, *[c.chunk_size for c in (cfg.gdn, cfg.mamba) if c is not None])
    shapes = ShapeConfig(
        max_num_batched_tokens=max(2048, rows * 32) + 64,
        max_num_seqs=max(rows, 1),
        max_pages_per_row=math.ceil(max(ctx, 2048) / ps),
        grid=grid,
    )
    variant, placement = variant_for(plan, shapes)
    arrays = build_arrays(plan, variant, page_size=ps, max_pages=shapes.max_pages_per_row,
                          sampling={r.request_id: SamplingRow() for r in plan.rows}, decode=placement,
                          num_out=out_rows(shapes)).inputs
    pages = 2 + sum(len(r.pages) for r in plan.rows)
    cache = [init_cache(cfg, num_pages=pages, page_size=ps, num_slots=2 + 2 * rows, dtype=jnp.bfloat16)]
    step = jax.jit(make_step(graphdef, variant.num_decode, out_rows(shapes), mtp=shapes.mtp), donate_argnums=(1,))

    def once() -> Any:
        cache[0], out = step(params, cache[0], arrays)
        return out

    return median_time(once, reps)


def step_rows(table: Table, dry: bool, reps: int, bandwidth: float, rate: float) -> None:
    """Decode at 64 rows, a 2k prefill and a one-row decode (the fixed per-round cost)."""
    from radixflow_jax.models.batch import pool_unit_bytes

    cfg, graphdef, params = _model(dry)
    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    page, slot = pool_unit_bytes(cfg, jnp.bfloat16, 16)
    kv_per_token = page / 16
    rows, ctx, span = (4, 64, 32) if dry else (64, 1024, 32)
    for name, n, c, s in (("decode", rows, ctx, 1), ("prefill", rows, span, span), ("decode_1_row", 1, ctx, 1)):
        t = _time_round(cfg, graphdef, params, _round(n, c, s, 16), c, reps)
        traffic = weights + n * (c * kv_per_token + 2 * slot + (slot if s > 1 else 0))
        floor = max(traffic / bandwidth, (2 * n_params * n * s / rate) if s > 1 else 0.0)
        fields: dict[str, Any] = dict(rows=n, tokens=n * s, s=t, floor_s=floor, of_floor=floor / t)
        if name == "decode_1_row":
            fields["fixed_cost_s"] = t - traffic / bandwidth
        table.row("step", name, **fields)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="the CPU, toy sizes, Pallas in interpret mode")
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    table = Table()
    table.row("smoke", "jax", version=jax.__version__, backend=jax.default_backend(), devices=len(jax.devices()))
    stages = args.stages.split(",")
    bandwidth, rate, failed = 4.8e12, 989e12, 0  # datasheet leads until the ceilings are measured
    for stage in stages:
        try:
            if stage == "ceilings":
                bandwidth, rate = ceilings(table, args.dry_run, args.reps)
            elif stage == "kernels":
                kernels(table, args.dry_run, args.reps, bandwidth)
            elif stage == "step":
                step_rows(table, args.dry_run, args.reps, bandwidth, rate)
            else:
                raise ValueError(f"unknown stage {stage!r}: expected {', '.join(STAGES)}")
        except Exception as exc:  # report and go on: a later stage's rows still count
            failed += 1
            table.row(stage, "FAILED", error=f"{type(exc).__name__}: {exc}"[:500])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
