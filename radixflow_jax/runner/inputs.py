"""Turn a round plan into the fixed-shape numpy arrays of one step (host side, no JAX).

Padding rules (DESIGN.md section 4): padding tokens write their KV into the reserved page 0,
padding rows run in the reserved state slot 0 and copy slot 0 onto itself, padding emits write
slot 0. A padded token never changes a real page or slot.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from radixflow_jax.runner.shapes import Variant
from radixflow_jax.scheduler.plan import RoundPlan


@dataclasses.dataclass(frozen=True)
class SamplingRow:
    """Per-request sampling settings as the device needs them (``top_k`` 0 = off)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0


GREEDY = SamplingRow()


@dataclasses.dataclass
class StepArrays:
    """Every array the step takes, by name; shapes depend only on the variant."""

    tokens: np.ndarray  # int32 [T]
    cu_seqlens: np.ndarray  # int32 [R + 1]
    kv_lens: np.ndarray  # int32 [R]
    page_table: np.ndarray  # int32 [R, max_pages]
    slot_mapping: np.ndarray  # int32 [T]
    state_slots: np.ndarray  # int32 [R]
    copy_src: np.ndarray  # int32 [R]
    emit_rows: np.ndarray  # int32 [M]
    emit_offsets: np.ndarray  # int32 [M]
    emit_slots: np.ndarray  # int32 [M]
    logits_index: np.ndarray  # int32 [R]: last token of each row
    temperature: np.ndarray  # float32 [R]
    top_k: np.ndarray  # int32 [R]
    top_p: np.ndarray  # float32 [R]
    min_p: np.ndarray  # float32 [R]
    seed: np.ndarray  # uint32 [R]
    position: np.ndarray  # int32 [R]: position of the sampled token (per-request RNG stream)

    def as_dict(self) -> dict[str, np.ndarray]:
        return dataclasses.asdict(self)


def build_arrays(
    plan: RoundPlan, variant: Variant, *, page_size: int, max_pages: int, sampling: Mapping[int, SamplingRow]
) -> StepArrays:
    t, r, m = variant.num_tokens, variant.num_rows, variant.max_emits
    # checked before filling: an oversized plan must raise this, not an index/broadcast error halfway
    num_tokens, num_emits = sum(len(row.tokens) for row in plan.rows), sum(len(row.emits) for row in plan.rows)
    if num_tokens > t or len(plan.rows) > r or num_emits > m:
        raise ValueError(f"plan ({num_tokens} tokens, {len(plan.rows)} rows, {num_emits} emits) exceeds variant {variant}")
    a = StepArrays(
        tokens=np.zeros(t, np.int32),
        cu_seqlens=np.zeros(r + 1, np.int32),
        kv_lens=np.zeros(r, np.int32),
        page_table=np.zeros((r, max_pages), np.int32),
        slot_mapping=np.zeros(t, np.int32),
        state_slots=np.zeros(r, np.int32),
        copy_src=np.zeros(r, np.int32),
        emit_rows=np.zeros(m, np.int32),
        emit_offsets=np.zeros(m, np.int32),
        emit_slots=np.zeros(m, np.int32),
        logits_index=np.zeros(r, np.int32),
        temperature=np.zeros(r, np.float32),
        top_k=np.zeros(r, np.int32),
        top_p=np.ones(r, np.float32),
        min_p=np.zeros(r, np.float32),
        seed=np.zeros(r, np.uint32),
        position=np.zeros(r, np.int32),
    )
    cursor = emit = 0
    for i, row in enumerate(plan.rows):
        n = len(row.tokens)
        if len(row.pages) > max_pages:
            raise ValueError(f"request {row.request_id} needs {len(row.pages)} pages, the page table holds {max_pages}")
        if len(row.pages) * page_size < row.start + n:
            raise ValueError(
                f"request {row.request_id}: {len(row.pages)} pages of {page_size} do not cover positions "
                f"{row.start}..{row.start + n - 1}"
            )
        a.tokens[cursor : cursor + n] = row.tokens
        pos = np.arange(row.start, row.start + n)
        pages = np.asarray(row.pages, np.int32)
        a.slot_mapping[cursor : cursor + n] = pages[pos // page_size] * page_size + pos % page_size
        a.page_table[i, : len(row.pages)] = pages
        a.kv_lens[i] = row.start + n
        a.state_slots[i] = row.slot
        a.copy_src[i] = row.copy_from if row.copy_from is not None else row.slot
        for offset, slot in row.emits:
            a.emit_rows[emit], a.emit_offsets[emit], a.emit_slots[emit] = i, offset, slot
            emit += 1
        cursor += n
        a.cu_seqlens[i + 1] = cursor
        a.logits_index[i] = cursor - 1
        s = sampling.get(row.request_id, GREEDY)
        a.temperature[i], a.top_k[i], a.top_p[i], a.min_p[i] = s.temperature, s.top_k, s.top_p, s.min_p
        a.seed[i], a.position[i] = np.uint32(s.seed & 0xFFFFFFFF), row.start + n
    a.cu_seqlens[len(plan.rows) + 1 :] = cursor
    return a
