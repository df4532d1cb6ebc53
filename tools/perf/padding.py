"""Padding per bucket scheme, without running a model: the workload of ``benchmarks/vs_transformers.py``
goes through the real scheduler with an executor that only selects step variants (EOS ignored, so
the plan does not depend on sampled ids), once per bucket scheme.

Per scheme it prints the distinct variants the workload needs and, per round kind, the fraction of
token slots that are padding, plus the *chunk-equivalent* padding of the recurrent layers: the
chunked scan computes ``ceil(prefill tokens / 64) + prefill rows`` chunks of 64 slots, so a decode
row sent through the scan costs a whole chunk. ``pow2-no-decode-region`` is the scheme before
issue 10 (powers of two; every round with a prefill row sends all rows through the scan).

    python tools/perf/padding.py [--no-prefix-cache] [--requests 64] [--max-batched-tokens 1024]
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from typing import Mapping


from radixflow_jax.bench.args import add_workload_args, workload_from_args
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.engine.protocol import ExecutorCapabilities, StepResult
from radixflow_jax.runner.inputs import SamplingRow
from radixflow_jax.runner.shapes import ShapeConfig, Variant
from radixflow_jax.runner.window import variant_for
from radixflow_jax.scheduler.plan import RoundPlan

CHUNK = 64


class Selector:
    """Selects a variant per round (``old``: mixed rounds without a decode region) and counts slots."""

    capabilities = ExecutorCapabilities()

    def __init__(self, shapes: ShapeConfig, old: bool):
        self.shapes, self.old = shapes, old
        self.variants: set[Variant] = set()
        self.by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])

    def execute(self, plan: RoundPlan, sampling: Mapping[int, SamplingRow]) -> StepResult:
        rows, d = len(plan.rows), plan.num_decode
        if self.old and d != rows:  # the scheme before the decode region
            v = self.shapes.select(plan.num_tokens, rows, num_decode=0)
        else:  # what the model executor selects (the decode window, runner/window.py)
            v, _ = variant_for(plan, self.shapes)
        self.variants.add(v)
        kind = "decode" if d == rows else ("mixed" if d else "prefill")
        chunks = math.ceil(v.prefill_tokens / CHUNK) + v.prefill_rows if v.prefill_rows else 0
        e = self.by_kind[kind]
        e[0] += 1
        e[1] += plan.num_tokens
        e[2] += v.num_tokens
        e[3] += plan.num_tokens
        e[4] += chunks * CHUNK + v.num_decode
        return StepResult({r.request_id: 1 for r in plan.rows if r.sample}, v.num_tokens, v.num_rows, 0.0, 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_workload_args(p)  # the vs_transformers workload: 64 requests over 8 prefixes of 256 + 32 ids
    p.add_argument("--max-batched-tokens", type=int, default=1024)
    p.add_argument("--no-prefix-cache", action="store_true")
    args = p.parse_args()
    prompts = workload_from_args(args).prompts(4096)
    seqs, page, max_len = min(args.requests, 64), 16, args.prefix_len + args.suffix_len + args.output_len
    config = EngineConfig.from_options(
        max_num_seqs=seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        page_size=page,
        policy="no-cache" if args.no_prefix_cache else "radixflow",
    )
    from radixflow_jax.engine.params import SamplingParams

    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    print(f"{'scheme':24s} {'variants':>8s}  per round kind: rounds, token-slot padding, chunk-equivalent padding")
    for name, mode, old in [("pow2-no-decode-region", "pow2", True), ("pow2", "pow2", False), ("fine", "fine", False),
                            ("fixed", "fixed", False)]:  # fmt: skip
        shapes = ShapeConfig(
            max_num_batched_tokens=args.max_batched_tokens,
            max_num_seqs=seqs,
            max_pages_per_row=math.ceil(max_len / page),
            grid=CHUNK,
            mode=mode,
        )
        sel = Selector(shapes, old)
        pages = 1 + 2 * seqs * math.ceil(max_len / page)
        spec = EngineSpec(
            config=config,
            hybrid=True,
            chunk_sizes=(CHUNK,),
            num_pages=pages,
            num_slots=1 + seqs + max(64, 8 * seqs),
            max_model_len=max_len,
        )
        core = EngineCore(sel, spec)
        for ids in prompts:
            core.add_request(ids, params)
        core.run_until_done()
        parts = []
        for kind, (n, real, slots, real_eq, slot_eq) in sorted(sel.by_kind.items()):
            parts.append(f"{kind} {n}x {100 * (1 - real / slots):.0f}% / {100 * (1 - real_eq / max(slot_eq, 1)):.0f}%")
        tot = [sum(e[i] for e in sel.by_kind.values()) for i in range(5)]
        parts.append(f"all {100 * (1 - tot[1] / tot[2]):.0f}% / {100 * (1 - tot[3] / tot[4]):.0f}%")
        print(f"{name:24s} {len(sel.variants):8d}  " + ", ".join(parts))


if __name__ == "__main__":
    main()
