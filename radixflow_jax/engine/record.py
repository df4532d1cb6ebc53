"""One request's engine-side state: :class:`RequestRecord`, the one table entry ``EngineCore`` keeps
per request id (beside the scheduler's :class:`~radixflow_jax.scheduler.request.Request`, which holds
its tokens and cache state).

Invariants:
  * A record exists from ``add_request`` until ``forget`` (after delivery); ``output`` is the very
    object every caller gets back, updated in place.
  * ``sampling`` is set while the request may still be sampled and None once it finished or was
    aborted; :class:`SamplingRows` (what the executor reads) shows exactly the records that have one.
  * ``detok`` is created with the first text update of a request on a tokenizer and dropped when the
    request ends (its final text is decoded whole).
  * ``failures`` counts failed rounds in a row that the request ran in; a committed round it ran in
    sets it back to 0.
  * ``siblings``: the request ids of every sample of one prompt's ``n`` / ``best_of`` group, in
    index order (this request among them), set by ``EngineCore.add_group``; None for ``n == 1``.
  * ``grammar``: the request's structured-output matcher (``engine/grammar.GrammarState``, also
    the sampling row's ``grammar``, which writes its mask when a round samples the row); None means
    an unconstrained request. It lives here, never in the prefix cache: a preempted request keeps
    it and resumes where its matcher was. :meth:`follow_grammar` feeds it the committed tokens.
  * ``refused``: the request's sampling row could not be written into step arrays when the record
    opened (a value intake should have refused); its output ended with ``error`` then, it has no
    row, and the engine never queues it, so it fails alone, in no round.
No JAX here.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

from radixflow_jax.engine.detok import IncrementalText
from radixflow_jax.engine.grammar import GrammarState
from radixflow_jax.engine.params import RequestOutput, SamplingParams
from radixflow_jax.engine.protocol import StepResult
from radixflow_jax.runner.inputs import SamplingRow, check_row
from radixflow_jax.scheduler.plan import RoundPlan
from radixflow_jax.scheduler.request import Request


@dataclasses.dataclass
class RequestRecord:
    """See the module docstring."""

    params: SamplingParams
    output: RequestOutput
    sampling: SamplingRow | None
    detok: IncrementalText | None = None
    stop_at: int | None = None  # the tokens the request keeps: a stop string or its grammar ended it before the last
    num_decoded: int = 0  # output tokens at the last update_text (those of earlier rounds)
    failures: int = 0
    grammar: GrammarState | None = None  # per-request structured-output matcher; None: unconstrained
    siblings: tuple[int, ...] | None = None  # every request id of one prompt's n samples (index order)
    refused: bool = False  # its sampling row could not be built (open): it ended with error, never queued

    @classmethod
    def open(
        cls,
        req: Request,
        params: SamplingParams,
        default_seed: int,
        *,
        banned: tuple[int, ...] = (),
        grammar: GrammarState | None = None,
        penalty_window: int = 0,
    ) -> RequestRecord:
        """The record of a request about to be queued: its sampling row (``default_seed`` unless the
        params fix one; penalised rows carry the live prompt and output lists; ``banned``: the stop
        tokens masked until ``min_tokens`` tokens were generated; ``grammar``: its matcher) and an
        empty output. The row is written once into one-row step arrays (``runner/inputs.check_row``,
        ``penalty_window`` wide): should that raise, the record has no row and its output is already
        finished with ``error`` (``refused``), so the request never reaches a round."""
        output = RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt,
            token_ids=[],
            text=None,
            finish_reason=None,
            prompt_tokens=len(req.prompt),
            cached_tokens=0,
            arrival_time=req.arrival_time,
            logprobs=[] if params.logprobs is not None else None,
        )
        try:
            row = _sampling_row(req, params, default_seed, banned, grammar)
            check_row(row, penalty_window=penalty_window)
        except Exception as exc:  # defence in depth: intake's checks should have refused it
            output.finish_reason, output.finish_time = "error", req.arrival_time
            output.error = f"the request's sampling settings cannot be run: {exc!r:.300}"
            return cls(params, output, None, refused=True)
        return cls(params, output, row, grammar=grammar)

    # ------------------------------------------------------------------ output assembly
    def add_logprobs(self, logprobs: tuple[float, list[int], list[float]]) -> None:
        """Appends one sampled token's logprobs, if the request asked for them and is not finished."""
        out = self.output
        if out.logprobs is not None and out.finish_reason is None:
            out.logprobs.append(logprobs)

    def progress(self, req: Request, now: float, round_index: int) -> None:
        """The committed tokens after a round that sampled the request (first token: its time)."""
        out = self.output
        out.token_ids = req.committed_output
        out.cached_tokens = req.cached_tokens
        if out.first_token_time is None:
            out.first_token_time, out.first_token_round = now, round_index

    def follow_grammar(self, req: Request) -> str | None:
        """Feeds the matcher the request's newly committed tokens; the reason the request ends with
        (``stop``: the grammar is complete, also when it completed on the last token ``max_tokens``
        allowed; ``error``: a token it did not allow was committed, noted in ``output.error``), else None."""
        if self.grammar is None:
            return None
        cut = self.grammar.advance(req.committed_output)
        if cut is not None:  # complete inside a verify row's tokens: the request keeps ``stop_at``
            self.stop_at = cut
            del self.output.token_ids[cut:]
            if self.output.logprobs is not None:
                del self.output.logprobs[cut:]
            return "stop"
        if req.is_finished:
            return "stop" if req.finish_reason == "length" and self.grammar.stopped else None
        if self.grammar.failed:
            self.output.error = "a committed token does not match the request's grammar"
            return "error"
        return "stop" if self.grammar.stopped else None

    def update_text(self, tokenizer: object, finished: bool) -> bool:
        """Decodes the tokens so far (the whole list once ``finished``) and cuts the text at the
        first stop string; True when a stop string was found (the request ends with ``stop``).
        Tokens a round committed several at a time (a verify row, speculative decoding) are decoded
        one more at a time, as rounds of one token each would have, and where the stop string was
        found before the last of them ``stop_at`` is how many the request keeps."""
        if self.detok is None:
            self.detok = IncrementalText(tokenizer)  # type: ignore[arg-type]
        out, stops, ids = self.output, self.params.stop, self.output.token_ids
        before, self.num_decoded = self.num_decoded, len(ids)  # tokens of earlier rounds
        for n in range(min(before + 1, len(ids)), len(ids) + 1):
            last = finished and n == len(ids)
            seen = len(self.detok.text)  # no stop string was complete in this much text
            out.text = self.detok.finish(ids[:n]) if last else self.detok.update(ids[:n])
            starts = [0 if last else max(0, seen - len(s) + 1) for s in stops]
            hit = min((h for h in (out.text.find(s, a) for s, a in zip(stops, starts)) if h >= 0), default=-1)
            if hit >= 0:
                out.text = out.text[:hit]
                self.stop_at = n if n < len(ids) else None
                if self.stop_at is not None and out.logprobs is not None:
                    del out.logprobs[n:]  # those of the tokens the request does not keep
                return True
        return False

    def finalize(self, req: Request, now: float, round_index: int) -> None:
        """The request ended (``req.finish_reason`` is set): final tokens, reason and time; nothing
        samples it any more and its incremental text is done."""
        out = self.output
        out.token_ids = list(req.output)
        out.finish_reason = req.finish_reason
        out.finish_time, out.finish_round = now, round_index
        self.close()

    def close(self) -> None:
        """The request ended: nothing samples it any more and its incremental text is done."""
        self.sampling = None
        self.detok = None


