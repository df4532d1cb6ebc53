"""Cold start-up: ``LLM("tiny-qwen3.5")`` plus a first ``generate`` with empty caches.

Runs in this process with ``RADIXFLOW_CACHE`` pointed at a fresh temporary directory (so the preset
is written from scratch) and the persistent XLA cache in a fresh directory too (``--xla-cache`` keeps
one between runs instead, to time a warm start). Prints the time of each phase, the variants that
compiled, and the load average (the machine may be shared).

    python benchmarks/startup.py [--model tiny-qwen3.5] [--warmup lazy|all] [--xla-cache DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen3.5")
    p.add_argument("--warmup", choices=("lazy", "all"), default="lazy")
    p.add_argument("--xla-cache", default=None, help="persistent XLA cache directory (default: a fresh one)")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rfj-startup-") as tmp:
        os.environ["RADIXFLOW_CACHE"] = os.path.join(tmp, "radixflow")
        xla = args.xla_cache or os.path.join(tmp, "xla")
        from radixflow_jax import LLM, SamplingParams

        t_import = time.perf_counter()
        llm = LLM(args.model, warmup=args.warmup, compilation_cache_dir=xla)
        t_build = time.perf_counter()
        params = SamplingParams(max_tokens=16, ignore_eos=True)
        out = llm.generate(["Which option is the best title?", "A question about the passage."], params)
        t_first, cpu_first = time.perf_counter(), time.process_time()
        llm.generate(["Another prompt of some length to see a warm round."], params)
        t_second = time.perf_counter()
        step = llm.engine.executor.step
        print(f"model {args.model}, warmup {args.warmup}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        print(f"import {t_import - t_start:.1f}s | LLM(...) {t_build - t_import:.1f}s (preset written, engine built)"
              f" | first generate {t_first - t_build:.1f}s | second generate {t_second - t_first:.2f}s")  # fmt: skip
        print(f"cold start-up to the first outputs: {t_first - t_start:.1f}s wall, {cpu_first:.1f}s CPU "
              f"(all threads; on a shared machine wall time also counts other jobs); {step.num_compiles} variants "
              f"compiled "
              f"({step.compile_seconds:.1f}s of compiling); {len(out[0].token_ids)} tokens per output")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
