"""Times the CPU kernels of ``kernels/fast.py`` in this tree against the same file at a git revision,
interleaved rep by rep in one process (a load change on the shared machine hits both alike).

What is timed (the vs_transformers model's layer sizes: Gated DeltaNet 4 key / 8 value heads of 64,
attention 8 query / 2 KV heads of 64, page size 16, float32):

* ``gated_delta_chunked`` on ``ROWSxTOKENS`` packed prefill rows (``--gdn``; default ``32x32`` (a
  mixed round's 32-token suffixes), ``4x256`` (prefix rows), ``64x16``, ``20x52``), with a
  ``pair_chunk`` of all -1 as the engine passes it;
* ``paged_attention`` on ``ROWSxTOKENSxPREFIX`` prefill rows that continue a cached prefix
  (``--attention``; default ``32x32x256``, ``4x256x0``, ``20x48x256``).

Outputs of both revisions are checked equal (atol 2e-4) before timing. Medians of ``--reps`` calls
in ms, with min-max, and the ratio old / new.

    python tools/perf/fast_vs_rev.py --rev HEAD~1
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.kernels import fast


def load_rev(rev: str) -> ModuleType:
    """``radixflow_jax/kernels/fast.py`` as of git revision ``rev``, imported as its own module."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = subprocess.run(
        ["git", "show", f"{rev}:radixflow_jax/kernels/fast.py"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    path = os.path.join(tempfile.mkdtemp(), "fast_at_rev.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("fast_at_rev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gdn_inputs(rows: int, per: int, seed: int = 0) -> tuple[jax.Array, ...]:
    t, h, hk, d = rows * per, 8, 4, 64
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, t, hk, d))
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    f = lambda a: jnp.asarray(np.asarray(a, np.float32))  # noqa: E731
    return (
        f(q), f(k), f(rng.normal(size=(t, h, d))), f(-np.abs(rng.normal(size=(t, h))) * 0.1),
        f(1 / (1 + np.exp(-rng.normal(size=(t, h))))), jnp.asarray(np.arange(rows + 1) * per, jnp.int32),
        f(rng.normal(size=(rows, h, d, d)) * 0.1),
    )  # fmt: skip


def attention_inputs(rows: int, per: int, prefix: int, seed: int = 0) -> tuple[jax.Array, ...]:
    page, hkv, d = 16, 2, 64
    rng = np.random.default_rng(seed)
    ctx = prefix + per
    per_row = -(-ctx // page)
    pages = rows * per_row + 1
    table = np.zeros((rows, per_row + 1), np.int32)
    for r in range(rows):
        table[r, :per_row] = 1 + r * per_row + np.arange(per_row)
    f = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32))  # noqa: E731
    return (
        f(rows * per, 8, d), f(pages, page, hkv, d), f(pages, page, hkv, d), jnp.asarray(table),
        jnp.asarray(np.arange(rows + 1) * per, jnp.int32), jnp.full((rows,), ctx, jnp.int32),
    )  # fmt: skip


def compare(name: str, fns: dict[str, Callable[[], object]], reps: int) -> None:
    outs = {k: jax.tree.leaves(fn()) for k, fn in fns.items()}
    # the outputs and final states; unused chunk states are placeholders that may differ
    for a, b in list(zip(*outs.values()))[:2]:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-4, rtol=0)
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(fn())
            times[k].append((time.perf_counter() - t) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    spans = "  ".join(f"{k} {med[k]:7.2f} ({min(v):.1f}-{max(v):.1f})" for k, v in times.items())
    print(f"{name:34s} {spans}  old/new {med['old'] / med['new']:.2f}x", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rev", default="HEAD~1", help="git revision of the old kernels/fast.py")
    p.add_argument("--gdn", default="32x32,4x256,64x16,20x52", help="ROWSxTOKENS cases ('' for none)")
    p.add_argument("--attention", default="32x32x256,4x256x0,20x48x256", help="ROWSxTOKENSxPREFIX cases")
    p.add_argument("--reps", type=int, default=21)
    args = p.parse_args(argv)
    old = load_rev(args.rev)
    print(f"kernels/fast.py: this tree (new) against {args.rev} (old); load average {os.getloadavg()[0]:.2f}")
    for case in filter(None, args.gdn.split(",")):
        rows, per = map(int, case.split("x"))
        a = gdn_inputs(rows, per)
        pair = jnp.full((rows,), -1, jnp.int32)
        forms = (("old", old), ("new", fast))
        fns = {k: jax.jit(functools.partial(m.gated_delta_chunked, pair_chunk=pair)) for k, m in forms}
        compare(f"gated_delta_chunked {case}", {k: functools.partial(f, *a) for k, f in fns.items()}, args.reps)
    for case in filter(None, args.attention.split(",")):
        rows, per, prefix = map(int, case.split("x"))
        a = attention_inputs(rows, per, prefix)
        fns = {k: jax.jit(functools.partial(m.paged_attention, scale=0.125)) for k, m in (("old", old), ("new", fast))}
        compare(f"paged_attention {case}", {k: functools.partial(f, *a) for k, f in fns.items()}, args.reps)
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
