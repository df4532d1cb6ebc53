"""Speculative decoding on the model (``scheduler/drafts.py``, ``runner/step.py``'s verify points):
greedy outputs with drafted tokens equal the outputs without them, token for token, with the
prefix cache on and off, on a Gated DeltaNet hybrid, a Mamba2 hybrid and an attention-only model.

The drafts are an *oracle*: the tokens the plain run produced, with one token altered on a fixed
pattern of positions (tests may not rely on a random tiny model repeating itself, which n-gram
drafts need), so every round mixes fully accepted drafts, drafts rejected part-way and at their
first token. Stop tokens and ``max_tokens`` cut accepted drafts; an identical prompt rides its
twin; overlap is on (a round with a verify row commits before the next is planned). After each
run the whole-engine audit finds no slot or page unaccounted for, and a flush frees everything.
"""

from __future__ import annotations

import pytest

from radixflow_jax.bench.oracle import oracle_drafter
from radixflow_jax.engine.build import assemble_engine
from radixflow_jax.engine.config import EngineConfig
from radixflow_jax.engine.roundcost import LinearRoundCost
from radixflow_jax.engine.spec import EngineSpec
from radixflow_jax.sim.executor import SimExecutor, VirtualClock
from radixflow_jax.engine.params import SamplingParams
from radixflow_jax.llm import LLM
from radixflow_jax.reliability.audit import assert_drained, audit_engine
from radixflow_jax.scheduler import running

PROMPTS = [
    list(range(5, 45)),
    [9, 10, 11, 12] * 5,
    list(range(100, 190)),
    list(range(5, 45)),  # a twin of the first: rides its last prompt round
    [300, 301],
]


