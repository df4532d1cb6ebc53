"""``Request.token_span`` equals slicing the whole token sequence, on every boundary case."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixflow_jax.scheduler.request import Request


@given(
    prompt=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    output=st.lists(st.integers(0, 50), max_size=12),
    bounds=st.tuples(st.integers(0, 26), st.integers(0, 26)),
)
def test_token_span_is_a_slice_of_tokens(prompt: list[int], output: list[int], bounds: tuple[int, int]) -> None:
    req = Request(1, tuple(prompt), max_tokens=32)
    req.output.extend(output)
    start, end = min(bounds), max(bounds)
    span = req.token_span(start, end)
    assert span == req.tokens[start:end]
    assert isinstance(span, tuple)
