"""The native CPU decode update (``kernels/native``) against the reference one-step update.

The oracle is ``kernels/gated_delta.gated_delta_decode`` applied to the window slice, with padding
rows keeping their state, and every slot outside the window unchanged. These tests build the
library. They are skipped under ``RADIXFLOW_NATIVE=0`` and, under ``auto``, on a machine with no C++
compiler at all (the reason is printed); a compiler that fails to build the kernel fails them.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels import native, ops
from radixflow_jax.kernels.gated_delta import gated_delta_decode


pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="native kernels are for XLA:CPU")


@pytest.fixture(scope="module", autouse=True)
def _native_kernels() -> None:
    if native.mode() == "0":
        pytest.skip("RADIXFLOW_NATIVE=0")
    reason = native._load()
    if reason is not None and reason.startswith("no C++ compiler") and native.mode() == "auto":
        pytest.skip(f"native kernels unavailable: {reason}")
    assert reason is None, reason


def _inputs(seed: int, d: int, hk: int, hv: int, dk: int, dv: int, slots: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((d, hk, dk)).astype(np.float32)
    k = rng.standard_normal((d, hk, dk)).astype(np.float32)
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((d, hv, dv)).astype(np.float32)
    g = -np.abs(rng.standard_normal((d, hv))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((d, hv))))).astype(np.float32)
    pool = (0.3 * rng.standard_normal((slots, hv, dk, dv))).astype(np.float32)
    return q, k, v, g, beta, pool


def _oracle(q, k, v, g, beta, pool, base: int, real: np.ndarray, scale):
    d = v.shape[0]
    window = pool[base : base + d]
    out, new = gated_delta_decode(*map(jnp.asarray, (q, k, v, g, beta, window)), scale=scale)
    want = pool.copy()
    want[base : base + d][real] = np.asarray(new)[real]
    return np.asarray(out), want


@pytest.mark.parametrize(
    "d,hk,hv,dk,dv,base,scale",
    [(5, 2, 4, 8, 6, 3, None), (64, 4, 8, 64, 64, 1, None), (3, 1, 1, 16, 32, 0, 0.5), (7, 2, 2, 4, 4, 9, None)],
    ids=["small-gqa", "vs-transformers-shape", "one-head-scale", "window-at-the-end"],
)
def test_native_window_update_matches_the_reference(d, hk, hv, dk, dv, base, scale) -> None:
    slots = base + d + (0 if base == 9 else 4)
    q, k, v, g, beta, pool = _inputs(d * 7 + dk, d, hk, hv, dk, dv, slots)
    real = np.arange(d) % 3 != 1  # every third row is padding
    want_out, want_pool = _oracle(q, k, v, g, beta, pool, base, real, scale)

    @functools.partial(jax.jit, donate_argnums=(5,))
    def run(q, k, v, g, beta, pool, base, real):
        return native.gated_delta_decode_window(q, k, v, g, beta, pool, base, real, scale=scale)

    out, got = run(q, k, v, g, beta, jnp.asarray(pool), jnp.int32(base), jnp.asarray(real))
    np.testing.assert_allclose(np.asarray(out)[real], want_out[real], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got), want_pool, atol=2e-5, rtol=1e-5)
    untouched = np.ones(slots, bool)
    untouched[base : base + d][real] = False
    assert np.array_equal(np.asarray(got)[untouched], pool[untouched])  # bit for bit


def test_ops_window_op_is_native_under_auto_only() -> None:
    """``ops.gated_delta_decode_window`` lowers to the FFI call on the CPU under ``auto`` and to
    plain XLA under a forced backend; each gives the reference's result."""
    q, k, v, g, beta, pool = _inputs(1, 4, 2, 4, 8, 8, 10)
    real = np.array([True, True, False, True])
    want_out, want_pool = _oracle(q, k, v, g, beta, pool, 2, real, None)
    for backend, native_call in (("auto", True), ("xla", False), ("pallas", False)):
        with ops.use_backend(backend):
            fn = jax.jit(lambda *a: ops.gated_delta_decode_window(*a))  # a new trace per backend
            args = (q, k, v, g, beta, jnp.asarray(pool), jnp.int32(2), jnp.asarray(real))
            text = fn.lower(*args).as_text()
            out, got = fn(*args)
        assert (native.WINDOW.target in text) == native_call, backend
        np.testing.assert_allclose(np.asarray(out)[real], want_out[real], atol=2e-5, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(got), want_pool, atol=2e-5, rtol=1e-5)


