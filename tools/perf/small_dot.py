"""How fast XLA:CPU multiplies a few rows by many weights: 36 weights of 768 x 2048 f32 (226 MB, twelve
layers' MLP matrices of hybrid-81m's width) by ``M`` rows, in one jitted program, per ``M``.

Prints the median of 15 calls per ``M``, the weights read per second (the floor: about 30 GB/s on the
development machine, ``round_floor.py``) and GFLOP/s. Run it once per ``XLA_FLAGS`` setting to compare
XLA:CPU's matmul paths, e.g. with and without its YNNPACK fusions:

    python tools/perf/small_dot.py
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python tools/perf/small_dot.py
"""

from __future__ import annotations

import os
import statistics as st
import time

import jax
import jax.numpy as jnp

K, N, COUNT = 768, 2048, 36


def main() -> None:
    ws = [jnp.full((K, N), 1.0 + i, jnp.float32) for i in range(COUNT)]
    mb = COUNT * K * N * 4 / 1e6

    @jax.jit
    def run(x: jax.Array, ws: list[jax.Array]) -> jax.Array:
        return sum(jnp.sum(x @ w) for w in ws)

    print("load", os.getloadavg(), "XLA_FLAGS", repr(os.environ.get("XLA_FLAGS", "")))
    for m in (1, 4, 8, 16, 20, 32, 64):
        x = jnp.ones((m, K), jnp.float32)
        run(x, ws).block_until_ready()
        ts = []
        for _ in range(15):
            t = time.perf_counter()
            run(x, ws).block_until_ready()
            ts.append(time.perf_counter() - t)
        s = st.median(ts)
        print(f"M={m:3d}: {1e3 * s:6.1f} ms, weights {mb / s / 1e3:5.1f} GB/s, {2 * m * K * N * COUNT / s / 1e9:6.1f} GFLOP/s")


if __name__ == "__main__":
    main()
