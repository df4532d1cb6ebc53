"""Does llama.cpp's MTP drafting (``llama-server --spec-type draft-mtp``) read our MTP GGUF files
the way we do? One drafted token a round on both sides, greedy, the same prompts, on two files
written by llama.cpp's own converter (our writer's layout is identical, ``benchmarks/gguf_layout_check.py``;
the tiny presets' pre-tokenizer name needs its wrapper) from tiny-qwen3.5 (one MTP layer): the preset as it is (a random
MTP layer: drafts almost never accepted on either side) and its bigram form
(``bench/mtpmodels.bigram_tensor``, applied to the checkpoint's tensors: every draft is what the trunk
predicts, so a reader that gets ``nextn.eh_proj``, ``enorm``, ``shared_head_norm`` and the head
right accepts nearly all). The bigram head ignores the trunk's hidden state, so llama.cpp's
different pairing of the first MTP position (``docs/design.md``, "MTP drafts") cannot matter there.
Both engines load the same GGUF file. Prints each side's drafted and accepted tokens per file, and
whether the outputs agree.

``python tools/perf/mtp_vs_llamacpp.py [--sdist llama_cpp_python-0.3.36.tar.gz]`` (needs the llama.cpp
build of ``benchmarks/vs_llamacpp.py``)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import httpx
import numpy as np

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.bench import llamacpp
from radixflow_jax.bench.mtpmodels import bigram_tensor
from radixflow_jax.models import presets
from radixflow_jax.models.safetensors_io import SafetensorsDir, save_file
from radixflow_jax.serve.launch import free_port

PROMPTS = [
    "The student read the passage twice. Which option is the main idea?",
    "A river runs through the old city, and every morning the family",
    "According to the author, the best part of the program is",
]


def bigram_dir(src: str, dest: str) -> str:
    """``src`` (a HF directory with ``mtp.*``) in its bigram form (``bench/mtpmodels.bigram_tensor``),
    written to ``dest``."""
    shutil.copytree(src, dest)
    tensors = {k: np.asarray(v) for k, v in SafetensorsDir(src).items()}
    final_norm = tensors["model.norm.weight"]
    tensors = {k: bigram_tensor(k, v, final_norm) for k, v in tensors.items()}
    save_file(tensors, os.path.join(dest, "model.safetensors"), {"format": "pt"})
    return dest


def ours(gguf: str, tokens: int) -> tuple[list[list[int]], int, int]:
    llm = LLM(gguf, speculative="mtp", max_num_seqs=1, max_num_batched_tokens=128)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    outs = [list(o.token_ids) for p in PROMPTS for o in llm.generate([p], params)]
    recs = llm.replicas.engines[0].records
    return outs, sum(r.drafted_tokens for r in recs), sum(r.accepted_tokens for r in recs)


def theirs(gguf: str, tokens: int, work: str) -> tuple[list[list[int]], int, int]:
    port = free_port()
    extra = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "1", "--spec-draft-n-min", "0"]
    server = llamacpp.binary("llama-server")
    cmd = llamacpp.llama_server_cmd(server, gguf, port, slots=1, ctx=1024, threads=2, extra=extra)
    outs, drafted, accepted = [], 0, 0
    with llamacpp.ChildServer("llama-server", cmd, port, os.path.join(work, "llama-server.log"), timeout=300) as srv:
        for p in PROMPTS:
            body = {"prompt": p, "n_predict": tokens, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
                    "return_tokens": True}  # fmt: skip
            r = httpx.post(srv.url + "/completion", json=body, timeout=300).json()
            outs.append(list(r.get("tokens", [])))
            timings = r.get("timings", {})
            drafted += int(timings.get("draft_n", 0))
            accepted += int(timings.get("draft_n_accepted", 0))
    return outs, drafted, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--sdist", default="/tmp/lcpp/llama_cpp_python-0.3.36.tar.gz")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="mtp-vs-llamacpp-")
    only = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    root = llamacpp.extract(args.sdist, os.path.join(work, "llama.cpp"), only=only)
    src = presets.materialize("tiny-qwen3.5")
    for name, directory in (("random", src), ("bigram", bigram_dir(src, os.path.join(work, "bigram")))):
        gguf = os.path.join(work, f"{name}.gguf")
        llamacpp.convert(root, directory, gguf, "f32")
        mine, d1, a1 = ours(gguf, args.tokens)  # the same file on both sides
        other, d2, a2 = theirs(gguf, args.tokens, work)
        print(f"{name} MTP layer: ours {a1}/{d1} drafts accepted, llama.cpp {a2}/{d2}; outputs equal: {mine == other}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
