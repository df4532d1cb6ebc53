"""What the step's pairing preparation costs rounds that pair nothing.

Every step variant takes ``pair_emit`` (policy ``pair``; all -1 when no row of the round pairs), so
each recurrent layer computes the paired rows' conv states (``conv_states_at``) and picks the
scan (``lax.cond``) even under ``native`` and ``radixflow``. This script runs the
``vs_transformers.py`` workload and model on our engine under ``radixflow`` with that step as it is
(``with``) and with the same step built from ``pair_emit=None`` (``without``: no pairing code in the
program), interleaved, and prints the wall time and the step seconds per round kind (decode-only,
mixed, prefill-only), medians of ``--repeats`` runs, and whether the greedy outputs are identical.

Run (repository root, venv active; the workload, model and engine options of ``vs_transformers.py``
apply, ``radixflow_jax/bench/synthetic.py``)::

    python tools/perf/pairing_prep.py
    python tools/perf/pairing_prep.py --no-prefix-cache --repeats 5
    python tools/perf/pairing_prep.py --quick --repeats 1      # the small model, about a minute
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from radixflow_jax.bench import synthetic

MODES = ("with", "without")


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    from radixflow_jax import LLM, SamplingParams
    from radixflow_jax.runner import step as step_module

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    synthetic.add_setup_args(p)
    args = p.parse_args()
    w, shape = synthetic.setup_from_args(args)
    synthetic.configure_jax(args.jax_cache)
    model_dir = args.model_dir or synthetic.write_model(shape, tempfile.mkdtemp(), args.seed, args.head_std)
    prompts = w.prompts(synthetic.vocab_of(model_dir))
    params = SamplingParams(max_tokens=w.output_len, ignore_eos=True)
    real_batch = step_module.Batch

    def without_pairing(*a, **kw):
        return real_batch(*a, **{**kw, "pair_emit": None})

    def run(mode: str) -> tuple[float, dict[str, float], list[list[int]]]:
        step_module.Batch = real_batch if mode == "with" else without_pairing  # read when a variant traces
        try:
            llm = LLM(
                model_dir, dtype="float32", max_num_seqs=args.max_num_seqs,
                policy="no-cache" if args.no_prefix_cache else "radixflow",
                max_num_batched_tokens=args.max_batched_tokens,
                max_model_len=w.max_len, warmup=False, bucket_mode=args.buckets,
            )  # fmt: skip
            llm.engine.executor.warmup(synthetic.planned_variants(llm, prompts, params))
            compiled = llm.engine.executor.step.num_compiles
            start = time.perf_counter()
            outs = llm.generate(prompts, params)
            wall = time.perf_counter() - start
        finally:
            step_module.Batch = real_batch
        if llm.engine.executor.step.num_compiles != compiled:
            raise RuntimeError("a variant compiled inside the timed run")
        kinds = {kind: e["step_s"] for kind, e in synthetic.step_by_kind(llm.engine.records).items()}
        return wall, kinds, [list(o.token_ids) for o in outs]

    print(f"load average before {_load()}", flush=True)
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {m: [] for m in MODES}
    outputs: dict[str, list[list[int]]] = {}
    for rep in range(max(args.repeats, 1)):
        for mode in MODES if rep % 2 == 0 else MODES[::-1]:
            wall, kinds, outputs[mode] = run(mode)
            runs[mode].append((wall, kinds))
            print(f"run {rep + 1} {mode:>7}: wall {wall:.2f} s, step s by kind "
                  + ", ".join(f"{k} {v:.3f}" for k, v in sorted(kinds.items())), flush=True)  # fmt: skip
    print(f"identical greedy outputs: {outputs['with'] == outputs['without']}")
    print("| step | wall s (median, min-max) | step s by kind (medians) |")
    print("|---|---|---|")
    for mode, rs in runs.items():
        walls = [r[0] for r in rs]
        kinds = sorted(rs[0][1])
        by_kind = ", ".join(f"{k} {statistics.median(r[1].get(k, 0.0) for r in rs):.3f}" for k in kinds)
        print(f"| {mode} pairing prep | {statistics.median(walls):.3f} ({min(walls):.3f}-{max(walls):.3f}) | {by_kind} |")
    print(f"load average after {_load()}")


if __name__ == "__main__":
    main()
