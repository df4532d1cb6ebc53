"""The whole jitted round lowered for GPU and TPU at serving size, from this CPU host.

For each model shape (``models/serving_configs.py``: Qwen3.5-4B and Nemotron-H-8B by default) in
bf16, 64 rows, a 2048-token prefill variant, a decode variant and a mixed one (pairing is part of
every variant), and each platform (``cuda``: the Pallas Triton kernels; ``tpu``: the Mosaic
kernels), ``runner/export.export_step`` lowers the step from abstract shapes (no weights in memory)
and one row is printed: the Pallas calls in the module, the lowering time and the module's size. A
variant that cannot lower prints the op and platform the lowering named, and the script exits 1.
The CI test at a reduced size is ``tests/runner/test_export.py``.

    python benchmarks/export_step.py
    python benchmarks/export_step.py --models qwen3.5-27b --platforms tpu --rows 32
"""

from __future__ import annotations

import argparse
import time

from radixflow_jax.models.serving_configs import SERVING_CONFIGS, serving_config
from radixflow_jax.runner.export import ExportError, ExportShapes, export_step, standard_variants


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="qwen3.5-4b,nemotron-h-8b", help=f"of {', '.join(SERVING_CONFIGS)}")
    p.add_argument("--platforms", default="cuda,tpu")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    sizes = ExportShapes(max_num_batched_tokens=args.prefill_tokens + args.rows, max_num_seqs=args.rows,
                         max_model_len=args.max_model_len, num_pages=4096, num_slots=2 * args.rows + 64)  # fmt: skip
    print(f"{'model':>14s} {'platform':>8s} {'kind':>7s} {'tokens':>6s} {'rows':>4s} {'decode':>6s} "
          f"{'kernel calls':>12s} {'lower s':>7s} {'module MB':>9s}", flush=True)  # fmt: skip
    failed = 0
    for name in args.models.split(","):
        cfg = serving_config(name)
        for platform in args.platforms.split(","):
            for kind, v in standard_variants(sizes.step_shapes(cfg), args.prefill_tokens).items():
                start = time.perf_counter()
                try:
                    exp = export_step(cfg, args.dtype, sizes, v, platform)
                except ExportError as exc:
                    failed += 1
                    print(f"{name:>14s} {platform:>8s} {kind:>7s} FAILED: {exc}", flush=True)
                    continue
                calls = sum(n for _, n in exp.custom_calls)
                print(f"{name:>14s} {platform:>8s} {kind:>7s} {v.num_tokens:6d} {v.num_rows:4d} {v.num_decode:6d} "
                      f"{calls:12d} {time.perf_counter() - start:7.1f} {exp.module_chars / 1e6:9.2f}", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
