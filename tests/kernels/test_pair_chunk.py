"""The ``pair_chunk`` contract of the chunked kernels (policy ``pair``): a paired row starts from the
end state of another row's chunk in the same call, in the one pass over the chunks.

Oracle: the float64 per-token loops of ``test_gated_delta`` / ``test_ssd`` with the paired rows'
initial states replaced by their producers' states at the pairing depth. Cases: a consumer placed
*before* its producer in the packed order (the scan must reorder), pairing inside the producer's
span (on the chunk grid) and at its end (a partial last chunk), every backend that serves the op
on CPU (reference, the faster XLA form, the native scan, both Pallas variants in interpret mode, and
through ``ops``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax.kernels import fast, native, ops
from radixflow_jax.kernels.gated_delta import gated_delta_chunked
from radixflow_jax.kernels.layout import chunk_layout
from radixflow_jax.kernels.pallas import gated_delta as pallas_gd
from radixflow_jax.kernels.pallas import ssd as pallas_ssd
from radixflow_jax.kernels.ssd import ssd_chunked
from tests.kernels import test_gated_delta as gd_case
from tests.kernels import test_ssd as ssd_case

CHUNK = 4
LENS = (5, 0, 1, 13, 8)  # row 3 (13 tokens: chunks at 4, 8, 12, 13) is the producer
PAIRS = {0: (3, 13), 4: (3, 8)}  # consumer row -> (producer row, depth): span end, on the grid
# three consumers of one producer at two depths: the GPU pre-pass runs its chunks once, to the deepest
SHARED_PRODUCER = {0: (3, 13), 2: (3, 8), 4: (3, 13)}


def _pair_chunk(lens: tuple[int, ...], pairs: dict = PAIRS) -> np.ndarray:
    layout = chunk_layout(jnp.asarray(gd_case._cu(lens)), sum(lens) + 3, CHUNK)
    first = np.asarray(layout.first_chunk)
    out = np.full(len(lens), -1, np.int32)
    for row, (prow, depth) in pairs.items():
        out[row] = first[prow] + -(-depth // CHUNK) - 1
    return out


def _with_producer_states(init: np.ndarray, states: list, pairs: dict = PAIRS) -> np.ndarray:
    """The oracle's initial states: every paired row takes its producer's state at the depth."""
    out = init.copy()
    for row, (prow, depth) in pairs.items():
        out[row] = np.asarray(states[prow][depth], np.float32)
    return out


def _check(result, ref_out: np.ndarray, ref_states: list, lens: tuple[int, ...], tol: float) -> None:
    out, final, chunk_states = (np.asarray(x, np.float64) for x in result)
    np.testing.assert_allclose(out, ref_out, atol=tol, rtol=0)
    for r, n in enumerate(lens):
        np.testing.assert_allclose(final[r], ref_states[r][n], atol=tol, rtol=0)
    for c, r, n in gd_case._used_chunks(lens, CHUNK):
        np.testing.assert_allclose(chunk_states[c], ref_states[r][n], atol=tol, rtol=0)


def _gdn_expected(inp: dict[str, np.ndarray], scale: float, pairs: dict = PAIRS) -> tuple[np.ndarray, list]:
    _, states = gd_case._numpy_oracle(inp, LENS, scale)
    paired_inp = dict(inp, init=_with_producer_states(inp["init"], states, pairs))
    return gd_case._numpy_oracle(paired_inp, LENS, scale)


GDN_FORMS = {
    "reference": gated_delta_chunked,
    "fast": fast.gated_delta_chunked,
    # in sub-chunks of 2: pair_chunk and chunk_states are translated between the two layouts
    "fast-sub2": functools.partial(fast.gated_delta_chunked, sub_chunk=2),
}
if native.available():  # the token-by-token C++ scan (built here if need be)
    GDN_FORMS["native"] = native.gated_delta_scan


@pytest.mark.parametrize("form", sorted(GDN_FORMS))
def test_gated_delta_pairs_in_one_pass(form: str) -> None:
    inp = gd_case._make_inputs(11, sum(LENS) + 3, len(LENS), 2, 4, 8, 6)
    scale = 0.7
    call = jax.jit(functools.partial(GDN_FORMS[form], chunk_size=CHUNK, scale=scale))
    args = (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], jnp.asarray(gd_case._cu(LENS)), inp["init"])
    result = call(*args, pair_chunk=jnp.asarray(_pair_chunk(LENS)))
    ref_out, ref_states = _gdn_expected(inp, scale)
    _check(result, ref_out, ref_states, LENS, gd_case.ATOL)
    unpaired = call(*args, pair_chunk=jnp.full((len(LENS),), -1, jnp.int32))
    plain = call(*args)
    for a, b in zip(unpaired, plain):  # no paired row: the reordered scan equals the plain one
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)


def _ssd_inputs(p: int = 3, n: int = 5) -> dict[str, np.ndarray]:
    return ssd_case.make_inputs(5, LENS, 3, heads=4, p=p, n=n, groups=2)


def _ssd_expected(inp: dict[str, np.ndarray], pairs: dict = PAIRS) -> tuple[np.ndarray, list]:
    _, states = ssd_case.numpy_oracle(inp)
    return ssd_case.numpy_oracle(dict(inp, initial_state=_with_producer_states(inp["initial_state"], states, pairs)))


SSD_FORMS = {"reference": ssd_chunked}
if native.available():
    SSD_FORMS["native"] = native.ssd_scan


@pytest.mark.parametrize("form", sorted(SSD_FORMS))
def test_ssd_pairs_in_one_pass(form: str) -> None:
    inp = _ssd_inputs()
    call = jax.jit(functools.partial(SSD_FORMS[form], chunk_size=CHUNK))
    result = call(**inp, pair_chunk=jnp.asarray(_pair_chunk(LENS)))
    ref_out, ref_states = _ssd_expected(inp)
    _check(result, ref_out, ref_states, LENS, ssd_case.TOL)


@pytest.mark.parametrize("variant,pairs", [("gpu", PAIRS), ("gpu", SHARED_PRODUCER), ("tpu", PAIRS)])
def test_pallas_variants_pair(variant: str, pairs: dict) -> None:
    """Both lowering variants in interpret mode: the GPU one runs a pre-pass over the producers'
    prefixes, then the full call; the TPU one runs the grid twice."""
    pair_chunk = jnp.asarray(_pair_chunk(LENS, pairs))
    inp = _ssd_inputs(p=4, n=8)  # power-of-two tiles for the Triton variant
    names = ("x", "dt", "A", "B", "C", "cu_seqlens", "initial_state")
    args = [jnp.asarray(inp[n]) for n in names]
    result = pallas_ssd.ssd_chunked(*args, chunk_size=CHUNK, backend=variant, interpret=True, pair_chunk=pair_chunk)
    _check(result, *_ssd_expected(inp, pairs), LENS, ssd_case.TOL)
    g = gd_case._make_inputs(11, sum(LENS) + 3, len(LENS), 2, 4, 8, 8)
    gargs = [jnp.asarray(a) for a in (g["q"], g["k"], g["v"], g["g"], g["beta"], gd_case._cu(LENS), g["init"])]
    result = pallas_gd.gated_delta_chunked(
        *gargs, chunk_size=CHUNK, scale=0.7, backend=variant, interpret=True, pair_chunk=pair_chunk
    )
    _check(result, *_gdn_expected(g, 0.7, pairs), LENS, gd_case.ATOL)


def test_pallas_through_ops_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``ops`` (the dispatch the model uses), forced Pallas: interpret mode on CPU, the
    platform's own lowering on a GPU or TPU."""
    monkeypatch.setenv("RADIXFLOW_KERNELS", "pallas")
    monkeypatch.setenv("RADIXFLOW_PALLAS_INTERPRET", "1")
    pair_chunk = jnp.asarray(_pair_chunk(LENS))
    inp = _ssd_inputs(p=4, n=8)  # power-of-two tiles, so a GPU's Triton lowering takes them too
    names = ("x", "dt", "A", "B", "C", "cu_seqlens", "initial_state")
    result = ops.ssd_chunked(*(jnp.asarray(inp[n]) for n in names), chunk_size=CHUNK, pair_chunk=pair_chunk)
    _check(result, *_ssd_expected(inp), LENS, ssd_case.TOL)
    g = gd_case._make_inputs(11, sum(LENS) + 3, len(LENS), 2, 4, 8, 8)
    args = (g["q"], g["k"], g["v"], g["g"], g["beta"], jnp.asarray(gd_case._cu(LENS)), g["init"])
    result = ops.gated_delta_chunked(*(jnp.asarray(a) for a in args), chunk_size=CHUNK, scale=0.7, pair_chunk=pair_chunk)
    _check(result, *_gdn_expected(g, 0.7), LENS, gd_case.ATOL)
