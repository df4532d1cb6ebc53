"""One process of the two-process test (tests/multidevice/test_processes.py); not a test module.

``python process_worker.py COORDINATOR PROCESS_ID NUM_PROCESSES WORKDIR``: joins the job through
``jax.distributed`` (gloo CPU collectives), builds its own engine replica, runs its share of the
prompts (``generate_across_processes``: the outputs come back to every process through a
collective) and its share of a batch job (``batch/parts.py``: process 0 merges), then writes what
it saw to ``WORKDIR/process-P.json``."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    coordinator, pid, nproc, workdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    from radixflow_jax.replicas import distributed

    distributed.initialize(distributed.DistributedConfig(coordinator, nproc, pid))
    import jax

    from radixflow_jax.batch.parts import run_share
    from radixflow_jax.batch.runner import JobConfig
    from radixflow_jax.llm import LLM
    from radixflow_jax.engine.params import SamplingParams

    with open(os.path.join(workdir, "job.json")) as f:
        job = json.load(f)
    llm = LLM(job["model"], **job["engine"])
    outs = distributed.generate_across_processes(llm, job["prompts"], SamplingParams(max_tokens=job["max_tokens"]))
    cfg = JobConfig(job["input"], job["output"], model_name=job["model"], progress=False, window=job["window"])
    share = run_share(llm.engine, llm.model, cfg, pid, nproc)
    seen = {
        "process_index": jax.process_index(), "process_count": jax.process_count(),
        "global_devices": len(jax.devices()), "local_devices": len(jax.local_devices()),
        "model_devices": sorted(str(d) for d in jax.tree.leaves(llm.model.params)[0].devices()),
        "generated": [o.token_ids for o in outs], "request_ids": [o.request_id for o in outs],
        "share_requests": share.stats.requests if share.stats else None, "merged": share.merged,
    }  # fmt: skip
    with open(os.path.join(workdir, f"process-{pid}.json"), "w") as f:
        json.dump(seen, f)
    distributed.shutdown()


if __name__ == "__main__":
    main()
