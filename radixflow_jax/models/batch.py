"""The device-side inputs of one model call and the pools it reads and writes.

A call processes a *packed ragged batch*: ``T`` token slots and ``R`` request rows. Row ``r`` owns
packed tokens ``cu_seqlens[r]:cu_seqlens[r+1]``; slots after ``cu_seqlens[R]`` are padding. The first
``num_decode`` rows (a static count) are one-token decode rows owning the first ``num_decode``
token slots; they take the recurrent one-step update instead of the chunked scan, on the states of
one contiguous window of slots (``decode_base``: decode row ``r`` runs in slot ``decode_base + r``).

Invariants (the runner guarantees them, the model relies on them):
  * ``kv_lens[r]`` is row r's context length *including* this span; its KV for positions
    ``< kv_lens[r] - span_len`` is already in the pages named by ``page_table[r]``.
  * ``slot_mapping[t] = page * page_size + offset`` of token t's KV; padding tokens map into the
    reserved page 0. ``state_slots[r]`` names row r's recurrent state slot; padding rows use the
    reserved slot 0. No two real rows of one call share a state slot. A real decode row ``r`` has
    ``state_slots[r] == decode_base + r``; a decode row whose slot differs is padding.
  * Recurrent states are float32; conv states hold the last ``K - 1`` conv inputs, oldest first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from radixflow_jax.models.config import ModelConfig


class Batch(NamedTuple):
    """``source_slots``/``fresh`` (optional): row r's recurrent layers start from the state in
    ``source_slots[r]`` (a checkpoint copied on write: the result goes to ``state_slots[r]``), or
    from a zero state where ``fresh[r]``; without them a row starts from ``state_slots[r]``.
    ``pair_emit`` (optional, policy ``pair``): a row with ``pair_emit[r] >= 0`` is a paired consumer
    (a prefill row); its initial state is the state the round's emit ``pair_emit[r]`` takes from an
    unpaired row of the same call, and its KV pages below its span are that producer's.
    ``decode_base`` (int32 scalar, required when the call has decode rows): the slot of decode row
    0; the decode rows' states are the pools' window ``[decode_base, decode_base + num_decode)``."""

    cu_seqlens: jax.Array  # int32 [R + 1]
    kv_lens: jax.Array  # int32 [R]
    page_table: jax.Array  # int32 [R, max_pages]
    slot_mapping: jax.Array  # int32 [T]
    state_slots: jax.Array  # int32 [R]
    source_slots: jax.Array | None = None  # int32 [R]
    fresh: jax.Array | None = None  # bool [R]
    pair_emit: jax.Array | None = None  # int32 [R]: paired consumer rows start from emit pair_emit[r]; -1: no
    decode_base: jax.Array | None = None  # int32 []: decode row r runs in state slot decode_base + r


class ModelCache(NamedTuple):
    """Per-layer pools. ``kv[i]`` belongs to the i-th layer of ``cfg.attention_layers``;
    ``conv[j]``/``ssm[j]`` to the j-th layer of ``cfg.recurrent_layers`` (both in layer order). A
    ``parallel`` layer (Falcon-H1) appears in both lists and owns one entry of each. ``mtp[j]``:
    the KV of MTP layer ``j`` (``models/mtp.py``; a model loaded with its MTP layers), on the same
    pages and page tables as the trunk's KV."""

    kv: tuple[tuple[jax.Array, jax.Array], ...]  # ([P, page, Hkv, D], [P, page, Hkv, D])
    conv: tuple[jax.Array, ...]  # [S, K - 1, conv_dim] in the model dtype
    ssm: tuple[jax.Array, ...]  # [S, ...state shape] float32
    mtp: tuple[tuple[jax.Array, jax.Array], ...] = ()  # as kv, one per MTP layer


def recurrent_state_shapes(cfg: ModelConfig) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(conv_shape, ssm_shape)`` per recurrent layer (``parallel`` ones included: their Mamba2
    state), without the slot axis."""
    shapes = []
    for i in cfg.recurrent_layers:
        if cfg.mixers[i] == "gdn":
            g = cfg.gdn
            assert g is not None
            shapes.append(((g.conv_kernel - 1, g.conv_dim), (g.num_v_heads, g.head_k_dim, g.head_v_dim)))
        else:
            m = cfg.mamba
            assert m is not None
            shapes.append(((m.conv_kernel - 1, m.conv_dim), (m.num_heads, m.head_dim, m.state_size)))
    return shapes


def init_cache(cfg: ModelConfig, *, num_pages: int, page_size: int, num_slots: int, dtype: jnp.dtype) -> ModelCache:
    """Zeroed pools: ``num_pages`` KV pages (page 0 = padding sink), ``num_slots`` state slots
    (slot 0 = padding sink); the MTP layers' KV (``cfg.mtp_layers``) has the trunk's page shape."""
    att = cfg.attention
    kv = []
    for _ in range(len(cfg.attention_layers) + cfg.mtp_layers):
        assert att is not None
        shape = (num_pages, page_size, att.num_kv_heads, att.head_dim)
        kv.append((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
    conv, ssm = [], []
    for conv_shape, ssm_shape in recurrent_state_shapes(cfg):
        conv.append(jnp.zeros((num_slots,) + conv_shape, dtype))
        ssm.append(jnp.zeros((num_slots,) + ssm_shape, jnp.float32))
    trunk = len(cfg.attention_layers)
    return ModelCache(kv=tuple(kv[:trunk]), conv=tuple(conv), ssm=tuple(ssm), mtp=tuple(kv[trunk:]))


def state_bytes_per_slot(cfg: ModelConfig, dtype: jnp.dtype) -> int:
    """Bytes one checkpoint (all recurrent layers, conv + SSM state) occupies."""
    total = 0
    for conv_shape, ssm_shape in recurrent_state_shapes(cfg):
        conv_n = 1
        for d in conv_shape:
            conv_n *= d
        ssm_n = 1
        for d in ssm_shape:
            ssm_n *= d
        total += conv_n * jnp.dtype(dtype).itemsize + ssm_n * 4
    return total


def pool_config(cfg: ModelConfig, *, mtp: bool) -> ModelConfig:
    """``cfg`` as an engine's pools see it: the MTP layers' KV shares the trunk's pages only in an
    engine that drafts with them (``mtp``), so only there do they get pools and count in a page's
    bytes (pool sizing, the host tier's pages, transfer metrics)."""
    return cfg if mtp else dataclasses.replace(cfg, mtp_layers=0)


def pool_unit_bytes(cfg: ModelConfig, dtype: Any, page_size: int) -> tuple[int, int]:
    """``(bytes of one KV page over every attention layer, bytes of one state slot)``; 0 for a pool
    the model does not have (no attention layer / not hybrid)."""
    att = cfg.attention
    itemsize = np.dtype(dtype).itemsize
    layers = len(cfg.attention_layers) + cfg.mtp_layers  # the MTP layers' KV sits on the same pages
    page = 2 * layers * page_size * att.num_kv_heads * att.head_dim * itemsize if att else 0
    return page, (state_bytes_per_slot(cfg, dtype) if cfg.is_hybrid else 0)
