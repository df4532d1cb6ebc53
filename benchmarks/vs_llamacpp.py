"""Head to head with llama.cpp on the same GGUF files: parity of greedy outputs, then serving.

1. **Build** ``llama-server`` and ``llama-quantize`` from the ``llama-cpp-python`` sdist once, into
   ``$RADIXFLOW_CACHE/llamacpp/<version>`` (cmake + ninja, 6-35 minutes on two cores, progress
   printed; ``radixflow_jax/bench/llamacpp.py``).
2. **Files.** Each model's HF directory is converted by llama.cpp's own converter (f32), and the
   f32 file is quantised by ``llama-quantize`` (``--quants``, default Q8_0 and Q4_K_M). Models: the
   tiny presets, ``hybrid-81m`` (a Qwen3.5-shaped hybrid at a compute-dominated size: hidden 768,
   12 layers, random weights, the presets' tokenizer) and ``smollm2-135m`` (its packaged Q4_1 file
   with real weights, used as it is).
3. **Parity** (``--what parity``): greedy continuations (16 tokens, EOS ignored) of a fixed set of
   token-id prompts, llama-server's ``/completion`` against our ``LLM`` on the same file. A
   divergence prints its position and both engines' top-1 / top-2 log-probability margins there;
   a margin under ``--near-tie`` is a near-tie. On quantised files llama.cpp quantises the
   activations of its dot products to 8 bits and we compute on dequantised f32 weights, so only
   top-1 agreement is expected.
4. **Head to head** (``--what h2h``): one HTTP client (``radixflow bench --url``'s driver), one
   server busy at a time, both warm (ours has compiled every step variant before the first timed
   run: its compile guard is on, so a compile inside a run would fail it), ``--repeats``
   interleaved runs in alternating order, equal output lengths (``ignore_eos``; token counts
   checked). Workloads (``radixflow_jax/bench/h2h.py``, new requests every run, the same for both
   servers): RACE-like article bursts; multi-turn chat (each turn resends the conversation with
   the server's own answers); ``chat-many``, many concurrent chat sessions; ``agentic``, agent
   sessions over one 1200-token system prompt of tool descriptions shared by all, each turn
   appending a tool result (tokenised by the file's own tokenizer). Reported: output tok/s, mean and p99 latency, mean TTFT,
   cached prompt tokens; and where the time went: ours from ``/metrics`` (rounds, mean round time,
   real and padding tokens per round, busy share of the wall time), llama-server's from its
   per-request ``timings`` (prompt tokens processed, ms per prompt token and per generated token).

    python benchmarks/vs_llamacpp.py                        # everything, as the docs report it
    python benchmarks/vs_llamacpp.py --what parity --models tiny-qwen3.5
    python benchmarks/vs_llamacpp.py --what h2h --models hybrid-81m --repeats 3
    python benchmarks/vs_llamacpp.py --what h2h --dry-run     # the workloads' shapes, nothing run
    python benchmarks/vs_llamacpp.py --what h2h --models smollm2-135m --workloads code-edit --requests 8 \
        --output-tokens 96 --ours-args '--speculative ngram' --llama-args '--spec-type ngram-simple'
        # speculative decoding on both sides (n-gram drafts), on stdlib functions to repeat or rename
    python benchmarks/vs_llamacpp.py --what h2h --ours-only --models tiny-qwen3.5 --repeats 1   # no llama.cpp

Run it on an idle machine: the load average is printed before every timed run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
from typing import Any

import numpy as np

from radixflow_jax.bench import llamacpp
from radixflow_jax.bench.h2h import (
    AGENTIC_TURNS,
    DEFAULT_WORKLOADS,
    H2H_WORKLOADS,
    IncompleteRun,
    describe,
    summary_table,
    timed_run,
)
from radixflow_jax.paths import cache_root

TINY = ("tiny-qwen3.5", "tiny-qwen3", "tiny-qwen3-next", "tiny-granite-4.0-h", "tiny-falcon-h1", "tiny-bamba",
        "tiny-nemotron-h")  # fmt: skip
HYBRID = "hybrid-81m"
SMOLLM = "smollm2-135m"
# the control tokens llama.cpp ends generation at by their text (src/llama-vocab.cpp); with
# ignore_eos it bans them, so the parity run bans them on our side too
EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|end_of_text|>", "<end_of_turn>")


# ------------------------------------------------------------------------------------- files
def hf_dir(name: str) -> str | None:
    """The model's HF directory (None for ``smollm2-135m``, which ships as a GGUF file)."""
    from radixflow_jax.models import presets

    if name == SMOLLM:
        return None
    if name != HYBRID:
        return presets.materialize(name)
    directory = os.path.join(cache_root(), "models", HYBRID)
    if not os.path.exists(os.path.join(directory, "config.json")):
        from radixflow_jax.bench.synthetic import ModelShape, write_model

        shape = ModelShape(hidden=768, intermediate=2048, layers=12, heads=12, kv_heads=2, head_dim=64,
                           linear_key_heads=8, linear_value_heads=8, linear_head_dim=64, vocab=presets.VOCAB_SIZE)  # fmt: skip
        tmp = directory + ".tmp"
        write_model(shape, tmp, seed=0, head_std=8.0)
        presets.build_tokenizer(tmp)
        os.replace(tmp, directory)
    return directory


