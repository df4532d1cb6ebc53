"""What one round of a served model costs by its shape: decode rounds by rows and context, mixed rounds
by prefill tokens, against the floor of reading the weights once.

On hybrid-81m's f32 GGUF file (``benchmarks/vs_llamacpp.py`` builds it under
``$RADIXFLOW_CACHE/vs-llamacpp``; ``--model`` takes any file or preset) at the head to head's server
shape (16 rows, 512 batched tokens), prefix cache off (policy ``no-cache``), the compiled variants
from the head to head's XLA cache when present:

  * the floor: a jitted ``jnp.sum`` over as many f32 values as the model has parameters (one pass
    over that many bytes: the least any round reads);
  * decode rounds: ``rows`` requests of ``ctx``-token prompts decode together; the step time
    (``RoundRecord.step_s``) of the rounds whose rows are all decode rows, after 3;
  * mixed rounds: ``rows`` requests decoding, then one request of ``P`` prompt tokens joins; the step
    time of the rounds carrying its prefill, against the decode rounds around them.

Medians over the repeats (the same process, no interleaving between shapes: read shapes against each
other, not runs against runs); the load average printed before and after.

    python tools/perf/round_floor.py [--model PATH] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import time

import numpy as np

from radixflow_jax.engine.build import enable_compilation_cache
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.paths import cache_root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=os.path.join(cache_root(), "vs-llamacpp", "hybrid-81m-f32.gguf"))
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    enable_compilation_cache(os.path.join(cache_root(), "xla-cache-vs-llamacpp"))
    import jax
    import jax.numpy as jnp

    from radixflow_jax.llm import LLM

    print("load", os.getloadavg())
    llm = LLM(args.model, max_num_seqs=16, max_num_batched_tokens=512, policy="no-cache")
    params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(llm.model.params))
    w = jnp.ones((params,), jnp.float32)
    total = jax.jit(jnp.sum)
    total(w).block_until_ready()
    ts = []
    for _ in range(9):
        t = time.perf_counter()
        total(w).block_until_ready()
        ts.append(time.perf_counter() - t)
    print(f"floor: one pass over {params / 1e6:.0f} M f32 values ({4 * params / 1e6:.0f} MB): {1e3 * st.median(ts):.1f} ms")
    del w
    eng, rng = llm.engine, np.random.default_rng(0)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(x) for x in rng.integers(3, 500, n))

    for ctx in (8, 1000):
        for rows in (1, 2, 4, 8, 16):
            steps = []
            for _ in range(max(args.repeats // 2, 1)):
                n0 = len(eng.records)
                llm.generate([list(ids(ctx)) for _ in range(rows)], SamplingParams(max_tokens=24, ignore_eos=True))
                recs = [r for r in eng.records[n0:] if r.num_decode == r.num_rows == rows == r.num_tokens]
                steps += [r.step_s for r in recs[3:]]
            if steps:
                print(f"decode ctx {ctx:4d} rows {rows:2d}: {1e3 * st.median(steps):6.1f} ms (n {len(steps)})", flush=True)
    for rows in (4, 8):
        for prompt in (16, 48, 112, 240):
            mixed, decode, slots = [], [], 0
            for _ in range(args.repeats):
                for _ in range(rows):
                    eng.add_request(ids(8), SamplingParams(max_tokens=60, ignore_eos=True))
                for _ in range(4):
                    eng.step()
                n0 = len(eng.records)
                eng.add_request(ids(prompt), SamplingParams(max_tokens=1, ignore_eos=True))
                for _ in range(3):
                    eng.step()
                for r in eng.records[n0:]:
                    (mixed if r.num_tokens > r.num_decode else decode).append(r.step_s)
                    slots = r.token_slots if r.num_tokens > r.num_decode else slots
                while eng.has_unfinished():
                    eng.step()
            print(f"mixed rows {rows} + prompt {prompt:3d} ({slots} slots): {1e3 * st.median(mixed):6.1f} ms; "
                  f"decode rounds beside it {1e3 * st.median(decode):5.1f} ms", flush=True)  # fmt: skip
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
