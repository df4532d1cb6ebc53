"""The cost of structured outputs on a round, side by side in one run: the same decode workload
(``--requests`` requests of ``--tokens`` tokens each, greedy) with no constrained row, with one,
and with all of them constrained (a regex that any lowercase text matches, so outputs last as
long as unconstrained ones, though EOS is allowed there and may end one early). Reports committed
rounds, mean wall time per round (the comparable figure) and tokens/s.

The constrained figure includes both parts of the cost: the host's matcher work (mask computed
when the row is planned, advance on commit, the ``[rows, ceil(V/32)]`` mask copied to the device)
and the lost overlap (a round that sampled a constrained row commits before the next is planned).
A benchmark, not a test: ``python benchmarks/grammar_cost.py --model tiny-qwen3.5``.
"""

from __future__ import annotations

import argparse
import time

from radixflow_jax import LLM, SamplingParams


def _run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[int, float, int]:
    """(rounds, seconds, generated tokens) of one generate call."""
    start_rounds = llm.engine.num_rounds
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    return llm.engine.num_rounds - start_rounds, time.perf_counter() - t, sum(len(o.token_ids) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3.5")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(
        args.model, max_num_seqs=args.requests, max_num_batched_tokens=256, bucket_mode="fixed", policy="no-cache"
    )
    prompts = [[5 + i, 6, 7, 8, 9, 10 + i] for i in range(args.requests)]
    plain = SamplingParams(max_tokens=args.tokens, ignore_eos=True)
    grammar = SamplingParams(max_tokens=args.tokens, ignore_eos=True, structured_outputs={"regex": "[a-z ]*"})
    cases = {"none": [plain] * args.requests, "one": [grammar] + [plain] * (args.requests - 1),
             "all": [grammar] * args.requests}  # fmt: skip
    _run(llm, prompts, cases["one"])  # warm-up: compiles the variants, builds the grammar tokenizer
    results: dict[str, list[tuple[int, float, int]]] = {k: [] for k in cases}
    for _ in range(args.repeats):  # interleaved, so drift hits every case alike
        for name, params in cases.items():
            results[name].append(_run(llm, prompts, params))
    print(f"{args.model}: {args.requests} requests x {args.tokens} tokens, {args.repeats} repeats (medians)")
    print(f"{'constrained':>12} {'rounds':>7} {'ms/round':>9} {'tokens/s':>9}")
    for name, runs in results.items():
        runs.sort(key=lambda r: r[1])
        rounds, secs, toks = runs[len(runs) // 2]
        print(f"{name:>12} {rounds:>7} {1000 * secs / max(rounds, 1):>9.2f} {toks / secs:>9.1f}")


if __name__ == "__main__":
    main()