def model_files(name: str, src: str, quantizer: str, quants: list[str], work: str) -> dict[str, str]:
    """``{file type: path}`` of one model: llama.cpp's f32 conversion and its quantisations."""
    from radixflow_jax.models import presets

    directory = hf_dir(name)
    if directory is None:
        return {"Q4_1": presets.packaged_file(name)}
    f32 = llamacpp.convert(src, directory, os.path.join(work, f"{name}-f32.gguf"), "f32")
    files = {"f32": f32}
    for q in quants:
        files[q] = llamacpp.quantize(quantizer, f32, os.path.join(work, f"{name}-{q}.gguf"), q)
    return files


# ------------------------------------------------------------------------------------- parity
def prompt_set(vocab: int, count: int = 8, seed: int = 7) -> list[list[int]]:
    """Fixed token-id prompts of 5 to ~200 tokens drawn from ``[3, vocab)``."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(5, 200, count).astype(int)
    return [[int(t) for t in rng.integers(3, vocab, n)] for n in lengths]


def eog_ids(tokenizer: Any) -> list[int]:
    """The ids of :data:`EOG_TEXTS` and the EOS token in our tokenizer of the file."""
    texts = set(EOG_TEXTS) | ({tokenizer.eos_token} if tokenizer.eos_token else set())
    ids = (tokenizer.token_id(t) for t in texts)
    return sorted(i for i in ids if i is not None)


def llama_greedy(url: str, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """llama-server's greedy continuation and, per position, its top-1 minus top-2 log-probability."""
    import httpx

    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
            "return_tokens": True, "n_probs": 2, "cache_prompt": False, "samplers": ["top_k"]}  # fmt: skip
    r = httpx.post(url + "/completion", json=body, timeout=600.0)
    r.raise_for_status()
    out = r.json()
    tokens = list(out["tokens"])
    # an entry names the token it is for; this version leaves some out (the second token's, often),
    # so entries are matched to tokens in order by id and a token without one gets nan
    entries = iter(out.get("completion_probabilities", []))
    margins = []
    entry = next(entries, None)
    for tok in tokens:
        if entry is None or entry.get("id") != tok:
            margins.append(float("nan"))
            continue
        top = sorted((t["logprob"] for t in entry.get("top_logprobs", [])), reverse=True)
        margins.append(top[0] - top[1] if len(top) > 1 else float("inf"))
        entry = next(entries, None)
    return tokens, margins


