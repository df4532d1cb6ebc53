"""The compile guard: after warm-up compiled every step variant, no round of a long mixed workload
may compile again. ``CompiledStep.strict`` turns a post-warm-up compile into
``CompileAfterWarmupError``, and ``num_compiles`` must not move.

The workload mixes prompt lengths 5-300, max_tokens 1-12, shared prefixes (cache hits, checkpoint
copies and emits), sampling settings, arrivals between rounds and aborts, under both admission
policies; a tight page pool forces preemption and recompute.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from radixflow_jax import LLM
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.core import EngineCore
from radixflow_jax.engine.build import build_engine, packed_rows_free, pool_sizes
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.kernels import native
from radixflow_jax.runner.shapes import Variant
from radixflow_jax.runner.step import CompileAfterWarmupError
from tests.engine.workloads import GUARDED, shared_prefix_prompts

CONFIG = EngineConfig.from_options(**{**GUARDED, "warmup": True})
NUM_REQUESTS = 100


@pytest.fixture(scope="module")
def core(tiny_model) -> EngineCore:
    core = build_engine(tiny_model("tiny-qwen3.5"), CONFIG)
    step = core.executor.step
    assert all(step.is_compiled(v) for v in core.executor.shapes.variants())  # warm-up compiled everything
    # the CPU model executor's native kernels price a one-token row at one token: mixed rounds pack
    assert core.spec.packed_rows_free == native.enabled()
    assert core.executor.shapes.mixed_layout == ("packed" if native.enabled() else "window")
    step.strict = True
    return core


def test_packed_rows_free_only_where_native_kernels_serve_every_prefill_call(tiny_model) -> None:
    """``auto`` packs only where a one-token prefill-region row costs one token: float32 on the
    native CPU kernels; a bfloat16 model (XLA's blocked attention), a forced backend or a value
    head past the native scan's scratch keep the decode region."""
    import types

    model = tiny_model("tiny-qwen3.5")
    assert packed_rows_free(model, "auto") == native.enabled()
    assert not packed_rows_free(model, "xla")
    assert not packed_rows_free(types.SimpleNamespace(config=model.config, dtype=jnp.bfloat16), "auto")
    wide_gdn = dataclasses.replace(model.config.gdn, head_v_dim=native.MAX_VALUE_DIM + 1)
    wide = dataclasses.replace(model.config, gdn=wide_gdn)
    assert not packed_rows_free(types.SimpleNamespace(config=wide, dtype=model.dtype), "auto")


def workload(seed: int) -> list[tuple[list[int], SamplingParams]]:
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(3, 500, n).tolist() for n in (64, 130, 200, 256)]
    requests = []
    for i in range(NUM_REQUESTS):
        kind = rng.choice(4, p=[0.25, 0.1, 0.4, 0.25])
        if kind == 0:  # shares a long prefix, short suffix
            prompt = prefixes[rng.integers(len(prefixes))] + rng.integers(3, 500, rng.integers(1, 40)).tolist()
        elif kind == 1:  # a prefix exactly (a full hit up to the last grid position)
            prompt = list(prefixes[rng.integers(len(prefixes))])
        elif kind == 2:  # short
            prompt = rng.integers(3, 500, rng.integers(5, 65)).tolist()
        else:  # long: several chunked-prefill rounds
            prompt = rng.integers(3, 500, rng.integers(65, 301)).tolist()
        prompt = prompt[:300]
        max_tokens = int(rng.integers(1, 13))
        if i % 3 == 0:
            params = SamplingParams(max_tokens=max_tokens, temperature=float(rng.uniform(0.2, 1.5)),
                                    top_k=int(rng.integers(0, 20)), top_p=float(rng.uniform(0.5, 1.0)),
                                    seed=int(rng.integers(1 << 31)))  # fmt: skip
        else:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=bool(i % 2))
        requests.append((prompt, params))
    return requests


def run(core: EngineCore, seed: int) -> dict[str, int]:
    rng = np.random.default_rng(seed + 1000)
    pending = workload(seed)
    rids: list[int] = []
    aborted = 0
    while pending or core.has_unfinished():
        for _ in range(int(rng.integers(0, 6)) if core.has_unfinished() else 1):  # arrivals between rounds
            if pending:
                prompt, params = pending.pop(0)
                rids.append(core.add_request(prompt, params))
        if rids and rng.random() < 0.03:  # occasional aborts of whatever is picked
            if core.abort(rids[int(rng.integers(len(rids)))]) is not None:
                aborted += 1
        core.step()
    outs = [core.output(r) for r in rids]
    assert all(o.finished for o in outs)
    assert sum(o.finish_reason == "abort" for o in outs) == aborted
    for o, (_, params) in zip(outs, workload(seed)):
        assert 0 <= len(o.token_ids) <= params.max_tokens
        if o.finish_reason == "length":
            assert len(o.token_ids) == params.max_tokens
    return {"cached": sum(o.cached_tokens for o in outs), "aborted": aborted}


