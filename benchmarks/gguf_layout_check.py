"""Our GGUF writer against llama.cpp's own converter: same tensor names, shapes, dtypes and metadata.

For each preset, the preset's HF directory is converted twice: by ``convert_hf_to_gguf.py`` from the
``llama-cpp-python`` sdist (vendored llama.cpp; only its Python runs, nothing is built) and by
``radixflow convert SRC OUT.gguf``. The two files must hold the same metadata keys with the same
types and values, and the same tensors with the same names, shapes and GGML types; tensor values
are compared too (max |difference| after dequantisation, reported).

Two adjustments the tiny presets need, made by a wrapper around the converter, not by editing it
(``radixflow_jax/bench/llamacpp.py``, shared with ``vs_llamacpp.py``):
``get_vocab_base_pre`` returns ``"qwen2"`` (the converter identifies a BPE pre-tokenizer by hashing
its output, and the presets' tokenizer is not one it knows), and with no ``tokenizer.model`` the
sentencepiece attempt is skipped (it imports ``sentencepiece`` before looking for the file). So
``tokenizer.ggml.pre`` is an expected difference (ours writes ``gpt2``, what the presets'
byte-level split is), and so is tiny-bamba's ``rope.dimension_count`` (:data:`EXPECTED_BY_PRESET`).
Qwen3.5 and Qwen3-Next presets carry one MTP layer each, converted as llama.cpp's nextn block (a
directory without ``mtp.*`` tensors is converted with ``--no-mtp``). For
Nemotron-H a third adjustment: the converter's hyperparameters are the raw ``config.json`` with
``num_hidden_layers`` set to the pattern's length. Through ``AutoConfig`` (its default) transformers
adds ``num_experts_per_tok`` to a dense Nemotron-H config, and the converter then writes
``nemotron_h_moe`` with every ``feed_forward_length`` 0, which is no model of ours.

    python benchmarks/gguf_layout_check.py [--sdist PATH] [--outtype f32 q8_0] [PRESET ...]

Exit status 1 when any file differs beyond the expected keys.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from radixflow_jax.bench import llamacpp

DEFAULT_SDIST = "/tmp/lcpp/llama_cpp_python-0.3.36.tar.gz"
EXPECTED = {"tokenizer.ggml.pre"}
# differences by design, per preset: tiny-bamba sets transformers' partial_rotary_factor, which the
# converter ignores (it reads only attn_rotary_emb and writes the whole head); ours writes the rotary width
EXPECTED_BY_PRESET = {"tiny-bamba": {"granitehybrid.rope.dimension_count"}}
def compare(ours: str, ref: str, expected: set[str] = EXPECTED) -> tuple[list[str], float]:
    """The differences between two GGUF files (beyond the ``expected`` keys) and the max tensor difference."""
    import gguf

    a, b = gguf.GGUFReader(ours), gguf.GGUFReader(ref)
    diffs = [
        f"metadata key only in {w}: {k}"
        for w, ks in (("ours", set(a.fields) - set(b.fields)), ("llama.cpp", set(b.fields) - set(a.fields)))
        for k in sorted(ks)
    ]
    for key in sorted(set(a.fields) & set(b.fields)):
        fa, fb = a.fields[key], b.fields[key]
        if key in expected or key.startswith("GGUF."):
            continue
        if fa.types != fb.types or fa.contents() != fb.contents():
            diffs.append(f"metadata {key}: ours {str(fa.contents())[:60]!r}, llama.cpp {str(fb.contents())[:60]!r}")
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    diffs += [f"tensor only in ours: {n}" for n in sorted(set(ta) - set(tb))]
    diffs += [f"tensor only in llama.cpp: {n}" for n in sorted(set(tb) - set(ta))]
    worst = 0.0
    for name in sorted(set(ta) & set(tb)):
        x, y = ta[name], tb[name]
        if x.tensor_type != y.tensor_type or list(x.shape) != list(y.shape):
            diffs.append(
                f"tensor {name}: ours {x.tensor_type.name}{list(map(int, x.shape))}, "
                f"llama.cpp {y.tensor_type.name}{list(map(int, y.shape))}"
            )
            continue
        dx = gguf.quants.dequantize(x.data, x.tensor_type).astype(np.float64)
        worst = max(worst, float(np.abs(dx - gguf.quants.dequantize(y.data, y.tensor_type)).max()))
    return diffs, worst


def main(argv: list[str] | None = None) -> int:
    from radixflow_jax.models import presets
    from radixflow_jax.models.gguf import write_gguf

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "presets",
        nargs="*",
        default=[
            "tiny-qwen3.5",
            "tiny-qwen3",
            "tiny-qwen3-next",
            "tiny-granite-4.0-h",
            "tiny-falcon-h1",
            "tiny-bamba",
            "tiny-nemotron-h",
        ],
    )
    p.add_argument("--sdist", default=DEFAULT_SDIST, help="llama_cpp_python-0.3.36.tar.gz (pip download)")
    p.add_argument("--outtype", nargs="+", default=["f32", "q8_0"])
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "radixflow-gguf-layout"))
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    root = llamacpp.extract(args.sdist, os.path.join(args.work, "llama.cpp"), only=("convert_hf_to_gguf.py", "conversion/", "gguf-py/"))
    failed = 0
    for preset in args.presets:
        model_dir = presets.materialize(preset)
        for outtype in args.outtype:
            ref = os.path.join(args.work, f"{preset}-{outtype}-llamacpp.gguf")
            ours = os.path.join(args.work, f"{preset}-{outtype}-ours.gguf")
            if os.path.exists(ref):
                os.remove(ref)
            llamacpp.convert(root, model_dir, ref, outtype)
            write_gguf(model_dir, ours, outtype)
            diffs, worst = compare(ours, ref, EXPECTED | EXPECTED_BY_PRESET.get(preset, set()))
            status = "identical layout" if not diffs else f"{len(diffs)} differences"
            print(f"{preset:18s} {outtype:5s} {status}; max tensor |difference| {worst:.3g}")
            for d in diffs:
                print(f"    {d}")
            failed += bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