def logprob_owners(
    plan: RoundPlan, result: StepResult, requests: Mapping[int, Request]
) -> list[tuple[int, Request, int]]:
    """Before a round commits: ``(request id, request, committed output length)`` of each row whose logprobs
    came back, leaving out stale rows (preempted after planning, overlap)."""
    if not result.logprobs:
        return []
    live = {r.request_id for r in plan.rows if r.request_id in requests and requests[r.request_id].epoch == r.epoch}
    return [(rid, requests[rid], _committed(requests[rid])) for rid in result.logprobs if rid in live]


def _committed(req: Request) -> int:
    """Output tokens committed (a launched round's placeholders left out)."""
    return len(req.output) - req.unknown_tokens


def attach_logprobs(
    owners: list[tuple[int, Request, int]], result: StepResult, records: Mapping[int, RequestRecord]
) -> None:
    """After the commit: each row's logprobs go to its record, one entry per committed token. A
    verify row committed the tokens after its first verify points, then perhaps its sample
    (``StepResult.verify_logprobs``, then ``logprobs``), as many as its output grew."""
    for rid, req, before in owners:
        rec = records.get(rid)
        if rec is None:
            continue
        points = result.verify_logprobs.get(rid)
        entries = [result.logprobs[rid]]
        if points is not None:
            entries = (points + entries)[: _committed(req) - before]
        for entry in entries:
            rec.add_logprobs(entry)


class SamplingRows(Mapping[int, SamplingRow]):
    """A read-only view of a record table: request id -> sampling row, for the records that have one
    (the ``sampling`` mapping executors take)."""

    def __init__(self, records: Mapping[int, RequestRecord]):
        self._records = records

    def __getitem__(self, request_id: int) -> SamplingRow:
        row = self._records[request_id].sampling
        if row is None:
            raise KeyError(request_id)
        return row

    def __contains__(self, request_id: object) -> bool:
        rec = self._records.get(request_id)  # type: ignore[call-overload]
        return rec is not None and rec.sampling is not None

    def __iter__(self) -> Iterator[int]:
        return (rid for rid, rec in self._records.items() if rec.sampling is not None)

    def __len__(self) -> int:
        return sum(1 for rec in self._records.values() if rec.sampling is not None)


def _sampling_row(
    req: Request, params: SamplingParams, default_seed: int, banned: tuple[int, ...], grammar: GrammarState | None
) -> SamplingRow:
    """The request's sampling row (:meth:`RequestRecord.open`)."""
    penalised = params.has_penalty
    return SamplingRow(
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        min_p=params.min_p,
        seed=params.seed if params.seed is not None else default_seed,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        logprobs=-1 if params.logprobs is None else params.logprobs,
        bias=params.logit_bias,
        ban=banned if params.min_tokens else (),
        ban_until=len(req.prompt) + params.min_tokens,
        prompt=req.prompt if penalised else (),
        output=req.output if penalised else (),
        grammar=grammar,
    )
