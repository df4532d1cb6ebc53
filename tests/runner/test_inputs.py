"""``build_arrays``: a hand-made round plan (two decode rows, a prefill row, padding) becomes the
exact fixed-shape arrays the step expects; padding points at the reserved page 0 / slot 0."""

from __future__ import annotations

import numpy as np
import pytest

from radixflow_jax.runner.inputs import BIAS_WIDTH, SamplingRow, StepInputs, build_arrays
from radixflow_jax.runner.shapes import ShapeConfig, Variant
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan

PAGE = 4
MAX_PAGES = 4


def _row(rid, tokens, start, pages, slot, copy_from=None, emits=(), sample=True) -> RowPlan:
    return RowPlan(
        request_id=rid,
        tokens=tuple(tokens),
        start=start,
        pages=tuple(pages),
        slot=slot,
        copy_from=copy_from,
        emits=tuple(emits),
        sample=sample,
    )


def _plan(*rows: RowPlan) -> RoundPlan:
    return RoundPlan(rows=tuple(rows), num_decode=sum(r.is_decode for r in rows), stats=RoundStats())


# decode at position 5 (page index 1 -> page 5), decode at position 8 (page index 2 -> page 6) that
# emits a checkpoint, and a 6-token prefill from position 2 that resumes from checkpoint slot 5
DECODE_A = _row(10, [7], 5, [3, 5], slot=2)
DECODE_B = _row(11, [8], 8, [1, 2, 6], slot=3, emits=[(1, 7)])
PREFILL = _row(12, [21, 22, 23, 24, 25, 26], 2, [4, 9], slot=1, copy_from=5, emits=[(2, 8), (6, 9)], sample=False)
VARIANT = Variant(num_tokens=16, num_rows=4, num_decode=0, max_emits=6)
SAMPLING = {
    10: SamplingRow(temperature=0.5, top_k=7, top_p=0.9, min_p=0.05, seed=(1 << 40) + 3),
    12: SamplingRow(temperature=1.0, seed=99),
}


@pytest.fixture(scope="module")
def arrays() -> StepInputs:
    plan = _plan(DECODE_A, DECODE_B, PREFILL)
    return build_arrays(plan, VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling=SAMPLING).inputs


def test_shapes_depend_only_on_the_variant(arrays) -> None:
    d = arrays._asdict()
    expected = {
        "tokens": (16,), "cu_seqlens": (5,), "kv_lens": (4,), "page_table": (4, MAX_PAGES), "slot_mapping": (16,),
        "state_slots": (4,), "copy_src": (4,), "emit_rows": (6,), "emit_offsets": (6,), "emit_slots": (6,),
        "logits_index": (4,), "temperature": (4,), "top_k": (4,), "top_p": (4,), "min_p": (4,), "seed": (4,),
        "position": (4,), "presence": (4,), "frequency": (4,), "repetition": (4,), "ctx_ids": (4, 0), "ctx_out": (4, 0), "want_logprobs": (4,), "pair_emit": (4,), "decode_base": (),
        "bias_ids": (4, BIAS_WIDTH), "bias_vals": (4, BIAS_WIDTH), "bias_until": (4, BIAS_WIDTH),
        "token_mask": (4, 0),  # no grammar mask unless mask_words is given
        "splice_src": (16,), "prev_tokens": (4,),  # no splice; prev_tokens as long as num_out, at least R
        "verify_index": (0,),  # no verify points outside a verify variant (speculative decoding)
        "verify_ctx_end": (0,), "verify_mask": (0, 0), "verify_drafts": (4,),
        "mtp_next": (16,),  # MTP drafts: each slot's next token where known (runner/mtpstep.py)
    }  # fmt: skip
    assert {k: v.shape for k, v in d.items()} == expected
    assert d["seed"].dtype == np.uint32
    assert d["temperature"].dtype == np.float32
    floats = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition", "bias_vals")
    assert all(d[k].dtype == np.int32 for k in expected if k not in ("seed", "ctx_out", "want_logprobs", *floats))
    assert d["splice_src"].tolist() == [-1] * 16
    empty = build_arrays(_plan(), VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling={}).inputs
    assert {k: v.shape for k, v in empty._asdict().items()} == expected
    assert list(d) == list(StepInputs._fields)  # the pytree's leaves, in the order the step flattens them


