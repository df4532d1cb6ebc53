"""Test-wide settings and the conventions that keep the suite fast on CI's 2 cores (read
``tests/README.md`` before adding a test that builds an engine).

* A persistent XLA compilation cache (``$RADIXFLOW_TEST_XLA_CACHE``, default
  ``$TMPDIR/radixflow-xla-cache``) shared by every test process: pytest-xdist workers, server and
  batch subprocesses (they inherit ``XLA_FLAGS``, so their cache keys match). Engines that build the
  same step variant compile it once per cold run.
* XLA:CPU compiles at backend optimisation level 0 (about half the compile time of a step variant;
  the tiny test models spend almost nothing running). ``RADIXFLOW_TEST_XLA_OPT=1`` keeps XLA's level.
* Two pytest-xdist workers (``-n 2 --dist loadscope`` in pyproject.toml: a module runs whole on one
  worker, so module-scoped engines and servers are built once); modules in :data:`HEAVY_FIRST` are
  scheduled first so the long ones do not end up as one worker's tail. ``-n 0`` runs in-process.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

_flags = os.environ.get("XLA_FLAGS", "")
if os.environ.get("RADIXFLOW_TEST_XLA_OPT") != "1" and "xla_backend_optimization_level" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()  # read at backend start

import jax  # noqa: E402
import pytest  # noqa: E402

_CACHE_DIR = os.environ.get("RADIXFLOW_TEST_XLA_CACHE") or os.path.join(tempfile.gettempdir(), "radixflow-xla-cache")
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# The longest modules of a cold run (measured with --durations, longest first): xdist hands them out
# first. A module not listed keeps its collection order after these.
HEAVY_FIRST = (
    "tests/engine/test_engine.py",
    "tests/engine/test_compile_guard.py",  # compiles every variant of the server shape first...
    "tests/engine/test_background.py",  # ...which these modules and the server subprocesses reuse
    "tests/engine/test_api.py",
    "tests/serve/test_server.py",
    "tests/batch/test_batch.py",
    "tests/models/test_parity.py",
    "tests/models/test_ssm_models.py",  # model oracles: 40-120 s cold each; unlisted, they ran as a tail
    "tests/models/test_gguf.py",
    "tests/models/test_gguf_roundtrip.py",
    "tests/models/test_gguf_roundtrip_mamba.py",
    "tests/models/test_split.py",
    "tests/models/test_row_last.py",
    "tests/runner/test_mixed_rounds.py",
    "tests/engine/test_speculative.py",  # three models, their verify variants
    "tests/engine/test_mtp_drafts.py",  # MTP variants of two presets, the reference's guesses
    "tests/models/test_mtp.py",  # transformers' modules as the MTP oracle, GGUF round trips
    "tests/engine/test_pair.py",
    "tests/engine/test_overlap.py",
    "tests/reliability/test_model_faults.py",
    "tests/engine/test_policies.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}

    def key(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(rank))

    items.sort(key=key)  # stable: the order inside a module (and of unlisted modules) is kept


_MODELS = pytest.StashKey[dict]()  # the session's loaded models by preset (tiny_model), on config.stash


@pytest.fixture(scope="session")
def tiny_model(request):
    """``tiny_model(preset)``: one loaded model per preset for the whole test process (an xdist
    worker), so the engines of every module on it share its compiled step variants
    (``LoadedModel.compiled_variants``): a variant is traced once per process, not once per module.
    Models are read-only; a test that changes one loads its own."""
    from radixflow_jax.models.api import load

    models = request.config.stash.setdefault(_MODELS, {})

    def get(preset: str):
        if preset not in models:
            models[preset] = load(preset)
        return models[preset]

    return get


_TIMELINE = os.environ.get("RADIXFLOW_TEST_TIMELINE")  # a file: one line per test, which worker ran it when


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


_MAPS_LEFT = pytest.StashKey[int]()  # the process's memory mappings right after _map_headroom last dropped


@pytest.fixture(autouse=True)
def _map_headroom(request):
    """After each test, when the test process holds more than half of ``vm.max_map_count`` memory
    mappings, drops every compiled executable it keeps: the session models' step variants and JAX's
    own caches of jitted functions (what a module-scoped engine still holds stays). XLA:CPU maps each
    compiled program's code in many sections: in a cold run on 2026-12-07 one worker held 60,564 of
    65,530 at its peak, and ``tests/engine/test_speculative.py`` alone added 35,000; past the cap
    the next compile or persistent-cache read fails or segfaults the worker. Dropped programs load
    again from the persistent cache on their next use. Where dropping gave little back (engines
    still hold the programs), the next drop waits until another eighth of the cap is in use; where
    ``/proc`` does not tell, nothing is dropped."""
    yield
    from radixflow_jax.runner.mapbudget import map_count, map_limit

    count, limit = map_count(), map_limit()
    if count is None or limit is None:
        return
    left = request.config.stash.get(_MAPS_LEFT, 0)
    if 2 * count < limit or count < left + limit // 8:
        return
    for model in request.config.stash.get(_MODELS, {}).values():
        model.compiled_variants.clear()
    jax.clear_caches()
    gc.collect()
    request.config.stash[_MAPS_LEFT] = after = map_count() or 0
    if _TIMELINE:
        with open(_TIMELINE, "a") as f:
            now = f"{time.time():.2f}"
            f.write(f"{_worker()} {now} {now} maps {count} -> {after} after {request.node.nodeid}\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``RADIXFLOW_TEST_TIMELINE`` set, appends ``worker start end nodeid`` (epoch seconds,
    setup to teardown) to that file, so a cold run shows how the workers' time was spent."""
    start = time.time()
    yield
    if _TIMELINE:
        with open(_TIMELINE, "a") as f:
            f.write(f"{_worker()} {start:.2f} {time.time():.2f} {item.nodeid}\n")
