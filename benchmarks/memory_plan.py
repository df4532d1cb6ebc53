"""Memory plans per device from the configuration alone (``sim/memory_plan.py``): weights, KV pages
and tokens, state slots and the slots left for checkpoints, for each serving shape
(``models/serving_configs.py``) on each device spec, with the pools ``radixflow serve
--memory-fraction`` would choose. A model one chip cannot hold prints "needs tensor parallel >= N".

    python benchmarks/memory_plan.py
    python benchmarks/memory_plan.py --models qwen3.5-27b --devices tpu-v5e --max-num-seqs 32
"""

from __future__ import annotations

import argparse

from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.models.serving_configs import SERVING_CONFIGS, serving_config
from radixflow_jax.sim.memory_plan import HEADER, plan
from radixflow_jax.sim.specs import get_device_spec


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="qwen3.5-4b,qwen3.5-9b,qwen3.5-27b", help=f"of {', '.join(SERVING_CONFIGS)}")
    p.add_argument("--devices", default="h200,tpu-v5e,tpu-v6e")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--memory-fraction", type=float, default=0.9)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--page-size", type=int, default=16)
    args = p.parse_args()
    ec = EngineConfig.from_options(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                                   page_size=args.page_size)  # fmt: skip
    print(f"memory fraction {args.memory_fraction}, {args.max_num_seqs} rows, {args.max_num_batched_tokens} tokens "
          f"per round, pages of {args.page_size} tokens")  # fmt: skip
    print(HEADER)
    for name in args.models.split(","):
        cfg = serving_config(name)
        for device in args.devices.split(","):
            spec = get_device_spec(device)
            print(plan(name, cfg, spec, ec, dtype=args.dtype, fraction=args.memory_fraction).line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