def test_tokens_and_ragged_layout(arrays) -> None:
    np.testing.assert_array_equal(arrays.tokens, [7, 8, 21, 22, 23, 24, 25, 26] + [0] * 8)
    np.testing.assert_array_equal(arrays.cu_seqlens, [0, 1, 2, 8, 8])  # padding row: empty span
    np.testing.assert_array_equal(arrays.kv_lens, [6, 9, 8, 0])
    np.testing.assert_array_equal(arrays.logits_index, [0, 1, 7, 0])  # last token of each row


def test_slot_mapping_and_page_table(arrays) -> None:
    # position p of a row writes page pages[p // PAGE], offset p % PAGE
    real = [5 * PAGE + 1, 6 * PAGE + 0] + [4 * PAGE + 2, 4 * PAGE + 3, 9 * PAGE + 0, 9 * PAGE + 1, 9 * PAGE + 2, 9 * PAGE + 3]
    np.testing.assert_array_equal(arrays.slot_mapping[:8], real)
    np.testing.assert_array_equal(arrays.slot_mapping[8:], 0)  # padding tokens write page 0
    np.testing.assert_array_equal(arrays.page_table, [[3, 5, 0, 0], [1, 2, 6, 0], [4, 9, 0, 0], [0, 0, 0, 0]])


def test_mtp_next_tokens() -> None:
    """Each slot's next token where the host knows it (MTP drafts, ``runner/mtpstep.py``): the row's
    next token inside a span, a chunk's ``next_token`` at its end, -1 (the step's sample) at a
    sampling row's end and at every slot of a verify row."""
    import dataclasses

    chunk = dataclasses.replace(PREFILL, next_token=27)
    verify = dataclasses.replace(_row(13, [31, 32, 33], 4, [8, 7], slot=4, copy_from=6), num_draft=2)
    plan = _plan(DECODE_A, chunk, verify)
    variant = Variant(num_tokens=16, num_rows=4, num_decode=0, max_emits=6, num_verify=8)
    got = build_arrays(plan, variant, page_size=PAGE, max_pages=MAX_PAGES, sampling=SAMPLING, mtp=True).inputs
    np.testing.assert_array_equal(got.mtp_next, [-1, 22, 23, 24, 25, 26, 27, -1, -1, -1] + [-1] * 6)
    plain = build_arrays(plan, variant, page_size=PAGE, max_pages=MAX_PAGES, sampling=SAMPLING).inputs
    assert (plain.mtp_next == -1).all()  # an engine that does not draft with MTP writes none


def test_state_slots_copies_and_emits(arrays) -> None:
    np.testing.assert_array_equal(arrays.state_slots, [2, 3, 1, 0])
    # no copy: a row copies its own slot onto itself; padding copies slot 0 onto itself
    np.testing.assert_array_equal(arrays.copy_src, [2, 3, 5, 0])
    np.testing.assert_array_equal(arrays.emit_rows, [1, 2, 2, 0, 0, 0])
    np.testing.assert_array_equal(arrays.emit_offsets, [1, 2, 6, 0, 0, 0])
    np.testing.assert_array_equal(arrays.emit_slots, [7, 8, 9, 0, 0, 0])  # padding emits write slot 0