def test_no_variant_copies_a_state_pool(core: EngineCore) -> None:
    """The donated recurrent-state pools are updated in place in every compiled variant: its
    optimised program holds no copy of a pool (a property of the program, not a timing). A read of
    a pool ordered after an in-place write of it (e.g. the decode window's, ``DecodeWindow``) would
    make XLA copy the whole pool in every layer of every round."""
    ex = core.executor
    pools = {f"{x.dtype}[{','.join(map(str, x.shape))}]".replace("float32", "f32") for x in ex.cache.conv + ex.cache.ssm}
    for variant, compiled in ex.step._compiled.items():
        entry = compiled.as_text().split("\nENTRY ", 1)[1]
        copies = [line for line in entry.splitlines() if " copy(" in line and any(f"= {p}" in line for p in pools)]
        assert not copies, (variant, copies[:2])


def test_no_compiles_after_warmup_radixflow(core: EngineCore) -> None:
    step = core.executor.step
    compiled = step.num_compiles
    rounds = len(core.records)
    stats = run(core, seed=0)
    assert step.num_compiles == compiled
    records = core.records[rounds:]
    shapes = {(r.token_slots, r.row_slots) for r in records}
    assert len(shapes) >= 6, shapes  # the workload really used many variants
    assert any(r.num_rows > 1 and r.num_tokens == r.num_rows for r in records)  # decode-only rounds
    assert any(r.padding_tokens > 0 for r in records)
    assert stats["cached"] > 0


def test_cache_on_equals_cache_off_on_the_warm_variants(core: EngineCore) -> None:
    """Greedy outputs with the prefix cache on equal those with it off, in fine buckets (decode-only,
    prefill and mixed variants), on engines of the guard's shape over its model: they take every
    variant from the warm-up set (``LoadedModel.compiled_variants``), so nothing compiles."""
    model = core.executor.model
    prompts = shared_prefix_prompts(num_prefixes=2, per_prefix=4, prefix_len=150, suffix_len=10, vocab=500)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    cold, warm = (LLM(model, **GUARDED, policy=policy) for policy in ("no-cache", "pair"))
    cold_out, warm_out = cold.generate(prompts, params), warm.generate(prompts, params)
    assert [o.token_ids for o in warm_out] == [o.token_ids for o in cold_out]
    assert sum(o.cached_tokens for o in warm_out) > 0 and sum(o.cached_tokens for o in cold_out) == 0
    assert {r.kind for r in warm.engine.records} == {"prefill", "mixed", "decode"}
    assert cold.engine.executor.step.num_compiles == warm.engine.executor.step.num_compiles == 0


def test_decode_checkpoints_and_exact_ends_are_the_cold_state(core: EngineCore) -> None:
    """A grid checkpoint written by a decode row in a mixed round and in a decode-only round (fine
    buckets: the decode-only variants with few emit entries), and a finished request's exact end
    (its own slot, kept by the tree), are the states a cold run computes at their depths: a fork of
    the answer reads the first (grid 64: at 128), the next turn the second (120 + 12 - 1 = 131),
    and their greedy outputs equal the cache-off run's. Engines of the guard's shape over its
    model: nothing compiles."""
    model = core.executor.model
    warm, cold = (LLM(model, **GUARDED, policy=policy) for policy in ("pair", "no-cache"))
    params, filler = SamplingParams(max_tokens=12, ignore_eos=True), SamplingParams(max_tokens=1, ignore_eos=True)
    first, alone = list(range(20, 140)), list(range(220, 340))
    engine = warm.engine
    rid = engine.add_request(first, params)
    engine.step()
    while not engine.output(rid).finished:  # a short prompt arrives every round: each of first's decodes is mixed
        engine.add_request([3 + (11 * len(engine.records) + 5 * j) % 500 for j in range(40)], filler)
        engine.step()
    assert all(r.kind == "mixed" for r in engine.records if r.num_decode)
    engine.run_until_done()
    mixed_rounds = len(engine.records)
    out_alone = warm.generate([alone], params)[0]
    assert any(r.kind == "decode" for r in engine.records[mixed_rounds:])
    for turn1, out in ((first, engine.output(rid)), (alone, out_alone)):
        fork, nxt = turn1 + out.token_ids[:9] + [7, 8, 9], turn1 + out.token_ids + [7, 8, 9, 10, 11]
        got = warm.generate([fork, nxt], SamplingParams(max_tokens=4, ignore_eos=True))
        ref = cold.generate([fork, nxt], SamplingParams(max_tokens=4, ignore_eos=True))
        assert [o.cached_tokens for o in got] == [128, 131]  # the decode row's emit; the exact end
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert warm.engine.executor.step.num_compiles == cold.engine.executor.step.num_compiles == 0