def teacher_forced(llm: Any, prompts: list[list[int]], theirs: list[tuple[list[int], list[float]]], ban: set[int],
                   near_tie: float) -> dict[str, int]:  # fmt: skip
    """Top-1 agreement with llama.cpp's continuation fed back as context: at every position ``k`` of
    its greedy output ``t``, is our most likely token after ``prompt + t[:k]`` (EOG tokens banned, as
    its ``ignore_eos`` bans them) its ``t[k]``? One cold forward per prompt (our prompt logprobs of
    ``prompt + t``). Unlike free-running continuations, a disagreement does not carry on into the
    next positions, so this is the measure that stays meaningful on quantised files. ``gaps``: at
    each disagreement, our top-1 log-probability minus that of llama.cpp's token (ascending);
    ``near_ties``: how many of them are under ``near_tie``; ``median_margin``: our median top-1 minus
    top-2 log-probability over all positions (how decided the model is at all)."""
    from radixflow_jax import SamplingParams

    contexts = [p + t for p, (t, _) in zip(prompts, theirs)]
    outs = llm.generate(contexts, SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=min(len(ban) + 2, 20)))
    agree = positions = near = 0
    gaps: list[float] = []
    margins: list[float] = []  # our top-1 minus top-2 log-probability at every position
    for p, (t, _), out in zip(prompts, theirs, outs):
        for k, tok in enumerate(t):
            lp, top_ids, top_lps = out.prompt_logprobs[len(p) + k]
            kept = [(i, v) for i, v in zip(top_ids, top_lps) if i not in ban]
            best = kept[0] if kept else (-1, float("-inf"))
            if len(kept) > 1:
                margins.append(kept[0][1] - kept[1][1])
            positions += 1
            if best[0] == tok:
                agree += 1
            else:
                gaps.append(round(best[1] - lp, 4))
                near += gaps[-1] < near_tie
    return {"positions": positions, "agree": agree, "near_ties": near, "gaps": sorted(gaps),
            "median_margin": round(statistics.median(margins), 4) if margins else float("nan")}


def _common_prefix(a: list[list[int]], b: list[list[int]]) -> int:
    """Tokens before the first difference, summed over pairs of sequences."""
    return sum(next((k for k, (x, y) in enumerate(zip(p, q)) if x != y), min(len(p), len(q))) for p, q in zip(a, b))


