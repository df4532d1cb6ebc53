"""The partner registry shared by paired references and riders (``cache/partners.py``)."""

from __future__ import annotations

from radixflow_jax.cache.partners import Partners


def test_partners_are_taken_discarded_and_dropped_without_empty_entries() -> None:
    p = Partners()
    p.add(1, 5)
    p.add(1, 3)
    p.add(2, 5)
    assert p.as_dict() == {1: (3, 5), 2: (5,)} and p.has(1)
    p.drop_partner(5)  # gone from every producer; producer 2 is left with nothing and disappears
    assert p.as_dict() == {1: (3,)} and not p.has(2)
    p.discard(1, 3)
    assert p.as_dict() == {} and p.take(1) == ()
    p.add(4, 9)
    p.add(4, 7)
    assert p.take(4) == (7, 9) and p.as_dict() == {}
    p.add(6, 1)
    p.drop_producer(6)
    assert not p.has(6)
