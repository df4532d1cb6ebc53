"""Paged attention of one serving round at the hybrid-81m attention shape (12 query / 2 KV heads of
dim 64, page 16, float32) on the CPU: the native block kernel (``kernels/native``,
``paged_attention_blocks.cc``) against the XLA form (``kernels/fast.paged_attention``), the
reference (``kernels/attention.paged_attention``) and, for decode-only rounds, the native decode
kernel. Every implementation of a case runs interleaved in one process; the table is the median
(and min) of ``--reps`` runs in ms. ``--blocks 8,16,32`` also times those block sizes.

    PYTHONPATH=$PWD python benchmarks/attention_rounds.py [--reps 9] [--blocks 16]

Cases: (a) 8 decode rows then 4 rows x 32 new tokens, all at context 1,500 (a mixed round);
(b) 1 row x 64 tokens at context 64; (c) 2 rows x 256 tokens at 256; (d) 16 decode rows at 1,500.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.kernels import attention, fast, native

HQ, HKV, DIM, PAGE = 12, 2, 64, 16


def _round(rows: list[tuple[int, int]], pad_to: int, seed: int = 0) -> tuple[jax.Array, ...]:
    """``(q, k_pages, v_pages, page_table, cu_seqlens, kv_lens)`` for rows of ``(new tokens,
    context)``, each on its own shuffled pages, the batch padded to ``pad_to`` tokens."""
    rng = np.random.default_rng(seed)
    max_pages = max(-(-ctx // PAGE) for _, ctx in rows) + 2
    pages = 1 + len(rows) * max_pages
    k = rng.standard_normal((pages, PAGE, HKV, DIM), np.float32)
    v = rng.standard_normal((pages, PAGE, HKV, DIM), np.float32)
    table = (1 + rng.permutation(len(rows) * max_pages)).reshape(len(rows), max_pages).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum([n for n, _ in rows])]).astype(np.int32)
    q = rng.standard_normal((pad_to, HQ, DIM), np.float32)
    lens = np.array([ctx for _, ctx in rows], np.int32)
    return tuple(map(jnp.asarray, (q, k, v, table, cu, lens)))


CASES = {
    "(a) 8 decode + 4x32 @1500": ([(1, 1500)] * 8 + [(32, 1500)] * 4, 160),
    "(b) 1x64 @64": ([(64, 64)], 64),
    "(c) 2x256 @256": ([(256, 256)] * 2, 512),
    "(d) 16 decode @1500": ([(1, 1500)] * 16, 16),
}


def _impls(decode_only: bool, blocks: list[int]) -> dict[str, Callable]:
    out: dict[str, Callable] = {}
    for b in blocks:
        out[f"native B={b}"] = functools.partial(native.paged_attention_blocks, block_q=b)
    if decode_only:
        out["native decode"] = native.paged_attention_decode
    out["xla (fast)"] = fast.paged_attention
    out["reference"] = attention.paged_attention
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--blocks", default=str(native.BLOCK_Q))
    args = parser.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    print("load:", os.getloadavg(), "cpus:", os.cpu_count(), "jax", jax.__version__)
    for name, (rows, pad_to) in CASES.items():
        data = _round(rows, pad_to)
        impls = {k: jax.jit(functools.partial(f, scale=DIM**-0.5)) for k, f in _impls(pad_to == len(rows), blocks).items()}
        want = np.asarray(impls["reference"](*data))
        times: dict[str, list[float]] = {k: [] for k in impls}
        for k, f in impls.items():
            np.testing.assert_allclose(np.asarray(f(*data)), want, atol=1e-4, rtol=1e-4)  # and warm
        for _ in range(args.reps):
            for k, f in impls.items():
                start = time.perf_counter()
                jax.block_until_ready(f(*data))
                times[k].append(1e3 * (time.perf_counter() - start))
        print(f"{name}:  " + "  ".join(f"{k} {statistics.median(t):.2f} ({min(t):.2f})" for k, t in times.items()))
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
