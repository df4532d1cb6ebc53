"""Mixed rounds: decode rows next to prefill rows take the decode region (one-step updates,
single-query attention); buckets and the fixed-shape mode; outputs equal a run that never mixes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from radixflow_jax import LLM, SamplingParams
from radixflow_jax.runner.inputs import build_arrays
from radixflow_jax.runner.shapes import FEW_EMITS, MODES, ShapeConfig, Variant, fine_ladder
from radixflow_jax.scheduler.plan import RoundPlan, RoundStats, RowPlan
from tests.engine.workloads import GUARDED, SMALL_FIXED, shared_prefix_prompts

PAGE = 4


def _row(rid, tokens, start, pages, slot, emits=(), sample=True) -> RowPlan:
    return RowPlan(
        request_id=rid,
        tokens=tuple(tokens),
        start=start,
        pages=tuple(pages),
        slot=slot,
        copy_from=None,
        emits=tuple(emits),
        sample=sample,
    )


def test_select_puts_decode_rows_in_the_decode_region() -> None:
    shapes = ShapeConfig(max_num_batched_tokens=1024, max_num_seqs=64, max_pages_per_row=32, grid=64)
    v = shapes.select(54 + 300, 58, num_decode=54)  # 54 decode rows + 4 prefill rows of 300 tokens
    assert (v.num_decode, v.prefill_rows, v.prefill_tokens, v.kind) == (64, 4, 320, "mixed")
    assert shapes.select(40, 40, num_decode=40) == shapes.select(40, 40, all_decode=True)
    assert shapes.select(40, 40, all_decode=True).num_tokens == 48  # 1.5x step: 48, not 64
    prefill = shapes.select(700, 3, num_decode=0)
    assert (prefill.num_decode, prefill.prefill_tokens, prefill.kind) == (16, 768, "mixed")  # padded decode region
    for mode in MODES:
        s = ShapeConfig(max_num_batched_tokens=128, max_num_seqs=8, max_pages_per_row=8, grid=16, mode=mode)
        every = set(s.variants())
        for tokens, rows, decode in [(1, 1, 1), (8, 8, 8), (128, 8, 0), (100, 8, 7), (9, 3, 1), (17, 2, 0)]:
            for emits in (None, 0, FEW_EMITS, FEW_EMITS + 1):
                assert s.select(tokens, rows, num_decode=decode, num_emits=emits) in every, (mode, tokens, rows, decode)
        # riders: rows without tokens (a producer's 1 or 2 tokens and up to 7 riders; decode rows beside them)
        for tokens, rows, decode, riders in [(1, 8, 0, 7), (2, 8, 0, 6), (3, 8, 1, 6), (5, 8, 3, 4), (1, 2, 0, 1)]:
            assert s.select(tokens, rows, num_decode=decode, num_riders=riders) in every, (mode, tokens, rows, riders)
    # the review's case
    wide = ShapeConfig(max_num_batched_tokens=1024, max_num_seqs=64, max_pages_per_row=32, grid=64)
    assert wide.select(8, 17, num_decode=0, num_riders=16) in set(wide.variants())
    fixed = ShapeConfig(max_num_batched_tokens=128, max_num_seqs=8, max_pages_per_row=8, grid=16, mode="fixed")
    assert len(fixed.variants()) == 1
    with pytest.raises(ValueError, match="bucket mode"):
        ShapeConfig(max_num_batched_tokens=128, max_num_seqs=8, max_pages_per_row=8, grid=16, mode="powers")
    assert fine_ladder(16, 1024, 64) == (16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
    assert shapes.token_buckets == (16, 32, 48, 64, 80, 96, 112, 128, 192, 256, 320, 384, 448, 512, 768, 1024)


def test_decode_rounds_that_emit_little_take_the_small_emit_bucket() -> None:
    """A decode-only round with at most FEW_EMITS checkpoint writes runs in a variant with that
    many emit entries; more writes, or any prefill row, keep the full count. A decode row emits
    only after its one token (the model reads no decode row's initial state for an emit)."""
    shapes = ShapeConfig(max_num_batched_tokens=1024, max_num_seqs=64, max_pages_per_row=32, grid=64)
    full = shapes.select(64, 64, num_decode=64)
    assert full.max_emits == 65
    for emits in (0, FEW_EMITS):
        few = shapes.select(64, 64, num_decode=64, num_emits=emits)
        assert few == Variant(64, 64, 64, max_emits=FEW_EMITS)
    assert shapes.select(64, 64, num_decode=64, num_emits=FEW_EMITS + 1) == full
    assert shapes.select(48 + 40, 49, num_decode=48, num_emits=0).max_emits > FEW_EMITS  # mixed: unchanged
    assert shapes.select(2, 2, num_decode=2, num_emits=0).max_emits == 2  # already smaller than the bucket
    # a plan with more emits than its variant holds is refused before anything is written
    rows = tuple(_row(i, [5], 3, [i], i + 1, emits=((1, 100 + i),)) for i in range(FEW_EMITS + 1))
    plan = RoundPlan(rows, len(rows), RoundStats())
    small = shapes.select(plan.num_tokens, len(rows), num_decode=len(rows), num_emits=FEW_EMITS)
    with pytest.raises(ValueError, match="emits"):
        build_arrays(plan, small, page_size=PAGE, max_pages=32, sampling={})
    fitting = shapes.select(plan.num_tokens, len(rows), num_decode=len(rows), num_emits=plan.num_emits)
    built = build_arrays(plan, fitting, page_size=PAGE, max_pages=32, sampling={})
    assert (built.inputs.emit_slots > 0).sum() == FEW_EMITS + 1
    at_start = RoundPlan((_row(0, [5], 3, [0], 1, emits=((0, 100),)),), 1, RoundStats())
    with pytest.raises(ValueError, match="after its one token"):
        build_arrays(at_start, shapes.select(1, 1, num_decode=1), page_size=PAGE, max_pages=32, sampling={})


def test_mixed_layout_pads_the_decode_region() -> None:
    decode = _row(10, [7], 5, [3, 5], slot=2)
    prefill = _row(12, [21, 22, 23], 0, [4], slot=1, emits=[(3, 9)])
    plan = RoundPlan(rows=(decode, prefill), num_decode=1, stats=RoundStats())
    variant = Variant(num_tokens=3 + 8, num_rows=3 + 2, num_decode=3, max_emits=6)
    built = build_arrays(plan, variant, page_size=PAGE, max_pages=2, sampling={})
    a = built.inputs
    np.testing.assert_array_equal(a.tokens, [7, 0, 0, 21, 22, 23, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(a.cu_seqlens, [0, 1, 2, 3, 6, 6])  # padding decode rows own one slot each
    np.testing.assert_array_equal(a.kv_lens, [6, 1, 1, 3, 0])
    np.testing.assert_array_equal(a.slot_mapping[:6], [5 * PAGE + 1, 0, 0, 16, 17, 18])
    np.testing.assert_array_equal(a.state_slots, [2, 0, 0, 1, 0])
    np.testing.assert_array_equal(a.emit_rows[:1], [3])
    np.testing.assert_array_equal(built.plan_rows, [0, 3])
    np.testing.assert_array_equal(a.logits_index[[0, 3]], [0, 5])
    assert "plan_rows" not in a._fields  # host only


@pytest.mark.parametrize("layout", ["window", "packed"])
@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-bamba"])
def test_mixed_rounds_equal_unmixed_runs(model: str, layout: str, tiny_model) -> None:
    """Requests arriving while others decode make mixed rounds (fine buckets, prefix cache on);
    each request's greedy output equals the one it gets alone (no other request in its rounds:
    never mixed) with the prefix cache off in the fixed bucket mode, so the bucket modes agree too.
    ``window``: the decoding rows of those rounds take the decode region; ``packed``: they run in
    the prefill region beside the prompts (Gated DeltaNet and Mamba2 scans over one-token rows).
    Shapes shared through the XLA cache: the compile guard's (``GUARDED``: every fine variant of
    tiny-qwen3.5 compiled there) and the engine tests' oracle (``SMALL_FIXED``)."""
    prompts = shared_prefix_prompts(num_prefixes=2, per_prefix=3, prefix_len=70, suffix_len=9, vocab=500)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    llm = LLM(tiny_model(model), **GUARDED, mixed_layout=layout)
    core = llm.engine
    rids = []
    for i, p in enumerate(prompts):
        rids.append(core.add_request(p, params))
        core.step()
        if i % 2:
            core.step()
    core.run_until_done()
    got = [core.output(r).token_ids for r in rids]
    joined = [r for r in core.records if 0 < r.num_decode < r.num_rows]  # decoding rows beside prompts
    assert joined and all(r.kind == "mixed" and r.decode_slots >= r.num_decode for r in joined) == (layout == "window")
    assert layout == "window" or all(r.decode_slots == 0 for r in joined)
    alone = LLM(llm.model, **{**SMALL_FIXED, "policy": "no-cache"})
    want = [alone.generate([p], params)[0].token_ids for p in prompts]
    assert all(r.kind != "mixed" for r in alone.engine.records)
    assert got == want


def test_lean_rounds_of_the_server_shape_pad_little_and_stay_in_the_variant_set() -> None:
    """At ``radixflow serve --max-num-seqs 16`` (512 tokens), fine buckets: a chat turn (one prefill
    row of 41 tokens beside 3 decode rows) runs in 4 + 48 slots, not 16 + 64; every round the
    budgets allow selects a listed variant (decode span = decode rows; riders none). A first chat
    turn (300 tokens beside 8 decode rows) takes 320 slots, not 384."""
    s = ShapeConfig(max_num_batched_tokens=512, max_num_seqs=16, max_pages_per_row=256, grid=64)
    assert s.token_buckets[:8] == (16, 32, 48, 64, 80, 96, 112, 128)
    assert s.token_buckets[8:] == (192, 256, 320, 384, 448, 512)
    assert s.select(8 + 300, 9, num_decode=8).prefill_tokens == 320
    packed = dataclasses.replace(s, mixed_layout="packed")  # the CPU's layout: every row in the prefill region
    assert packed.select(8 + 300, 9, num_decode=0).num_tokens == 320
    assert s.decode_buckets == (2, 3, 4, 6, 8, 12, 16)
    turn = s.select(3 + 41, 4, num_decode=3)
    assert (turn.num_decode, turn.prefill_tokens, turn.prefill_rows) == (4, 48, 1)
    assert s.select(5 + 41, 6, num_decode=5).num_decode == 16  # more decode rows: the coarse region
    assert s.select(3 + 41 + 9, 5, num_decode=3).num_decode == 16  # two prefill rows: the coarse region
    assert s.select(3 + 120, 4, num_decode=3).num_decode == 16  # a prefill region over 112 tokens: coarse
    every = set(s.variants())
    assert len(every) == len(s.variants()) == 88
    for decode in range(17):
        for rows in range(max(decode, 1), 17):
            for tokens in [rows] if rows == decode else range(rows, 513, 7):  # a decode-only round: 1 token a row
                v = s.select(tokens, rows, num_decode=decode, decode_span=decode)
                assert v in every and v.num_tokens >= tokens and v.num_rows >= rows, (tokens, rows, decode)


def test_packed_rounds_have_no_decode_region_and_stay_in_the_variant_set() -> None:
    """``mixed_layout="packed"`` at the server's shape: a chat turn beside 6 decoding rows runs in 48
    token slots with no decode region (64 with one), a decode-only round keeps its region, the
    variants are one mixed set over row buckets from 2 (67, against 88), and every round the
    budgets allow selects a listed variant; ``fixed`` keeps its one variant."""
    s = ShapeConfig(max_num_batched_tokens=512, max_num_seqs=16, max_pages_per_row=256, grid=64, mixed_layout="packed")
    window = ShapeConfig(max_num_batched_tokens=512, max_num_seqs=16, max_pages_per_row=256, grid=64)
    turn, wide = s.select(6 + 40, 7, num_decode=6, decode_span=6), window.select(6 + 40, 7, num_decode=6, decode_span=6)
    assert (turn.num_tokens, turn.num_rows, turn.num_decode, turn.kind) == (48, 8, 0, "prefill")
    assert (wide.num_tokens, wide.num_decode) == (64, 16)
    assert s.select(6, 6, num_decode=6, decode_span=9) == window.select(6, 6, num_decode=6, decode_span=9)
    every = s.variants()
    assert len(every) == len(set(every)) == 67 and all(v.num_decode == 0 for v in every if v.kind != "decode")
    for decode in range(17):
        for rows in range(max(decode, 1), 17):
            for tokens in [rows] if rows == decode else range(rows, 513, 7):
                v = s.select(tokens, rows, num_decode=decode, decode_span=decode)
                assert v in every and v.num_tokens >= tokens and v.num_rows >= rows, (tokens, rows, decode)
    fixed = ShapeConfig(max_num_batched_tokens=64, max_num_seqs=4, max_pages_per_row=8, grid=16, mode="fixed",
                        mixed_layout="packed")  # fmt: skip
    assert fixed.variants() == [fixed.select(10, 3, num_decode=2)] and fixed.select(10, 3, num_decode=2).num_decode == 4
    with pytest.raises(ValueError, match="mixed_layout"):
        ShapeConfig(max_num_batched_tokens=64, max_num_seqs=4, max_pages_per_row=8, grid=16, mixed_layout="flat")