def test_native_window_refuses_a_window_outside_the_pool() -> None:
    q, k, v, g, beta, pool = _inputs(2, 4, 1, 2, 4, 4, 6)
    with pytest.raises(Exception, match="window leaves the pool"):
        out, _ = jax.jit(native.gated_delta_decode_window)(
            q, k, v, g, beta, jnp.asarray(pool), jnp.int32(3), jnp.ones(4, bool)
        )
        jax.block_until_ready(out)


def test_native_mode_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXFLOW_NATIVE", "yes")
    with pytest.raises(ValueError, match="RADIXFLOW_NATIVE"):
        native.mode()


def _local_includes(path: Path) -> set[str]:
    return set(re.findall(r'^#include "([^"/]+)"', path.read_text(), flags=re.M))


def test_native_build_key_covers_every_included_header() -> None:
    """Every header a source or header of the folder includes is in HEADERS, which the key hashes."""
    named = {h.name for h in native.HEADERS}
    for path in (*native.SOURCES, *native.HEADERS):
        assert _local_includes(path) <= named, path.name
    assert "common.h" in named


def test_native_build_key_changes_with_a_header(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    compiler = sys.executable  # the key only asks the compiler for its version: any program that prints one
    before = native.build_key(compiler)
    assert native.build_key(compiler) == before
    edited = tmp_path / "common.h"
    edited.write_bytes(native.HEADERS[0].read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(native, "HEADERS", (edited, *native.HEADERS[1:]))
    assert native.build_key(compiler) != before


_LETTERS = {"F32": "f=", "S32": "i"}  # a binding's dtype -> the Kernel.operands letters it may be


def _bound_dtypes(kernel: native.Kernel) -> list[str]:
    """The operand dtypes of the kernel's BindKernel<results, dtypes...> (or of BindScan's)."""
    text = Path(native.__file__).with_name(kernel.source).read_text()
    if "BindScan()" in text:
        text = Path(native.__file__).with_name("common.h").read_text().split("auto BindScan()")[1]
    (args,) = re.findall(r"BindKernel<\s*\d+\s*,([^>]*)>", text)
    return [a.strip().removeprefix("ffi::") for a in args.split(",")]


@pytest.mark.parametrize("kernel", native.KERNELS, ids=[k.source for k in native.KERNELS])
def test_native_operand_letters_match_the_binding(kernel: native.Kernel) -> None:
    dtypes = _bound_dtypes(kernel)
    assert len(dtypes) == len(kernel.operands)
    for dtype, letter in zip(dtypes, kernel.operands):
        assert letter in _LETTERS[dtype], (dtype, letter)


def _attention_inputs(seed: int, lens: list[int], hq: int, hkv: int, dim: int, page: int, max_pages: int):
    """Decode rows: row r's one token at position lens[r] - 1, its keys on shuffled pages; a row
    with length 0 is padding (no token)."""
    rng = np.random.default_rng(seed)
    rows = len(lens)
    pages = 1 + rows * max_pages
    k = rng.standard_normal((pages, page, hkv, dim)).astype(np.float32)
    v = rng.standard_normal((pages, page, hkv, dim)).astype(np.float32)
    table = (1 + rng.permutation(rows * max_pages)).reshape(rows, max_pages).astype(np.int32)
    ones = np.array([1 if n else 0 for n in lens], np.int32)
    cu = np.concatenate([[0], np.cumsum(ones)]).astype(np.int32)
    q = rng.standard_normal((rows, hq, dim)).astype(np.float32)
    return q, k, v, table, cu, np.array(lens, np.int32)


@pytest.mark.parametrize(
    "lens,hq,hkv,page,window,cap",
    [
        ([5, 1, 17, 32], 8, 2, 4, None, None),
        ([3, 0, 9, 0, 12], 4, 4, 8, None, None),
        ([40, 7, 33], 4, 1, 16, 10, None),
        ([6, 20], 2, 2, 4, None, 5.0),
    ],
    ids=["gqa", "padding-rows", "sliding-window", "soft-cap"],
)
def test_native_decode_attention_matches_the_reference(lens, hq, hkv, page, window, cap) -> None:
    from radixflow_jax.kernels.attention import paged_attention

    q, k, v, table, cu, kv = _attention_inputs(len(lens) + page, lens, hq, hkv, 16, page, 3 * (-(-max(lens) // page)))
    kw = dict(scale=0.25, sliding_window=window, logit_soft_cap=cap)
    want = np.asarray(paged_attention(q, k, v, table, cu, kv, **kw))
    got = np.asarray(jax.jit(functools.partial(native.paged_attention_decode, **kw))(q, k, v, table, cu, kv))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    assert not np.any(got[int(cu[-1]) :]), "padding tokens get 0"


def test_ops_attention_is_native_only_for_one_token_per_row() -> None:
    q, k, v, table, cu, kv = _attention_inputs(3, [5, 9, 2], 4, 2, 16, 4, 3)
    one_per_row = jax.jit(lambda *a: ops.paged_attention(*a, scale=0.25)).lower(q, k, v, table, cu, kv).as_text()
    assert native.ATTENTION.target in one_per_row
    two_tokens = np.concatenate([q, q[:1]])  # 4 tokens over 3 rows: the XLA formulation
    cu2 = np.array([0, 2, 3, 4], np.int32)
    text = jax.jit(lambda *a: ops.paged_attention(*a, scale=0.25)).lower(two_tokens, k, v, table, cu2, kv).as_text()
    assert native.ATTENTION.target not in text and native.BLOCKS.target in text  # many tokens: the block kernel
    with ops.use_backend("xla"):
        text = jax.jit(lambda *a: ops.paged_attention(*a, scale=0.25)).lower(two_tokens, k, v, table, cu2, kv).as_text()
    assert native.BLOCKS.target not in text


def test_ops_attention_leaves_windows_and_caps_the_kernel_does_not_take_to_xla() -> None:
    """``sliding_window=0`` (no key at all in the reference) and a negative soft cap are not the
    kernel's "absent" zero: such calls stay on the XLA formulation, with the reference's result."""
    from radixflow_jax.kernels.attention import paged_attention

    q, k, v, table, cu, kv = _attention_inputs(4, [5, 9, 2], 4, 2, 16, 4, 3)
    cases = [(dict(sliding_window=0), False), (dict(logit_soft_cap=-2.0), False)]
    cases.append((dict(sliding_window=3, logit_soft_cap=2.0), True))
    for kw, native_call in cases:
        fn = jax.jit(lambda *a, kw=kw: ops.paged_attention(*a, scale=0.25, **kw))
        assert (native.ATTENTION.target in fn.lower(q, k, v, table, cu, kv).as_text()) == native_call, kw
        want = np.asarray(paged_attention(q, k, v, table, cu, kv, scale=0.25, **kw))
        np.testing.assert_allclose(np.asarray(fn(q, k, v, table, cu, kv)), want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "chunk_size,hk,hv,dk,dv", [(4, 2, 4, 8, 6), (8, 1, 3, 6, 8), (64, 2, 2, 8, 4)], ids=["c4-gqa", "c8", "c64"]
)
def test_native_scan_matches_the_per_token_oracle(chunk_size, hk, hv, dk, dv) -> None:
    """``native.gated_delta_scan`` against the float64 per-token oracle of ``test_gated_delta``:
    outputs (0 past the rows), final states and every used chunk's end state; unused chunks are 0."""
    from tests.kernels import test_gated_delta as gd_case

    lens = gd_case.LENS
    inp = gd_case._make_inputs(chunk_size + dv, sum(lens) + gd_case.PAD, len(lens), hk, hv, dk, dv)
    fn = jax.jit(functools.partial(native.gated_delta_scan, chunk_size=chunk_size, scale=0.7))
    result = fn(inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(gd_case._cu(lens)), inp["init"])
    gd_case._check_against_oracle(result, inp, lens, chunk_size, 0.7)
    used = len(gd_case._used_chunks(lens, chunk_size))
    assert not np.any(np.asarray(result[2])[used:])


def test_ops_chunked_is_native_under_auto() -> None:
    from tests.kernels import test_gated_delta as gd_case

    inp = gd_case._make_inputs(5, 12, 2, 1, 2, 4, 4)
    args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray([0, 7, 10], np.int32), inp["init"])
    for backend, native_call in (("auto", True), ("xla", False)):
        with ops.use_backend(backend):
            text = jax.jit(lambda *a: ops.gated_delta_chunked(*a, chunk_size=4)).lower(*args).as_text()
        assert (native.SCAN.target in text) == native_call, backend


def test_native_scan_refuses_a_pair_chunk_off_the_contract() -> None:
    """A paired row must start from a used chunk of an unpaired row (``runner/inputs`` never builds
    anything else); the kernel refuses the rest instead of reading chunks being written."""
    from tests.kernels import test_gated_delta as gd_case

    lens = (8, 8, 8, 8)  # chunk 4: rows own chunks 0-1, 2-3, 4-5, 6-7; 4 unused chunks after
    inp = gd_case._make_inputs(3, 32, 4, 1, 2, 4, 4)
    args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(gd_case._cu(lens)), inp["init"])
    fn = jax.jit(functools.partial(native.gated_delta_scan, chunk_size=4))
    jax.block_until_ready(fn(*args, pair_chunk=jnp.asarray([-1, 1, -1, -1], jnp.int32)))  # row 0's chunk: fine
    for pair in ([-1, 5, 1, -1], [-1, 3, -1, -1], [-1, 9, -1, -1], [-1, 40, -1, -1]):  # paired, own, unused, past
        with pytest.raises(Exception, match="pair_chunk names no used chunk"):
            jax.block_until_ready(fn(*args, pair_chunk=jnp.asarray(pair, jnp.int32)))


@pytest.mark.parametrize("chunk_size,groups", [(4, 1), (8, 2), (64, 2)], ids=["c4", "c8-groups", "c64"])
def test_native_ssd_scan_matches_the_per_token_oracle(chunk_size: int, groups: int) -> None:
    """``native.ssd_scan`` against the float64 per-token oracle of ``test_ssd``: outputs (0 past the
    rows), final states (a zero-length row keeps its initial state), every used chunk; unused 0."""
    from tests.kernels import test_ssd as ssd_case

    lens = ssd_case.LENS
    inp = ssd_case.make_inputs(chunk_size + groups, lens, ssd_case.PAD, heads=4, p=3, n=5, groups=groups)
    y, final, chunks = jax.jit(functools.partial(native.ssd_scan, chunk_size=chunk_size))(**inp)
    y64, states64 = ssd_case.numpy_oracle(inp)
    assert ssd_case.max_diff(y, y64) <= ssd_case.TOL and not np.any(np.asarray(y)[sum(lens) :])
    for r, length in enumerate(lens):
        assert ssd_case.max_diff(final[r], states64[r][length]) <= ssd_case.TOL
    np.testing.assert_array_equal(np.asarray(final)[1], inp["initial_state"][1])
    used = ssd_case.used_chunks(lens, chunk_size)
    for idx, row, done in used:
        assert ssd_case.max_diff(chunks[idx], states64[row][done]) <= ssd_case.TOL, (idx, row, done)
    assert not np.any(np.asarray(chunks)[len(used) :])


def test_ops_ssd_is_native_under_auto() -> None:
    from tests.kernels import test_ssd as ssd_case

    inp = ssd_case.make_inputs(1, (3, 4), 1, heads=2, p=3, n=4, groups=1)
    args = tuple(jnp.asarray(inp[k]) for k in ("x", "dt", "A", "B", "C", "cu_seqlens", "initial_state"))
    for backend, native_call in (("auto", True), ("xla", False)):
        with ops.use_backend(backend):
            text = jax.jit(lambda *a: ops.ssd_chunked(*a, chunk_size=4)).lower(*args).as_text()
        assert (native.SSD.target in text) == native_call, backend


def _round_inputs(seed: int, spans: list[tuple[int, int]], pad: int, hq: int, hkv: int, dim: int, page: int):
    """Rows of ``(new tokens, context)`` on shuffled pages, then ``pad`` padding tokens."""
    rng = np.random.default_rng(seed)
    max_pages = max(-(-max(ctx, 1) // page) for _, ctx in spans) + 1
    pages = 1 + len(spans) * max_pages
    k = rng.standard_normal((pages, page, hkv, dim)).astype(np.float32)
    v = rng.standard_normal((pages, page, hkv, dim)).astype(np.float32)
    table = (1 + rng.permutation(len(spans) * max_pages)).reshape(len(spans), max_pages).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum([n for n, _ in spans])]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]) + pad, hq, dim)).astype(np.float32)
    return q, k, v, table, cu, np.array([ctx for _, ctx in spans], np.int32)