def _run(llm: LLM, params: list[SamplingParams]) -> list[tuple[int, ...]]:
    outputs = llm.generate(PROMPTS, params)
    engine = llm.replicas.engines[0]
    audit_engine(engine)
    return [tuple(o.token_ids) for o in outputs]


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-bamba", "tiny-qwen3"])
def test_greedy_outputs_with_drafts_equal_plain_decoding(model: str, monkeypatch, tiny_model) -> None:
    options = dict(max_num_seqs=4, max_num_batched_tokens=128)
    loaded = tiny_model(model)  # shared: both engines take the variants they have in common once
    plain = LLM(loaded, **options)
    long = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (23, 30, 17, 23, 9)]
    cold = _run(plain, long)
    # a stop token in the middle of each answer, which an accepted draft may run past
    stops = [SamplingParams(max_tokens=40, stop_token_ids=(c[len(c) // 2],)) for c in cold]
    cold_stop = _run(plain, stops)
    tok = plain.replicas.engines[0].tokenizer  # a stop string inside each answer (a run may hit it earlier)
    texts = [SamplingParams(max_tokens=30, ignore_eos=True, stop=(tok.decode(c[6:8]),)) for c in cold]
    cold_text = plain.generate(PROMPTS, texts)
    vocab = plain.replicas.engines[0].vocab_size
    full = [tuple(p) + c for p, c in zip(PROMPTS, cold + cold_stop)]
    monkeypatch.setattr(running, "ngram_draft", oracle_drafter(full, vocab))
    for policy in ("pair", "no-cache"):
        llm = LLM(loaded, speculative={"num_draft": 3}, policy=policy, **options)
        engine = llm.replicas.engines[0]
        plans = _spy_plans(engine, monkeypatch)
        for _ in range(2):  # the second pass hits the cache the first one left
            assert _run(llm, long) == cold
            assert _run(llm, stops) == cold_stop
            with_text = llm.generate(PROMPTS, texts)
            assert [(o.token_ids, o.text, o.finish_reason) for o in with_text] == [
                (o.token_ids, o.text, o.finish_reason) for o in cold_text
            ]
        drafted = sum(r.drafted_tokens for r in engine.records)
        accepted = sum(r.accepted_tokens for r in engine.records)
        assert 0 < accepted < drafted  # both accepted and rejected drafts were verified
        assert_drained(engine)
        _assert_nothing_recomputed(plans)
        _assert_no_pool_copies(engine)


def _spy_plans(engine, monkeypatch) -> list:
    """Every plan the engine's executor runs, in order."""
    plans, executor = [], engine.executor
    for name in ("execute", "launch"):
        run = getattr(executor, name)
        monkeypatch.setattr(executor, name, lambda plan, *a, _run=run, **k: (plans.append(plan), _run(plan, *a, **k))[1])
    return plans


def _assert_nothing_recomputed(plans) -> None:
    """Exact roll-back: once a request has verified a draft, each of its rows feeds one known token
    (the one its last row sampled), on hybrids too, whose state after a partly accepted draft is the
    state at its last accepted token (``runner/rollback.py``), not one to recompute from."""
    verified, rows = set(), 0
    for plan in plans:
        for row in plan.rows:
            key = (row.request_id, row.epoch)
            if key in verified:
                assert len(row.tokens) - row.num_draft == 1, row
                rows += 1
            if row.num_draft:
                verified.add(key)
    assert rows > 0


def test_speculative_needs_a_verifying_executor() -> None:
    config = EngineConfig.from_options(max_num_seqs=2, max_num_batched_tokens=64, page_size=16, speculative="ngram")
    spec = EngineSpec(config=config, hybrid=True, chunk_sizes=(16,), num_pages=64, num_slots=8, max_model_len=256)
    clock = VirtualClock()
    with pytest.raises(ValueError, match="speculative decoding needs an executor"):
        assemble_engine(spec, lambda shapes: SimExecutor(LinearRoundCost((1e-3, 0, 0, 0, 0)), clock, shapes), clock=clock)


def test_seeded_sampled_outputs_with_drafts_equal_plain_decoding(monkeypatch, tiny_model) -> None:
    """Seeded sampled requests: each verify token is drawn with the key a run without drafts uses at
    its position (``runner/step._verify``), so the outputs equal that run's, token for token, with
    the cache on and off, and a drafted token is kept with probability ``p(draft)``."""
    loaded = tiny_model("tiny-qwen3.5")
    options = dict(max_num_seqs=4, max_num_batched_tokens=128)
    plain = LLM(loaded, **options)
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.3, seed=i) for i in range(len(PROMPTS))]
    cold = _run(plain, params)
    full = [tuple(p) + c for p, c in zip(PROMPTS, cold)]
    monkeypatch.setattr(running, "ngram_draft", oracle_drafter(full, plain.replicas.engines[0].vocab_size))
    for policy in ("pair", "no-cache"):
        llm = LLM(loaded, speculative={"num_draft": 3}, policy=policy, **options)
        assert _run(llm, params) == cold
        assert _run(llm, params) == cold  # from the cache the first pass left
        engine = llm.replicas.engines[0]
        drafted = sum(r.drafted_tokens for r in engine.records)
        assert 0 < sum(r.accepted_tokens for r in engine.records) < drafted
        assert_drained(engine)


def _assert_no_pool_copies(engine) -> None:
    """The verify variants, with their lanes and the accepted state's write after sampling, update
    the donated state pools in place: no compiled program holds a copy of one (as
    ``tests/engine/test_compile_guard.py`` checks for the other variants)."""
    ex = engine.executor
    short = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}  # HLO's names of the pools' dtypes
    pools = {f"{short.get(str(x.dtype), x.dtype)}[{','.join(map(str, x.shape))}]" for x in ex.cache.conv + ex.cache.ssm}
    verify = [(v, c) for v, c in ex.step._compiled.items() if v.num_verify]
    assert verify or not pools
    for variant, compiled in verify:
        entry = compiled.as_text().split("\nENTRY ", 1)[1]
        copies = [line for line in entry.splitlines() if " copy(" in line and any(f"= {p}" in line for p in pools)]
        assert not copies, (variant, copies[:2])


@pytest.mark.parametrize("model", ["tiny-qwen3-next", "tiny-nemotron-h", "tiny-granite-4.0-h", "tiny-falcon-h1"])
def test_every_other_preset_keeps_the_accepted_state(model: str, monkeypatch, tiny_model) -> None:
    """The remaining presets (MoE, Mamba2 blocks, Mamba2 with MoE, attention and Mamba2 in one layer):
    greedy outputs with drafts accepted whole, in part and not at all equal plain decoding, with
    the cache on, and nothing is recomputed after a verify row."""
    loaded = tiny_model(model)
    options = dict(max_num_seqs=4, max_num_batched_tokens=128)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (12, 16, 9, 12, 6)]
    cold = _run(LLM(loaded, **options), params)
    full = [tuple(p) + c for p, c in zip(PROMPTS, cold)]
    monkeypatch.setattr(running, "ngram_draft", oracle_drafter(full, loaded.config.vocab_size))
    llm = LLM(loaded, speculative={"num_draft": 3}, **options)
    plans = _spy_plans(llm.replicas.engines[0], monkeypatch)
    assert _run(llm, params) == cold
    records = llm.replicas.engines[0].records
    assert 0 < sum(r.accepted_tokens for r in records) < sum(r.drafted_tokens for r in records)
    _assert_nothing_recomputed(plans)
