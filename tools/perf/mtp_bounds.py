"""What MTP drafts cost and can gain on this machine, where no checkpoint has trained MTP weights:
the model given one MTP layer (``radixflow_jax/bench/mtpmodels.py``) twice, a random one (its
guesses are almost never accepted: the pure cost of drafting) and a bigram one whose guesses are
always accepted (the most one drafted token a round can gain; the trunk keeps its shape and cost,
its values are the bigram model's). Each against plain decoding of the same weights.

Side by side in one process, interleaved repeats; output tok/s ratio (median, range), acceptance,
rounds per run, outputs equal plain decoding.

``python tools/perf/mtp_bounds.py --model ~/.cache/radixflow/models/hybrid-81m``
"""

from __future__ import annotations

import argparse
import statistics

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.bench.codeedit import chat_prompts, interleaved, rate_ratio, run_batches
from radixflow_jax.bench.mtpmodels import bigram_mtp, with_mtp_layer
from radixflow_jax.models.api import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,8")
    args = ap.parse_args()
    options = dict(max_num_seqs=8, max_num_batched_tokens=512)
    models = {"random": with_mtp_layer(load(args.model)), "bigram": bigram_mtp(with_mtp_layer(load(args.model)))}
    arms = {}
    for name, model in models.items():
        arms[(name, "plain")] = LLM(model, **options)
        arms[(name, "mtp")] = LLM(model, speculative="mtp", **options)
    work = chat_prompts(arms[("random", "plain")], args.prompts)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    sizes = [int(b) for b in args.batches.split(",")]
    truth = {name: run_batches(arms[(name, "plain")], work, params, 8)[2] for name in models}
    results, before, after = interleaved(arms, work, params, sizes, repeats=args.repeats)
    print(f"{args.model}: {len(work)} prompts, {args.max_tokens} tokens each, {args.repeats} repeats; load "
          f"{before:.2f} before, {after:.2f} after")  # fmt: skip
    for name in models:
        for size in sizes:
            runs = {arm: results[((name, arm), size)] for arm in ("plain", "mtp")}
            mtp_rate, plain_rate, ratio = rate_ratio(runs["mtp"], runs["plain"])
            equal = all(r[2] == truth[name] for rs in runs.values() for r in rs)
            recs = runs["mtp"][0][3]
            drafted, accepted = sum(r.drafted_tokens for r in recs), sum(r.accepted_tokens for r in recs)
            print(f"{name} MTP layer, batch {size}: plain {plain_rate:.1f} tok/s, mtp "
                  f"{mtp_rate:.1f} tok/s; ratio {statistics.median(ratio):.2f}x "
                  f"({min(ratio):.2f}-{max(ratio):.2f}); accepted {accepted}/{drafted}; rounds per run "
                  f"{len(runs['plain'][0][3])} / {len(recs)}; outputs equal: {equal}")  # fmt: skip


if __name__ == "__main__":
    main()
