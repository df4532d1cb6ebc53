"""Where one round of ``benchmarks/vs_transformers.py`` spends its time, measured inside the compiled
step.

What is measured
  * The vs_transformers model and workload (prefix cache on) run once through ``LLM.generate``; the
    inputs of the first round of ``--round`` are captured: ``decode`` (default) the first round whose
    rows are all decode rows and fill the row budget, ``mixed`` the first with that many decode rows
    and at least 512 prefill token slots, ``prefill`` the workload's first round.
  * The step variant of that round is compiled once as it is and once per *ablation*: one part of
    the model replaced by a trivial stand-in while tracing (the program then does not compute that
    part). Every program runs on the captured inputs, interleaved rep by rep (``--reps`` reps of 3
    calls each, after one untimed call); medians and min-max in ms, and each median's change
    against the program as it is. The outputs of an ablated program are meaningless; only its time
    is read.
  * Parts are not additive on XLA:CPU (fusions and the thunk runtime's concurrency change with the
    program), so read each line as "the round without this part", not as the part's own cost.

Ablations: ``recurrent`` (the recurrent part of every Gated DeltaNet layer: state reads, conv,
delta rule, write-back, checkpoint emits; projections kept), ``emits`` (checkpoint writes only),
``delta-rule`` (the one-step update's arithmetic; states pass through), ``native`` (not an
ablation: the native CPU kernels off, ``RADIXFLOW_NATIVE=0``, so the decode rows' state-window
update and their attention run the XLA formulations; its outputs are right), ``conv`` (the one-step conv
update), ``attention`` (decode attention over the paged KV), ``mlp`` (every dense MLP). Stand-ins for the
prefill rows' chunked scan and conv were tried on the mixed round and made it slower (+120 and +14
ms; why was not traced), so they do not measure their part and are not offered; read the mixed
round's parts with ``round_profile.py``.

The workload, model and engine options of ``vs_transformers.py`` apply
(``radixflow_jax/bench/synthetic.py``, which also captures the round).

Run (from the repository root, with the venv active; about a minute on 2 cores)::

    python tools/perf/round_ablation.py
    python tools/perf/round_ablation.py --ablations recurrent,emits --reps 31
    python tools/perf/round_ablation.py --round mixed --ablations recurrent,attention,mlp --reps 11
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import unittest.mock
from typing import Any, Callable, Iterator

from radixflow_jax.bench import synthetic


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def ablations() -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    from radixflow_jax.kernels import ops
    from radixflow_jax.models import layers
    from radixflow_jax.models.mixers import gdn, recurrent

    def no_recurrent(conv, conv_in, batch, conv_pool, ssm_pool, num_decode, emits, chunk, prepare, decode, chunked,
                     decode_in_place=None):  # fmt: skip
        return prepare(conv_in)[2], conv_in, conv_pool, ssm_pool

    @contextlib.contextmanager
    def no_delta_rule() -> Iterator[None]:
        def window(q, k, v, g, b, pool, base, real, **kw):
            return v + 0 * q.sum(), pool

        with _patched(ops, "gated_delta_decode", lambda q, k, v, g, b, s, **kw: (v + 0 * q.sum(), s)):
            with _patched(ops, "gated_delta_decode_window", window):
                yield


    return {
        "as is": contextlib.nullcontext,
        "recurrent": lambda: _patched(gdn, "recurrent_mix", no_recurrent),
        "emits": lambda: _patched(recurrent, "write_emits", lambda conv, ssm, emits, states: (conv, ssm)),
        "delta-rule": no_delta_rule,
        "native": lambda: unittest.mock.patch.dict(os.environ, {"RADIXFLOW_NATIVE": "0"}),
        "conv": lambda: _patched(ops, "causal_conv1d_update", lambda x, w, b, s, **kw: (x, s)),
        "attention": lambda: _patched(ops, "paged_attention", lambda q, *a, **kw: q * 1.0),
        "mlp": lambda: _patched(layers.Mlp, "__call__", lambda self, x: x * 1.0),
    }


def main(argv: list[str] | None = None) -> None:
    import jax

    from radixflow_jax.runner.step import CompiledStep

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ablations", default=",".join(list(ablations())[1:]), help="comma-separated, see above")
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--round", choices=("decode", "mixed", "prefill"), default="decode", help="which round")
    synthetic.add_setup_args(p)  # the vs_transformers workload, model and engine options
    args = p.parse_args(argv)
    table = ablations()
    names = ["as is"] + [n for n in args.ablations.split(",") if n and n != "as is"]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown ablations {unknown}; choose from {', '.join(table)}")
    llm, variant, inputs = synthetic.capture_round(args, args.round)
    ex = llm.engine.executor
    programs = {}
    for name in names:
        with table[name]():
            step = CompiledStep(
                ex.model.graphdef, ex.model.params, ex.cache, ex.shapes, ex.step.kernels, ex.penalty_window,
                mask_words=ex.step.mask_words,
            )
            programs[name] = step._compile(variant)
    device_inputs = jax.tree_util.tree_map(jax.device_put, inputs)
    cache, params = ex.cache, ex.model.params
    times: dict[str, list[float]] = {n: [] for n in names}
    load_before = os.getloadavg()
    for _ in range(args.reps):
        for name, fn in programs.items():
            cache, out = fn(params, cache, device_inputs)
            jax.block_until_ready(out)
            start = time.perf_counter()
            for _ in range(3):
                cache, out = fn(params, cache, device_inputs)
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / 3 * 1e3)
    ex.cache = cache
    print(f"round: {variant} (decode rows {variant.num_decode}), {args.reps} reps of 3 calls, interleaved")
    base = statistics.median(times["as is"])
    print(f"{'without':12s} {'median ms':>10s} {'min-max ms':>14s} {'change ms':>10s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:12s} {med:10.1f} {min(ts):6.1f}-{max(ts):<7.1f} {med - base:+10.1f}")
    after = os.getloadavg()
    print(f"load average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in load_before)}, "
          f"after {'/'.join(f'{x:.1f}' for x in after)}")  # fmt: skip


if __name__ == "__main__":
    main()
