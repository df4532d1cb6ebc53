"""Whether another weight layout speeds up a round's MLPs on the CPU: twelve SwiGLU MLPs of hybrid-81m's
width (hidden 768, intermediate 2048, f32, chained as residual layers) over ``M`` rows, as

  * ``sep``: ``x @ w.T`` per weight in the HF layout ``[out, in]`` (what ``Linear`` does above the
    native kernel's rows);
  * ``fused``: gate and up as one ``[2I, H]`` weight (one matmul, then split);
  * ``T-sep`` / ``T-fused``: the same with the weights stored transposed (``x @ w``);
  * ``native``: ``kernels/native/small_matmul.cc`` for every weight.

The paths alternate call by call (9 calls each after one untimed); medians in ms, and ``sep``'s
GFLOP/s. ``MS=16,64 python tools/perf/mlp_layouts.py`` picks the row counts.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.kernels import native

H, I, L = 768, 2048, 12


def swiglu(h: jax.Array) -> jax.Array:
    return jax.nn.silu(h[:, :I]) * h[:, I:]


def sep(x: jax.Array, g: list, u: list, d: list) -> jax.Array:
    for a, b, c in zip(g, u, d):
        x = x + (jax.nn.silu(x @ a.T) * (x @ b.T)) @ c.T
    return x


def fused(x: jax.Array, gu: list, d: list) -> jax.Array:
    for a, c in zip(gu, d):
        x = x + swiglu(x @ a.T) @ c.T
    return x


def t_sep(x: jax.Array, g: list, u: list, d: list) -> jax.Array:
    for a, b, c in zip(g, u, d):
        x = x + (jax.nn.silu(x @ a) * (x @ b)) @ c
    return x


def t_fused(x: jax.Array, gu: list, d: list) -> jax.Array:
    for a, c in zip(gu, d):
        x = x + swiglu(x @ a) @ c
    return x


def nat(x: jax.Array, g: list, u: list, d: list) -> jax.Array:
    mm = native.small_matmul
    for a, b, c in zip(g, u, d):
        x = x + mm(jax.nn.silu(mm(x, a)) * mm(x, b), c)
    return x


def main() -> None:
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape) * 0.02, jnp.float32)

    g, u, d = [weight(I, H) for _ in range(L)], [weight(I, H) for _ in range(L)], [weight(H, I) for _ in range(L)]
    gu = [jnp.concatenate([a, b], 0) for a, b in zip(g, u)]
    tr = [[w.T.copy() for w in ws] for ws in (g, u, d, gu)]
    paths: dict[str, tuple[Callable, tuple]] = {
        "sep": (jax.jit(sep), (g, u, d)), "fused": (jax.jit(fused), (gu, d)),
        "T-sep": (jax.jit(t_sep), tuple(tr[:3])), "T-fused": (jax.jit(t_fused), (tr[3], tr[2])),
        "native": (jax.jit(nat), (g, u, d)),
    }  # fmt: skip
    print("load", os.getloadavg(), os.environ.get("XLA_FLAGS", ""))
    for m in [int(v) for v in os.environ.get("MS", "16,32,48,64,96").split(",")]:
        x = weight(m, H) * 50
        ref = paths["sep"][0](x, *paths["sep"][1])
        ts: dict[str, list[float]] = {k: [] for k in paths}
        for k, (fn, args) in paths.items():
            err = float(jnp.max(jnp.abs(fn(x, *args) - ref)))
            if err > 1e-3:
                print(k, "differs from sep by", err)
        for _ in range(9):
            for k, (fn, args) in paths.items():
                t = time.perf_counter()
                fn(x, *args).block_until_ready()
                ts[k].append(time.perf_counter() - t)
        s = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
        cols = "  ".join(f"{k} {v:6.1f}" for k, v in s.items())
        print(f"M={m:3d} {cols}   GFLOP/s sep {m * H * I * 6 * L / s['sep'] / 1e6:.0f}", flush=True)
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
