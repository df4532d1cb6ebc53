"""What do riders buy ``n > 1``? The same ``n``-sample requests with riders on and off.

Riders (``scheduler/riders.py``): the samples of one prompt ride the round that completes it and
compute none of it; without them each further sample hits the prompt's deepest grid checkpoint and
computes the rest (up to one grid step). Both engines run on one loaded model (shared compiled
step variants, compiled by two untimed runs each; a timed run that compiled says so), with the
prefix cache reset before every run, in alternating order. Printed per run and as medians with the
per-run ratio's range: prompt tokens computed (all computed tokens minus the generated tokens'
decode rows), all tokens, rounds, and the wall time of the ``generate`` call; wall times compare
only repeats in which neither side compiled a step variant (policy pair's fill rule reads measured
round times, so plans and the variants they need vary between runs). Outputs are checked equal
between the two (seeded samples do not depend on riders).

    python tools/perf/riders.py --model tiny-qwen3.5 --prompts 8 --n 8 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from radixflow_jax import LLM, SamplingParams


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> dict[str, float]:
    llm.reset_prefix_cache()
    before = len(llm.engine.records)
    compiles = llm.engine.executor.step.num_compiles
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - start
    rounds = llm.engine.records[before:]
    computed = sum(r.num_tokens for r in rounds)
    generated = sum(len(s.token_ids) for o in outs for s in (o.samples or [o]))
    samples = [s for o in outs for s in (o.samples or [o])]
    return {"computed": computed, "prompt_computed": computed - (generated - len(samples)), "rounds": len(rounds),
            "wall_s": wall, "outputs": [tuple(s.token_ids) for s in samples],
            "compiles": llm.engine.executor.step.num_compiles - compiles}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen3.5")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=421, help="tokens per prompt (not a grid multiple by default)")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 500, args.prompt_len)] for _ in range(args.prompts)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=7, n=args.n, ignore_eos=True)
    opts = dict(max_num_seqs=32, max_num_batched_tokens=512)
    engines = {"riders": LLM(args.model, riders=True, **opts)}
    engines["no riders"] = LLM(engines["riders"].model, riders=False, **opts)  # shares the compiled variants
    for _ in range(2):  # compile what the workload uses before any clock runs (a run with compiles says so)
        for llm in engines.values():
            run(llm, prompts, params)
    print(f"load average {os.getloadavg()}; {args.prompts} prompts x {args.prompt_len} tokens, n={args.n}, "
          f"{args.max_tokens} output tokens each")  # fmt: skip
    rows: dict[str, list[dict]] = {k: [] for k in engines}
    for rep in range(args.repeats):
        order = list(engines) if rep % 2 == 0 else list(reversed(engines))
        for name in order:
            r = run(engines[name], prompts, params)
            rows[name].append(r)
            print(f"  run {rep} {name:9s} load {os.getloadavg()[0]:4.2f}  prompt tokens computed {r['prompt_computed']:6d}  "
                  f"all tokens {r['computed']:6d}  rounds {r['rounds']:4d}  wall {r['wall_s']:6.2f} s  compiles {r['compiles']}")  # fmt: skip
    same = all(a["outputs"] == b["outputs"] for a, b in zip(rows["riders"], rows["no riders"]))
    print(f"outputs equal with and without riders: {same}")
    clean = [(a, b) for a, b in zip(rows["riders"], rows["no riders"]) if not a["compiles"] and not b["compiles"]]
    for key in ("prompt_computed", "computed", "rounds", "wall_s"):
        pairs = clean if key == "wall_s" else list(zip(rows["riders"], rows["no riders"]))
        if not pairs:
            print(f"{key}: every repeat compiled on one side; no clean pair to compare")
            continue
        on = statistics.median(a[key] for a, _ in pairs)
        off = statistics.median(b[key] for _, b in pairs)
        ratios = [a[key] / b[key] for a, b in pairs]
        print(f"median {key:16s} riders {on:10.2f}  no riders {off:10.2f}  per-run ratio median "
              f"{statistics.median(ratios):5.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}; {len(pairs)} pairs)")  # fmt: skip


if __name__ == "__main__":
    main()