@pytest.mark.parametrize(
    "spans,hq,hkv,dim,page,window,cap,block",
    [
        ([(1, 9), (1, 30), (13, 13), (21, 40), (7, 23)], 8, 2, 16, 4, None, None, 4),  # mixed, off the grids
        ([(37, 50), (0, 0), (5, 5), (1, 1)], 4, 4, 64, 16, None, None, 16),  # rep 1, an empty row
        ([(1, 33), (19, 60)], 6, 2, 16, 8, 10, None, 8),
        ([(9, 17), (3, 3)], 2, 1, 16, 4, None, 5.0, 4),
        ([(6, 4), (12, 30)], 4, 2, 16, 4, 6, 3.0, 16),  # row 0: its first tokens have no key
        ([(1, 40), (1, 3), (5, 20), (1, 1)], 4, 2, 16, 4, 7, 4.0, 8),  # one-token rows (RunOne), window, cap
    ],
    ids=["mixed-gqa", "rep1-empty-row", "sliding-window", "soft-cap", "no-keys-window-cap", "one-token-rows"],
)
def test_native_block_attention_matches_the_reference(spans, hq, hkv, dim, page, window, cap, block) -> None:
    """``native.paged_attention_blocks`` against ``kernels/attention.paged_attention``: rows of many
    tokens starting off the page and block grids, decode rows first, padding tokens past cu[R] (0);
    blocks of one token (one-token rows, a row's last block) take the kernel's direct path."""
    from radixflow_jax.kernels.attention import paged_attention

    q, k, v, table, cu, kv = _round_inputs(len(spans) + dim, spans, 3, hq, hkv, dim, page)
    kw = dict(scale=0.3, sliding_window=window, logit_soft_cap=cap)
    want = np.asarray(paged_attention(q, k, v, table, cu, kv, **kw))
    fn = jax.jit(functools.partial(native.paged_attention_blocks, block_q=block, **kw))
    got = np.asarray(fn(q, k, v, table, cu, kv))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    assert not np.any(got[int(cu[-1]) :]), "padding tokens get 0"
