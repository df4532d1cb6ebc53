"""One round of ``--rows`` decoding rows (of ``--context``-token prompts) joined by a ``--prompt``-token prompt, on hybrid-81m's f32 GGUF
file (``--model``: any), in both mixed layouts (``runner/shapes.py``): ``window`` (the decoding rows
in a decode region) and ``packed`` (every row in the prefill region).

Each layout's engine (16 rows / 512 tokens, the server's shape, prefix cache off) runs the same
requests; the step inputs of the round the prompt joined are captured and that variant's compiled
program is called on them, the two layouts alternating call by call (``--calls`` each after 2
untimed). Prints each variant, its median and minimum wall time, and whether the two engines'
greedy outputs are equal.

    python tools/perf/mixed_layout.py [--rows 6] [--prompt 40] [--calls 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import unittest.mock
from typing import Any

import numpy as np

from radixflow_jax.engine.build import enable_compilation_cache
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.paths import cache_root


def capture(model: str, layout: str, rows: int, prompt: int, context: int) -> tuple[Any, Any, Any, Any, list[tuple[int, ...]]]:
    """``(variant, program, inputs, executor, outputs)`` of the round in which the prompt joined."""
    import jax

    from radixflow_jax.llm import LLM
    from radixflow_jax.runner.step import CompiledStep

    llm = LLM(model, max_num_seqs=16, max_num_batched_tokens=512, policy="no-cache", mixed_layout=layout)
    eng, rng = llm.engine, np.random.default_rng(0)
    captured: dict[Any, Any] = {}
    call = CompiledStep.__call__

    def spy(self: Any, variant: Any, params: Any, cache: Any, inputs: Any) -> Any:
        captured.pop(variant, None)  # the latest inputs of each variant, in order of last use
        captured[variant] = jax.tree_util.tree_map(np.asarray, inputs)
        return call(self, variant, params, cache, inputs)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(x) for x in rng.integers(3, 500, n))

    with unittest.mock.patch.object(CompiledStep, "__call__", spy):
        rids = [eng.add_request(ids(context), SamplingParams(max_tokens=30, ignore_eos=True)) for _ in range(rows)]
        for _ in range(4):
            eng.step()
        rids.append(eng.add_request(ids(prompt), SamplingParams(max_tokens=3, ignore_eos=True)))
        eng.run_until_done()
    joined = [v for v in captured if v.prefill_tokens >= prompt][-1]
    ex = eng.executor
    outputs = [tuple(eng.output(r).token_ids) for r in rids]
    return joined, ex.step._compiled[joined], jax.tree_util.tree_map(jax.device_put, captured[joined]), ex, outputs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(cache_root(), "vs-llamacpp", "hybrid-81m-f32.gguf"))
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--prompt", type=int, default=40)
    p.add_argument("--calls", type=int, default=9)
    p.add_argument("--context", type=int, default=8, help="the decoding rows' prompt length")
    args = p.parse_args()
    enable_compilation_cache(os.path.join(cache_root(), "xla-cache-vs-llamacpp"))
    import jax

    arms = {layout: capture(args.model, layout, args.rows, args.prompt, args.context) for layout in ("window", "packed")}
    caches = {layout: arm[3].cache for layout, arm in arms.items()}
    times: dict[str, list[float]] = {layout: [] for layout in arms}
    for i in range(2 + args.calls):
        for layout, (_, program, inputs, ex, _) in arms.items():
            t = time.perf_counter()
            caches[layout], out = program(ex.model.params, caches[layout], inputs)
            jax.block_until_ready(out)
            if i >= 2:
                times[layout].append(time.perf_counter() - t)
    print(f"{args.rows} decoding rows (context {args.context}) + a {args.prompt}-token prompt; load {os.getloadavg()[0]:.2f}; outputs equal: "
          f"{arms['window'][4] == arms['packed'][4]}")  # fmt: skip
    for layout, ts in times.items():
        v = arms[layout][0]
        print(f"  {layout:6s} T={v.num_tokens:3d} R={v.num_rows:2d} D={v.num_decode:2d}: "
              f"median {1e3 * statistics.median(ts):6.1f} ms, min {1e3 * min(ts):6.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