def parity(name: str, files: dict[str, str], args: argparse.Namespace, server: str) -> list[dict[str, Any]]:
    from radixflow_jax import LLM, SamplingParams

    rows: list[dict[str, Any]] = []
    f32: dict[str, list[list[int]]] = {}
    for ftype, path in files.items():
        llm = LLM(path, max_num_seqs=8)
        prompts = prompt_set(min(llm.model.config.vocab_size, 50000))
        ban = eog_ids(llm.model.tokenizer)
        ours = llm.generate(prompts, SamplingParams(max_tokens=args.parity_tokens, temperature=0.0, ignore_eos=True,
                                                    logprobs=2, logit_bias={t: -100.0 for t in ban}))  # fmt: skip
        port = args.port + 1
        cmd = llamacpp.llama_server_cmd(server, path, port, slots=1, ctx=1024, threads=args.threads)
        with llamacpp.ChildServer("llama-server", cmd, port, os.path.join(args.work, "parity.log")) as s:
            theirs = [llama_greedy(s.url, p, args.parity_tokens) for p in prompts]
        agree, divergences = 0, []
        for i, (o, (t_ids, t_margins)) in enumerate(zip(ours, theirs)):
            o_ids = list(o.token_ids)
            pos = next((k for k, (a, b) in enumerate(zip(o_ids, t_ids)) if a != b), None)
            if pos is None and len(o_ids) == len(t_ids):
                agree += 1
                continue
            pos = pos if pos is not None else min(len(o_ids), len(t_ids))
            lp = o.logprobs[pos] if o.logprobs and pos < len(o.logprobs) else None
            ours_margin = lp[2][0] - lp[2][1] if lp and len(lp[2]) > 1 else float("nan")
            theirs_margin = t_margins[pos] if pos < len(t_margins) else float("nan")
            near = min(m for m in (ours_margin, theirs_margin, float("inf")) if m == m) < args.near_tie
            divergences.append(f"prompt {i} (len {len(prompts[i])}): diverges at token {pos} "
                               f"(ours {o_ids[pos:pos + 1]}, llama.cpp {t_ids[pos:pos + 1]}); top-1 margin "
                               f"ours {ours_margin:.4f}, llama.cpp {theirs_margin:.4f}: "
                               f"{'a near-tie' if near else 'NOT a near-tie'}")  # fmt: skip
        forced = teacher_forced(llm, prompts, theirs, set(ban), args.near_tie)
        del llm
        first_tokens = sum(1 for o, (t, _) in zip(ours, theirs) if o.token_ids[:1] == t[:1])
        outputs = {"ours": [list(o.token_ids) for o in ours], "llama.cpp": [t for t, _ in theirs]}
        if ftype == "f32":
            f32 = outputs
        # on a quantised file: how many tokens each engine keeps of its own f32 continuation
        kept = {w: _common_prefix(outputs[w], f32[w]) for w in outputs} if f32 and ftype != "f32" else {}
        rows.append({"model": name, "file": ftype, "prompts": len(prompts), "identical": agree,
                     "top1_first_token": first_tokens, "kept_of_f32": kept, "teacher_forced": forced,
                     "divergences": divergences})  # fmt: skip
        extra = f"  tokens kept of the f32 run (of {len(prompts) * args.parity_tokens}): " + \
            ", ".join(f"{w} {k}" for w, k in kept.items()) if kept else ""
        print(f"parity {name:18s} {ftype:7s} identical {agree}/{len(prompts)}  first token {first_tokens}/{len(prompts)}  "
              f"teacher-forced top-1 {forced['agree']}/{forced['positions']} (of the rest, near-ties "
              f"{forced['near_ties']}, median gap {statistics.median(forced['gaps'] or [0.0]):.3f}; median top-1 margin "
              f"{forced['median_margin']:.3f}){extra}")  # fmt: skip
        for d in divergences:
            print(f"    {d}")
    return rows


# ------------------------------------------------------------------------------------- head to head
def workload(kind: str, run: int, args: argparse.Namespace, vocab: int, encode: Any = None) -> list[Any]:
    """Run ``run``'s requests of ``kind`` (``radixflow_jax/bench/h2h.py``; -1: the warm-up)."""
    from radixflow_jax.bench.h2h import h2h_workload

    count = {"chat-many": args.many_requests, "agentic": args.agentic_requests}.get(kind, args.requests)
    return h2h_workload(kind, run, requests=count, rate=args.rate, output_tokens=args.output_tokens, vocab=vocab,
                        encode=encode)  # fmt: skip


def encoder(name: str, path: str) -> Any:
    """Our tokenizer of the served file (the agentic workload is text): the HF directory's, or the
    GGUF file's own vocabulary for ``smollm2-135m``."""
    from radixflow_jax.models import gguf
    from radixflow_jax.models.tokenizer import Tokenizer

    directory = hf_dir(name)
    if directory is not None:
        return Tokenizer.from_directory(directory).encode
    return gguf.build_tokenizer(gguf.GgufFile(path)).encode


def servers(name: str, path: str, args: argparse.Namespace, server_bin: str | None) -> dict[str, llamacpp.ChildServer]:
    """Ours and, unless ``server_bin`` is None (``--ours-only``), llama-server on the same file."""
    ours_cmd = [sys.executable, "-m", "radixflow_jax.cli", "serve", "--model", path, "--port", str(args.port),
                "--warmup", "background", "--compilation-cache-dir", os.path.join(cache_root(), "xla-cache-vs-llamacpp"),
                "--max-num-seqs", str(args.slots * 2), "--log-level", "warning", *shlex.split(args.ours_args)]  # fmt: skip
    procs = {"ours": llamacpp.ChildServer("radixflow serve", ours_cmd, args.port, os.path.join(args.work, "ours.log"),
                                          ready=lambda h: h.get("phase") in ("ready", "lazy"))}  # fmt: skip
    if server_bin is not None:
        theirs = llamacpp.llama_server_cmd(server_bin, path, args.port + 1, slots=args.slots, ctx=args.slots * 2048,
                                           threads=args.threads, extra=shlex.split(args.llama_args))  # fmt: skip
        procs["llama.cpp"] = llamacpp.ChildServer("llama-server", theirs, args.port + 1,
                                                  os.path.join(args.work, "llama.log"))  # fmt: skip
    return procs


