"""The ``radixflow`` command line: ``serve``, ``bench``, ``generate``, ``batch`` and ``convert``.

Every subcommand turns a bad argument into one clear line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixflow", description="RadixFlow-JAX: serve hybrid LLMs with JAX")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="greedy generation for one prompt (incremental path)")
    gen.add_argument("--model", default="tiny-qwen3.5", help="preset name or model directory")
    src = gen.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (needs a tokenizer)")
    src.add_argument("--token-ids", help="comma-separated prompt token ids")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])

    bench = sub.add_parser("bench", help="compare scheduling policies side by side on a workload")
    from radixflow_jax.bench.cli import add_arguments

    add_arguments(bench)

    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server")
    from radixflow_jax.serve.server import add_arguments as add_serve_arguments

    add_serve_arguments(srv)

    batch = sub.add_parser("batch", help="run a JSONL file of requests, in input order, resumable after a kill")
    from radixflow_jax.batch.cli import add_arguments as add_batch_arguments

    add_batch_arguments(batch)

    conv = sub.add_parser("convert", help="convert a HF directory (or preset) to an orbax directory or a .gguf file")
    conv.add_argument("src", help="HF model directory or preset name")
    conv.add_argument("out_dir", help="output directory (orbax), or OUT.gguf (llama.cpp's GGUF layout)")
    conv.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    conv.add_argument("--outtype", default="f32", choices=["f32", "f16", "bf16", "q8_0"],
                      help="GGUF output: tensor type of the matrices (norms, 1-D and conv tensors stay f32)")
    return parser


def _generate(args: argparse.Namespace) -> int:
    from radixflow_jax.models import api

    model = api.load(args.model, dtype=args.dtype)
    if args.token_ids is not None:
        try:
            ids = [int(t) for t in args.token_ids.split(",") if t.strip()]
        except ValueError as exc:
            raise ValueError(f"--token-ids must be comma-separated integers ({exc})") from exc
    else:
        text = args.prompt if args.prompt is not None else "The passage says that"
        if args.chat:
            if model.tokenizer is None:
                raise ValueError(f"{model.model_dir} has no tokenizer: --chat needs one")
            text = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        ids = model.encode(text)
    tokens, reason = api.greedy_generate(model, ids, args.max_tokens)
    if model.tokenizer is not None:
        print(model.tokenizer.decode(tokens))
    print(f"[{len(ids)} prompt tokens, {len(tokens)} generated, finish_reason={reason}] ids={tokens}")
    return 0


def _batch(args: argparse.Namespace) -> int:
    from radixflow_jax.batch.cli import run

    return run(args)


def _convert(args: argparse.Namespace) -> int:
    from radixflow_jax.models import api

    if args.out_dir.endswith(".gguf"):
        from radixflow_jax.models.gguf import write_gguf

        src = api.resolve_model_path(args.src)
        if not os.path.isdir(src):
            raise ValueError(f"{args.src}: a GGUF file is written from a HF directory or preset, not from {src}")
        out = write_gguf(src, args.out_dir, outtype=args.outtype)
    else:
        out = api.convert(args.src, args.out_dir, dtype=args.dtype)
    print(f"wrote {out}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from radixflow_jax.bench.cli import run

    return run(args)


def _serve(args: argparse.Namespace) -> int:
    from radixflow_jax.serve.server import serve

    return serve(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"generate": _generate, "convert": _convert, "bench": _bench, "serve": _serve, "batch": _batch}
    try:
        return handlers[args.command](args)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"radixflow {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