def test_a_prompt_arriving_while_rows_decode_runs_before_they_finish(core: EngineCore) -> None:
    """The guard's shape has a token budget of one grid (64): three decode rows leave 61 tokens,
    which hold no grid span of a long prompt, so a 200-token prompt used to wait until every
    decoder had finished. A round that starves it is followed by a prefill-first round, so it
    finishes while they still decode, and every greedy output equals the cache-off engine's run of
    the same arrivals (the ordering changes no row's math). Nothing compiles."""
    model = core.executor.model
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    decoders = [list(range(30 + 9 * i, 50 + 9 * i)) for i in range(3)]
    prompt = [3 + (7 * j) % 490 for j in range(200)]
    outs = {}
    for cache in (True, False):
        engine = LLM(model, **GUARDED, policy="pair" if cache else "no-cache").engine
        rids = [engine.add_request(p, params) for p in decoders]
        engine.step()
        engine.step()
        late = engine.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
        while not engine.output(late).finished:
            engine.step()
        assert not any(engine.output(r).finished for r in rids), "the prompt waited for the decoders"
        engine.run_until_done()
        first = [r for r in engine.records if r.prefill_first]
        # 200 = 3 x 64 + 8: three grid spans went first; the last 8 tokens fit beside the decode rows
        assert len(first) == 3 and all(r.num_tokens == 64 and r.num_decode == 0 for r in first)
        assert engine.executor.step.num_compiles == 0
        outs[cache] = [engine.output(r).token_ids for r in rids + [late]]
    assert outs[True] == outs[False]


def _core_on(core: EngineCore, policy: str, *, num_kv_pages: int | None = None, max_model_len: int = 512) -> EngineCore:
    """Another engine on the same executor (the same compiled variants and device pools): its own
    scheduler, policy and (possibly smaller) pools; only one of them runs at a time."""
    options = dict(num_kv_pages=num_kv_pages, num_state_slots=12) if num_kv_pages else {}
    ec = CONFIG.with_options(policy=policy, max_model_len=max_model_len, **options)
    pages, slots = pool_sizes(core.executor.model.config, ec, max_model_len)
    spec = dataclasses.replace(
        core.spec, config=ec, num_pages=pages, num_slots=slots, max_model_len=max_model_len, vocab_size=None
    )
    return EngineCore(core.executor, spec)


def test_no_compiles_after_warmup_native(core: EngineCore) -> None:
    step = core.executor.step
    compiled = step.num_compiles
    native = _core_on(core, "native", num_kv_pages=36)  # just above the minimum: eviction pressure
    run(native, seed=1)
    assert step.num_compiles == compiled
    assert step.strict


def test_no_compiles_under_preemption_and_outputs_survive_it(core: EngineCore) -> None:
    """A page pool too small for four growing requests: requests get preempted and recomputed (a
    long prefill that ends in a sample) without a compile, and outputs do not change: greedy ones,
    and seeded samples too (a draw depends on the seed and the token position only)."""
    step = core.executor.step
    compiled = step.num_compiles
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 500, int(rng.integers(20, 60))).tolist() for _ in range(6)]
    params = [SamplingParams(max_tokens=60, ignore_eos=True, **({"temperature": 0.9, "seed": i} if i % 2 else {}))
              for i in range(6)]  # fmt: skip
    outputs = []
    for engine in (_core_on(core, "native", num_kv_pages=22, max_model_len=320), _core_on(core, "radixflow")):
        rids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
        engine.run_until_done()
        outputs.append([engine.output(r).token_ids for r in rids])
        preempted = sum(r.preempted for r in engine.records)
        if engine.scheduler.memory.pages.capacity < 32:
            assert preempted > 0
        else:
            assert preempted == 0
    assert step.num_compiles == compiled
    assert outputs[0] == outputs[1]
    assert all(len(t) == 60 for t in outputs[0])


def test_guard_refuses_a_new_variant(core: EngineCore) -> None:
    """The guard itself: a variant outside the warm-up set raises instead of compiling."""
    step = core.executor.step
    compiled = step.num_compiles
    with pytest.raises(CompileAfterWarmupError):
        step._compile(Variant(num_tokens=8, num_rows=3, num_decode=0, max_emits=3))
    assert step.num_compiles == compiled
