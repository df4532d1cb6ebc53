"""Where a small served round's time goes, op by op: a decode round of ``--rows`` rows and the mixed round
in which a ``--prompt``-token request joins them, on hybrid-81m's f32 GGUF file (``--model``: any).

The rounds are captured from the engine (16 rows / 512 tokens, ``--policy``, default prefix cache off)
as they run, then each captured variant's own compiled program is called on its captured inputs under
``jax.profiler.trace`` (``--calls`` calls after 3 untimed ones) and summarised as
``round_profile.py`` does: op time by kind, the weight matmuls with their GFLOP/s, and how busy
each runtime thread was in the median call (on 2 cores: whether the matmuls use both).

    python tools/perf/served_round_profile.py [--rows 4] [--prompt 16] [--calls 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import unittest.mock
from typing import Any

import numpy as np

from radixflow_jax.engine.build import enable_compilation_cache
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.paths import cache_root

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import round_profile  # noqa: E402  (the summary of a trace: tools/perf/round_profile.py)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(cache_root(), "vs-llamacpp", "hybrid-81m-f32.gguf"))
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--policy", default="no-cache", help="the engine's policy (the server's default: pair)")
    args = p.parse_args()
    enable_compilation_cache(os.path.join(cache_root(), "xla-cache-vs-llamacpp"))
    import jax

    from radixflow_jax.llm import LLM
    from radixflow_jax.runner.step import CompiledStep

    llm = LLM(args.model, max_num_seqs=16, max_num_batched_tokens=512, policy=args.policy)
    eng, rng = llm.engine, np.random.default_rng(0)
    captured: dict[Any, Any] = {}
    call = CompiledStep.__call__

    def spy(self: Any, variant: Any, params: Any, cache: Any, inputs: Any) -> Any:
        captured.setdefault(variant, jax.tree_util.tree_map(np.asarray, inputs))
        return call(self, variant, params, cache, inputs)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(x) for x in rng.integers(3, 500, n))

    with unittest.mock.patch.object(CompiledStep, "__call__", spy):
        for _ in range(args.rows):
            eng.add_request(ids(8), SamplingParams(max_tokens=30, ignore_eos=True))
        for _ in range(4):
            eng.step()
        eng.add_request(ids(args.prompt), SamplingParams(max_tokens=1, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()
    ex = eng.executor
    # the decode round of --rows rows and the round the prompt joins: a decode region (a bucket) and
    # one prefill row, or (the packed mixed layout) every row in the prefill region
    wanted = [v for v in captured if (v.kind == "decode" and v.num_decode >= args.rows) or
              (v.kind == "mixed" and v.prefill_rows == 1 and v.prefill_tokens >= args.prompt) or
              (v.kind == "prefill" and v.prefill_tokens >= args.prompt + args.rows)]  # fmt: skip
    for variant in sorted(wanted, key=lambda v: v.num_tokens):
        program = ex.step._compiled[variant]
        inputs = jax.tree_util.tree_map(jax.device_put, captured[variant])
        cache, params, out = ex.cache, ex.model.params, None
        for _ in range(3):
            cache, out = program(params, cache, inputs)
        jax.block_until_ready(out)
        trace_dir = tempfile.mkdtemp(prefix="rfj-served-")
        load = os.getloadavg()
        with jax.profiler.trace(trace_dir):
            for _ in range(args.calls):
                cache, out = program(params, cache, inputs)
            jax.block_until_ready(out)
        ex.cache = cache
        print(f"\n===== {variant}, load average {load[0]:.2f}")
        round_profile.summarize(trace_dir, program.as_text(), args.calls, args.top)


if __name__ == "__main__":
    main()