def test_sampling_columns(arrays) -> None:
    np.testing.assert_allclose(arrays.temperature, [0.5, 0.0, 1.0, 0.0])  # request 11 has no entry: greedy
    np.testing.assert_array_equal(arrays.top_k, [7, 0, 0, 0])
    np.testing.assert_allclose(arrays.top_p, [0.9, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(arrays.min_p, [0.05, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(arrays.seed, [3, 0, 99, 0])  # seeds wrap to 32 bits
    np.testing.assert_array_equal(arrays.position, [6, 9, 8, 0])  # position of the token to sample


def test_decode_variant_from_shapes() -> None:
    shapes = ShapeConfig(max_num_batched_tokens=16, max_num_seqs=4, max_pages_per_row=MAX_PAGES, grid=8)
    plan = _plan(DECODE_A, DECODE_B)
    variant = shapes.select(plan.num_tokens, len(plan.rows), all_decode=True)
    assert (variant.num_tokens, variant.num_rows, variant.num_decode) == (2, 2, 2)
    a = build_arrays(plan, variant, page_size=PAGE, max_pages=MAX_PAGES, sampling={}).inputs
    np.testing.assert_array_equal(a.tokens, [7, 8])
    np.testing.assert_array_equal(a.cu_seqlens, [0, 1, 2])
    np.testing.assert_array_equal(a.slot_mapping, [21, 24])
    np.testing.assert_array_equal(a.copy_src, [2, 3])
    assert variant in shapes.variants()


def test_same_plan_same_arrays() -> None:
    plan = _plan(DECODE_A, DECODE_B, PREFILL)
    a = build_arrays(plan, VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling=SAMPLING).inputs._asdict()
    b = build_arrays(plan, VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling=SAMPLING).inputs._asdict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize(
    "variant",
    [
        Variant(num_tokens=4, num_rows=4, num_decode=0, max_emits=6),  # 8 tokens > 4
        Variant(num_tokens=16, num_rows=2, num_decode=0, max_emits=6),  # 3 rows > 2
        Variant(num_tokens=16, num_rows=4, num_decode=0, max_emits=2),  # 3 emits > 2
    ],
)
def test_plan_exceeding_the_variant_raises(variant: Variant) -> None:
    with pytest.raises(ValueError, match="exceeds variant"):
        build_arrays(_plan(DECODE_A, DECODE_B, PREFILL), variant, page_size=PAGE, max_pages=MAX_PAGES, sampling={})


def test_too_many_pages_raises() -> None:
    row = _row(1, [1], 20, [1, 2, 3, 4, 5, 6], slot=0)
    with pytest.raises(ValueError, match="page table"):
        build_arrays(_plan(row), VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling={})


def test_pages_not_covering_the_span_raise() -> None:
    row = _row(1, [1, 2, 3], 6, [1, 2], slot=0)  # positions 6..8 need 3 pages of 4
    with pytest.raises(ValueError, match="pages"):
        build_arrays(_plan(row), VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling={})


def test_bias_and_min_tokens_bans_fill_the_bias_arrays() -> None:
    sampling = {10: SamplingRow(bias=((4, 2.5), (8, -100.0)), ban=(2, 3), ban_until=9), 12: SamplingRow()}
    built = build_arrays(_plan(DECODE_A, DECODE_B, PREFILL), VARIANT, page_size=PAGE, max_pages=MAX_PAGES,
                         sampling=sampling)  # fmt: skip
    a, row = built.inputs, int(built.plan_rows[0])  # request 10
    np.testing.assert_array_equal(a.bias_ids[row, :5], [4, 8, 2, 3, -1])
    np.testing.assert_array_equal(a.bias_vals[row, :4], [2.5, -100.0, -np.inf, -np.inf])
    assert a.bias_until[row, 0] == np.iinfo(np.int32).max and list(a.bias_until[row, 2:4]) == [9, 9]
    assert (a.bias_ids[[r for r in range(4) if r != row]] == -1).all()
    crowded = {10: SamplingRow(bias=tuple((i, 1.0) for i in range(BIAS_WIDTH)), ban=(2,), ban_until=3)}
    with pytest.raises(ValueError, match="bias slots"):
        build_arrays(_plan(DECODE_A, DECODE_B, PREFILL), VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling=crowded)


class _OnlyToken:
    """A stand-in grammar (``RowMask``) that allows one token and counts its calls."""

    def __init__(self, token: int):
        self.token, self.calls = token, 0

    def mask_into(self, row: np.ndarray) -> None:
        self.calls += 1
        row[:] = 0
        row[self.token // 32] = np.int32(1 << (self.token % 32)) if self.token % 32 != 31 else np.int32(-(1 << 31))


def test_grammar_masks_fill_only_sampled_rows() -> None:
    g10, g12 = _OnlyToken(40), _OnlyToken(3)
    sampling = {10: SamplingRow(grammar=g10), 12: SamplingRow(grammar=g12)}  # request 12 does not sample
    built = build_arrays(_plan(DECODE_A, DECODE_B, PREFILL), VARIANT, page_size=PAGE, max_pages=MAX_PAGES,
                         sampling=sampling, mask_words=3)  # fmt: skip
    a, row = built.inputs, int(built.plan_rows[0])
    assert built.masked_rows == 1
    assert a.token_mask.shape == (4, 3) and (g10.calls, g12.calls) == (1, 0)
    np.testing.assert_array_equal(a.token_mask[row], [0, 1 << 8, 0])
    assert (a.token_mask[[r for r in range(4) if r != row]] == -1).all()  # no grammar: all ones
    with pytest.raises(ValueError, match="grammar mask"):
        build_arrays(_plan(DECODE_A), VARIANT, page_size=PAGE, max_pages=MAX_PAGES, sampling=sampling)
