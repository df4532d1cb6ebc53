"""Speculative decoding's verify mechanism on a model whose outputs no n-gram lookup guesses (a
random-weight hybrid): drafts from an *oracle* (``radixflow_jax/bench/oracle.py``), the plain run's own continuation
with one token altered in rows whose length is a multiple of ``--reject-every``, so drafts are
accepted whole, in part and not at all on a fixed pattern.

Side by side in one process, interleaved repeats: plain decoding against speculation with the
oracle's drafts; prints output tok/s of each arm, their ratio (median, range), the acceptance,
each arm's rounds and tokens fed per run (deterministic) and the median step time of the rounds
with verify rows. Runs against whichever ``radixflow_jax``
is on ``PYTHONPATH``, so two checkouts can be compared run for run (the oracle patches
``scheduler/running.ngram_draft``, which both sides have).

``python tools/perf/spec_oracle.py --model ~/.cache/radixflow/models/hybrid-81m``
"""

from __future__ import annotations

import argparse
import statistics

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.bench.codeedit import chat_prompts, interleaved, rate_ratio, run_batches
from radixflow_jax.bench.oracle import oracle_drafter
from radixflow_jax.scheduler import running


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-draft", type=int, default=4)
    ap.add_argument("--reject-every", type=int, default=2)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    options = dict(max_num_seqs=8, max_num_batched_tokens=512)
    plain = LLM(args.model, **options)
    work = chat_prompts(plain, args.prompts)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    truth = run_batches(plain, work, params, 8)[2]
    vocab = plain.replicas.engines[0].vocab_size
    running.ngram_draft = oracle_drafter([tuple(p) + o for p, o in zip(work, truth)], vocab, args.reject_every)
    arms = {"plain": plain, "spec": LLM(args.model, speculative={"num_draft": args.num_draft}, **options)}
    sizes = [int(b) for b in args.batches.split(",")]
    results, load, after = interleaved(arms, work, params, sizes, repeats=args.repeats)
    print(f"{args.model}: {len(work)} prompts, {args.max_tokens} tokens each, num_draft {args.num_draft}, oracle "
          f"drafts altered where the length is a multiple of {args.reject_every}; {args.repeats} repeats; load "
          f"{load:.2f} before, {after:.2f} after")  # fmt: skip
    for size in sizes:
        spec_rate, plain_rate, ratio = rate_ratio(results[("spec", size)], results[("plain", size)])
        equal = all(r[2] == truth for a in arms for r in results[(a, size)])
        recs = results[("spec", size)][0][3]
        drafted, accepted = sum(r.drafted_tokens for r in recs), sum(r.accepted_tokens for r in recs)
        fed = {a: (len(results[(a, size)][0][3]), sum(r.num_tokens for r in results[(a, size)][0][3])) for a in arms}
        print(f"batch {size}: plain {plain_rate:.1f} tok/s, spec "
              f"{spec_rate:.1f} tok/s; ratio {statistics.median(ratio):.2f}x "
              f"({min(ratio):.2f}-{max(ratio):.2f}); accepted {accepted}/{drafted} ({accepted / max(drafted, 1):.0%}); "
              f"per run: " + "; ".join(f"{a} {n} rounds, {t} tokens fed" for a, (n, t) in fed.items())
              + f"; outputs equal: {equal}")  # fmt: skip
        steps = [r.step_s * 1e3 for run_ in results[("spec", size)] for r in run_[3] if r.verify_rows]
        print(f"  spec step per round with verify rows: median {statistics.median(steps):.1f} ms over {len(steps)}")


if __name__ == "__main__":
    main()