def head_to_head(name: str, path: str, args: argparse.Namespace, server_bin: str | None, vocab: int,
                 encode: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Every workload of ``args.workloads``: a warm-up run per server, then ``args.repeats`` runs in
    alternating order, each run's requests the same for both servers."""
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        procs = {w: stack.enter_context(proc) for w, proc in servers(name, path, args, server_bin).items()}
        urls = {w: proc.url for w, proc in procs.items()}
        print(f"{name}: " + ", ".join(f"{w} ready in {proc.startup_s:.0f} s" for w, proc in procs.items()))
        for kind in args.workloads:
            for w in urls:  # a warm-up run each (not timed: first-use costs of both)
                timed_run(w, urls[w], workload(kind, -1, args, vocab, encode))
            for run in range(args.repeats):
                order = list(urls) if run % 2 == 0 else list(reversed(urls))
                reqs = workload(kind, run, args, vocab, encode)
                for w in order:
                    load = os.getloadavg()[0]
                    try:
                        r = timed_run(w, urls[w], reqs)
                    except IncompleteRun as err:  # kept in the rows; the summary leaves the run out
                        rows.append({"model": name, "workload": kind, "run": run, "server": w, "load": load,
                                     "incomplete": str(err)})  # fmt: skip
                        print(f"  {kind:9s} run {run} {w:9s} load {load:4.2f}  FAILED: {err}")
                        continue
                    rows.append({"model": name, "workload": kind, "run": run, "server": w, "load": load, **r})
                    print(f"  {kind:9s} run {run} {w:9s} load {load:4.2f}  {r['output_throughput']:7.1f} out tok/s  "
                          f"mean {r['e2el_ms']['mean']:8.0f} ms  p99 {r['e2el_ms']['p99']:8.0f} ms  "
                          f"TTFT {r['ttft_ms']['mean']:7.0f} ms  cached {r['cache_hit_rate']:6.1%}  "
                          f"{json.dumps({k: round(v, 3) for k, v in r['breakdown'].items()})}")  # fmt: skip
    return rows


def ours_only_file(name: str) -> str:
    """What ours serves without llama.cpp (``--ours-only``): the model's HF directory (the weights
    llama.cpp's converter would write to the f32 file), or ``smollm2-135m``'s packaged GGUF file."""
    from radixflow_jax.models import presets

    return hf_dir(name) or presets.packaged_file(name)


def dry_run(models: tuple[str, ...], args: argparse.Namespace) -> None:
    """The head-to-head workloads of each model, tokenised, described; no server is started."""
    for m in models:
        path = ours_only_file(m)
        vocab, encode = (512 if m != SMOLLM else 49152), encoder(m, path)
        for kind in args.workloads:
            print(f"{m}: " + describe(kind, workload(kind, 0, args, vocab, encode)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--what", default="parity,h2h", help="build, parity, h2h (comma-separated; build is implied)")
    p.add_argument("--models", default=None, help=f"comma-separated (default parity: {', '.join(TINY)}, {HYBRID}, "
                   f"{SMOLLM}; h2h: {HYBRID}, tiny-qwen3.5, {SMOLLM})")  # fmt: skip
    p.add_argument("--quants", default="Q8_0,Q4_K_M", help="llama-quantize types made from each f32 file")
    p.add_argument("--sdist-dir", default=os.path.join(tempfile.gettempdir(), "lcpp"))
    p.add_argument("--jobs", type=int, default=2, help="parallel compile jobs of the llama.cpp build")
    p.add_argument("--threads", type=int, default=2, help="llama-server -t / -tb")
    p.add_argument("--slots", type=int, default=8, help="llama-server -np (ours gets --max-num-seqs 2x this)")
    p.add_argument("--parity-tokens", type=int, default=16)
    p.add_argument("--near-tie", type=float, default=0.05, help="a top-1 margin (log-prob) below this is a near-tie")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help="of: " + ", ".join(H2H_WORKLOADS))
    p.add_argument("--requests", type=int, default=48, help="race and multiturn: requests per run")
    p.add_argument("--many-requests", type=int, default=128, help="chat-many: requests (4 turns each) per run")
    p.add_argument("--agentic-requests", type=int, default=64,
                   help=f"agentic: requests ({AGENTIC_TURNS} turns per session) per run")  # fmt: skip
    p.add_argument("--ours-only", action="store_true", help="h2h on our server alone (no llama.cpp build or "
                   "server): ours serves the HF directory, smollm2 its packaged file")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print each h2h workload's shape per model; run nothing")
    p.add_argument("--rate", type=float, default=2.0, help="articles (conversations) per second")
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--llama-args", default="", help="more llama-server flags, e.g. '-ub 64' (its reuse flags are "
                   "its defaults otherwise: --cache-ram 8192, --ctx-checkpoints 32)")  # fmt: skip
    p.add_argument("--ours-args", default="", help="more `radixflow serve` flags, e.g. '--speculative ngram'")
    p.add_argument("--h2h-file", default="f32", help="the file type the head to head serves (smollm2: its Q4_1)")
    p.add_argument("--port", type=int, default=18480)
    p.add_argument("--work", default=os.path.join(cache_root(), "vs-llamacpp"))
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    args.workloads = args.workloads.split(",")
    unknown = sorted(set(args.workloads) - set(H2H_WORKLOADS))
    if unknown:
        p.error(f"unknown workloads {unknown}; workloads: {', '.join(H2H_WORKLOADS)}")
    what = set(args.what.split(","))
    os.makedirs(args.work, exist_ok=True)
    given = tuple(args.models.split(",")) if args.models else None
    parity_models, h2h_models = given or (*TINY, HYBRID, SMOLLM), given or (HYBRID, "tiny-qwen3.5", SMOLLM)
    if args.dry_run:
        dry_run(h2h_models, args)
        return 0
    if args.ours_only:
        print(f"load average {os.getloadavg()}; ours only (no llama.cpp)")
        rows = [r for m in h2h_models for r in head_to_head(m, ours_only_file(m), args, None,
                                                             512 if m != SMOLLM else 49152, encoder(m, ours_only_file(m)))]  # fmt: skip
        print(summary_table(rows))
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"h2h": rows, "ours_only": True}, f, indent=2)
        return 0
    print(f"load average {os.getloadavg()}; llama.cpp {llamacpp.VERSION}; threads {args.threads}")
    sdist = llamacpp.fetch_sdist(args.sdist_dir)
    bins = llamacpp.build(sdist, jobs=args.jobs)
    src = llamacpp.extract(sdist, os.path.join(llamacpp.home(), "src"))
    report: dict[str, Any] = {"parity": [], "h2h": []}
    files = {m: model_files(m, src, bins["llama-quantize"], args.quants.split(","), args.work)
             for m in sorted(set(parity_models if "parity" in what else ()) | set(h2h_models if "h2h" in what else ()))}  # fmt: skip
    if "parity" in what:
        for m in parity_models:
            report["parity"].extend(parity(m, files[m], args, bins["llama-server"]))
    if "h2h" in what:
        for m in h2h_models:
            path = files[m].get(args.h2h_file) or next(iter(files[m].values()))
            vocab = 512 if m != SMOLLM else 49152
            report["h2h"].extend(head_to_head(m, path, args, bins["llama-server"], vocab, encoder(m, path)))
        print(summary_table(report["h2h"]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    bad = [r for r in report["parity"] if r["file"] in ("f32", "f16") and any("NOT" in d for d in r["divergences"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
