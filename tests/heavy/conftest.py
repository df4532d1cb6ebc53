"""Every test under ``tests/heavy/`` is a full-size run (minutes): marked ``heavy``, which the
default ``addopts`` (``-m "not heavy"``) deselects; ``python -m pytest -m heavy tests/heavy`` runs them."""

from __future__ import annotations

import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in pathlib.Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.heavy)
