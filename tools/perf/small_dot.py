"""How fast a few rows multiply many weights on the CPU: 36 weights of 2048 x 768 f32 (226 MB, twelve
layers' MLP matrices of hybrid-81m's width, in the HF layout ``[out, in]`` that ``Linear`` holds) by
``M`` rows, in one jitted program per ``M`` and path:

  * ``xla``: ``x @ w.T``, XLA:CPU's matmul;
  * ``native``: ``kernels/native/small_matmul.cc`` (what ``ops.linear`` picks for the rows in
    ``native.SMALL_MATMUL_ROWS``).

The two paths alternate call by call (interleaved repeats); it prints the medians of 15 calls each,
the median of the 15 per-pair ratios with its interquartile range, the weights read per second (the
floor: about 30 GB/s on the development machine, ``round_floor.py``) and the largest difference
between the two results. Run it once per ``XLA_FLAGS`` setting to compare XLA:CPU's matmul paths,
e.g. with and without its YNNPACK fusions:

    python tools/perf/small_dot.py
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python tools/perf/small_dot.py
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import time

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.kernels import native

K, N, COUNT = 768, 2048, 36


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16,20,32,40,48,64,96", help="the row counts M, comma-separated")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.standard_normal((N, K)), jnp.float32) for _ in range(COUNT)]
    mb = COUNT * K * N * 4 / 1e6
    paths = {
        "xla": jax.jit(lambda x, ws: sum(jnp.sum(x @ w.T) for w in ws)),
        "native": jax.jit(lambda x, ws: sum(jnp.sum(native.small_matmul(x, w)) for w in ws)),
    }
    x = jnp.asarray(rng.standard_normal((5, K)), jnp.float32)
    err = float(jnp.max(jnp.abs(jax.jit(native.small_matmul)(x, ws[0]) - x @ ws[0].T)))
    print("load", os.getloadavg(), "XLA_FLAGS", repr(os.environ.get("XLA_FLAGS", "")), f"max |native - xla| {err:.1e}")
    for m in (int(r) for r in args.rows.split(",")):
        x = jnp.asarray(rng.standard_normal((m, K)), jnp.float32)
        ts: dict[str, list[float]] = {name: [] for name in paths}
        for run in paths.values():
            run(x, ws).block_until_ready()
        for _ in range(15):
            for name, run in paths.items():
                t = time.perf_counter()
                run(x, ws).block_until_ready()
                ts[name].append(time.perf_counter() - t)
        s = {name: st.median(v) for name, v in ts.items()}
        cols = ", ".join(f"{name} {1e3 * v:6.1f} ms ({mb / v / 1e3:4.1f} GB/s)" for name, v in s.items())
        ratios = sorted(n / x for n, x in zip(ts["native"], ts["xla"]))  # per interleaved pair of calls
        q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        print(f"M={m:3d}: {cols}; native/xla {st.median(ratios):.2f} (IQR {q1:.2f}-{q3:.2f})", flush=True)
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
