"""The reliability soak (issue 16): 100k requests with random aborts and failed steps through the
shadow executor, invariants audited after every round, every completed greedy output checked
against the cold run; or a shorter one through the model executor (``--executor model``).
``test_soak_full.py`` runs both as ``heavy`` tests; this module also runs alone, with its flags:

    python -m pytest -m heavy tests/heavy/test_soak_full.py       # 100k shadow requests per policy, 60 model
    python -m tests.heavy.soak                                  # 100k requests, radixflow, native and pair
    python -m tests.heavy.soak --requests 5000 --policies radixflow --json soak.json
    python -m tests.heavy.soak --executor model --requests 60  # tiny-qwen3.5, the real step on the CPU

Prints one JSON report per policy: requests, completed, aborted, errors, rounds, failed steps and
pool rebuilds, preemptions, consumer waits, invariant audits, checkpoint reads checked, rows checked
by the shadow executor, reuse, leaked pages and slots (0), wall time. Exits 1 on the first violation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import sys
import time


def model_soak(requests: int, policy: str, seed: int, abort_rate: float = 0.15) -> dict:
    """The shorter soak on the model executor: aborts (between rounds and mid-round), a failed step
    every ~15 rounds (every kind), audits before and after every round, outputs equal the cold run."""
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.reliability.faults import FAULT_KINDS, Fault, FaultyExecutor
    from radixflow_jax.reliability.harness import Harness
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.engine.params import SamplingParams
    from radixflow_jax.engine.build import assemble_engine
    from radixflow_jax.models import load

    rng = random.Random(seed)
    config = EngineConfig.from_options(
        max_num_seqs=4, max_num_batched_tokens=128, page_size=16, max_model_len=512, policy=policy,
        num_kv_pages=48, num_state_slots=24, warmup=False, step_retries=2,
    )  # fmt: skip
    base = build_engine(load("tiny-qwen3.5"), config)
    articles = [[rng.randrange(3, 500) for _ in range(rng.randint(40, 200))] for _ in range(4)]
    work = []
    for i in range(requests):
        prompt = rng.choice(articles) + [rng.randrange(3, 500) for _ in range(rng.randint(2, 20))]
        abort = (i // 2 + rng.randrange(0, 8), rng.random() < 0.5) if rng.random() < abort_rate else (None, False)
        work.append((prompt, SamplingParams(max_tokens=rng.randint(1, 8), ignore_eos=True), i // 2, abort))

    def run(options: dict, faults: tuple) -> tuple:
        spec = dataclasses.replace(base.spec, config=config.with_options(**options), tokenizer=None)
        base.executor.reset()
        core = assemble_engine(spec, lambda shapes: FaultyExecutor(base.executor, faults))
        h = Harness(core)
        for prompt, params, at, (abort_at, mid) in work:
            h.submit(prompt, params, at_round=at, abort_at=abort_at if faults else None, mid_round=mid)
        return h, h.run()

    start = time.perf_counter()
    _, cold = run({"policy": "no-cache", "num_kv_pages": None}, ())
    faults = tuple(Fault(r, rng.choice(FAULT_KINDS)) for r in range(5, 40 * requests, 15))
    h, warm = run({}, faults)
    for key, tokens in warm.completed().items():
        if tokens != cold.outputs[key].token_ids:
            raise AssertionError(f"request {key}: {tokens} != cold {cold.outputs[key].token_ids}")
    reasons = warm.by_reason()
    mem = h.core.scheduler.memory  # Harness.run flushed it after the last request
    outs = list(warm.outputs.values())
    return {
        "executor": "model (tiny-qwen3.5)", "policy": policy, "requests": requests, "completed": reasons["length"],
        "aborted": reasons["abort"], "errors": reasons["error"], "outputs_equal_cold": len(warm.completed()),
        "rounds": warm.rounds, "failed_steps": warm.step_failures, "pool_rebuilds": warm.resets,
        "preemptions": warm.preemptions, "invariant_audits": warm.audits,
        "checkpoint_reads_checked": h.checkpoint_reads,
        "reuse": sum(o.cached_tokens for o in outs) / sum(o.prompt_tokens for o in outs),
        "leaked_pages": mem.pages.num_used, "leaked_slots": mem.slots.num_used, "wall_s": time.perf_counter() - start,
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--executor", choices=("shadow", "model"), default="shadow")
    p.add_argument("--requests", type=int, default=None, help="default 100000 (shadow) / 60 (model)")
    p.add_argument("--policies", default="radixflow,native,pair")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--abort-rate", type=float, default=None, help="share of requests aborted (default 0.1 shadow, 0.15 model)")
    p.add_argument("--fault-rate", type=float, default=None, help="shadow: share of rounds whose step fails (default 0.002)")
    p.add_argument("--json", default=None, help="write the reports here")
    args = p.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # failed steps are expected: the report counts them
    from radixflow_jax.reliability.soak import SoakConfig, run_soak

    reports = []
    for policy in args.policies.split(","):
        if args.executor == "model":
            if args.fault_rate is not None:
                p.error("--fault-rate applies to the shadow executor (the model soak fails every 15th round)")
            report = model_soak(args.requests or 60, policy, args.seed, 0.15 if args.abort_rate is None else args.abort_rate)
        else:
            cfg = SoakConfig(requests=args.requests or 100_000, policy=policy, seed=args.seed,
                             abort_rate=0.1 if args.abort_rate is None else args.abort_rate,
                             fault_rate=0.002 if args.fault_rate is None else args.fault_rate)  # fmt: skip
            report = run_soak(cfg)
        print(json.dumps(report), flush=True)
        reports.append(report)
        if report["leaked_pages"] or report["leaked_slots"]:
            print(f"leaked pages/slots after the flush: {report['leaked_pages']}/{report['leaked_slots']}", file=sys.stderr)
            return 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
