"""The ``agentic`` workload: one long system prompt of tool descriptions shared by every session,
turns that each append a tool result, seeded; and the driver resending every conversation with its
real answers (turn k+1's prompt extends turn k's prompt and answer)."""

from __future__ import annotations

import json

import pytest

from radixflow_jax import cli
from radixflow_jax.bench.agentic import WordIds, text_ids
from radixflow_jax.bench.workloads import WorkloadSpec, generate
from radixflow_jax.models import presets
from radixflow_jax.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_directory(presets.materialize("tiny-qwen3.5"))


def _sessions(reqs) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in reqs:
        out.setdefault(r.group, []).append(r)
    return {g: sorted(rs, key=lambda r: r.turn) for g, rs in out.items()}


def _shared(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_system_prompt_turns_and_seed(tokenizer: Tokenizer) -> None:
    spec = WorkloadSpec("agentic", num_requests=40, seed=3, arrival="all")
    reqs = generate(spec, tokenizer.encode)
    sessions = _sessions(reqs)
    assert len(sessions) == 8 and all([r.turn for r in s] == list(range(5)) for s in sessions.values())
    firsts = [s[0].prompt for s in sessions.values()]
    # every session starts with the same 1200-token system prompt, then its own 40-token task
    assert all(len(p) == 1240 for p in firsts)
    assert min(_shared(firsts[0], p) for p in firsts[1:]) >= 1200
    assert max(_shared(firsts[0], p) for p in firsts[1:]) < 1240
    system = tokenizer.decode(list(firsts[0][:1200]))
    assert system.startswith("You are an agent.") and system.count('"parameters"') >= 3
    later = [r for r in reqs if r.turn > 0]
    assert all(len(r.prompt) == 96 and r.max_tokens == 24 for r in later)
    assert all("<tool_result" in tokenizer.decode(list(r.prompt)) for r in later)
    assert reqs == generate(spec, tokenizer.encode)  # seeded
    other = generate(WorkloadSpec("agentic", num_requests=40, seed=4, arrival="all"), tokenizer.encode)
    assert other[0].prompt[:1200] != firsts[0][:1200]
    ids = [t for r in reqs for t in r.prompt]
    assert min(ids) >= 0 and max(ids) < 512  # the preset's vocabulary


def test_lengths_turns_and_word_ids() -> None:
    spec = WorkloadSpec("agentic", num_requests=7, seed=0, turns=3, article_len=300, question_len=20, max_tokens=5,
                        arrival="sessions", rate=4.0)  # fmt: skip
    reqs = generate(spec)  # no tokenizer: one id per word or mark, in [3, vocab)
    sessions = _sessions(reqs)
    assert [len(s) for s in sessions.values()] == [3, 3, 1]
    assert all(len(s[0].prompt) == 340 and all(len(r.prompt) == 20 for r in s[1:]) for s in sessions.values())
    assert all(3 <= t < spec.vocab for r in reqs for t in r.prompt)
    assert WordIds(50)("a b, a") == WordIds(50)("a b, a") and len(WordIds(50)("a b, a")) == 4
    assert text_ids(WordIds(50), lambda: "one two three", 5) == tuple(WordIds(50)("one two three\none two three")[:5])
    with pytest.raises(ValueError, match="turns must be >= 1"):
        WorkloadSpec("agentic", turns=0)


def test_model_run_resends_history_with_real_answers(tokenizer: Tokenizer) -> None:
    """On the model executor (tiny-qwen3.5, real greedy answers): turn k+1's prompt is turn k's
    prompt, its answer, then the new tool result; the shared system prompt is served from cache."""
    from radixflow_jax.bench.driver import drive
    from radixflow_jax.engine.build import build_engine
    from radixflow_jax.engine.config import EngineConfig
    from radixflow_jax.models.api import load

    spec = WorkloadSpec("agentic", num_requests=6, seed=1, turns=3, article_len=200, question_len=16, max_tokens=4,
                        arrival="all")  # fmt: skip
    reqs = generate(spec, tokenizer.encode)
    ec = EngineConfig.from_options(max_num_seqs=4, max_num_batched_tokens=128, page_size=16, max_model_len=1024,
                                   bucket_mode="fixed", policy="pair")  # fmt: skip
    engine = build_engine(load("tiny-qwen3.5"), ec)
    outs = drive(engine, reqs)
    assert len(outs) == len(reqs) and all(len(o.token_ids) == 4 for o in outs)
    by_session: dict[int, list] = {}
    for r, o in zip(reqs, outs):
        by_session.setdefault(r.group, []).append((r.turn, r, o))
    for turns in by_session.values():
        turns.sort(key=lambda x: x[0])
        for (_, _, prev), (_, req, out) in zip(turns, turns[1:]):
            history = tuple(prev.prompt_token_ids) + tuple(prev.token_ids)
            assert tuple(out.prompt_token_ids) == history + req.prompt
    assert sum(o.cached_tokens for o in outs) > 0


def test_cli_agentic_on_the_simulator(tmp_path, capsys) -> None:
    out = str(tmp_path / "a.json")
    rc = cli.main(["bench", "--model", "qwen3.5-4b", "--workload", "agentic", "--num-requests", "60", "--turns", "3",
                   "--arrival", "sessions", "--rate", "40", "--json", out, "--no-progress"])  # fmt: skip
    assert rc == 0
    assert "pair vs native" in capsys.readouterr().out
    data = json.load(open(out))
    assert data["config"]["workload"] == "agentic" and data["config"]["repeats"] == 1
    assert data["config"]["text_encoder"].startswith("WordIds")  # a model spec has no tokenizer
    assert all(r["completed"] == 60 and r["reuse"] > 0.5 for r in data["runs"])
