"""A request in the twin's engine: its state, its steps' verification, its outcome.

`Live` keeps a running request's position and a joint histogram of its steps by
(drafts made, drafts accepted), from which its totals and vLLM-style per-request
counts come (`outcome_of`, `record_of`); `decode_at`, `decode_own` and
`decode_uniform` verify one step of a batch under the three depth rules
(`bench.twin.engine`). Kept apart from the event loop, whose hot path calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from bench.twin.records import RequestRecord
from bench.twin.requests import TwinRequest
from engine.interface import RequestOutcome, SpeculationOutcome

if TYPE_CHECKING:
    from bench.twin.engine import Plan


class Live:
    """One request in the engine (mutable, per run)."""

    __slots__ = (
        "drafter_s",
        "enter_t",
        "feature_rows",
        "first_t",
        "joint",
        "k",
        "load",
        "out",
        "plan",
        "pos",
        "predicted",
        "prefill_s",
        "request",
        "runs",
        "start_t",
        "width",
    )

    def __init__(
        self, request: TwinRequest, plan: Plan, start_t: float, depth: int, load: int
    ) -> None:
        self.request = request
        #: The batch it was planned for: requests in the engine at arrival, itself included.
        self.load = load
        self.plan = plan
        self.k = plan.k
        self.runs = request.runs
        self.out = request.output_tokens
        self.pos = 0
        self.start_t = start_t
        self.enter_t = start_t
        self.first_t = 0.0
        self.prefill_s = 0.0
        #: Its drafter prefill where only a step some request drafts in pays it (the
        #: gateway's engine skips the drafter in a step no request drafts in, now or later).
        self.drafter_s = 0.0
        #: Decode steps by (drafts made, drafts accepted), at drafts * width + accepted:
        #: vLLM's per-request histogram and its per-step drafts, jointly (a step at k = 0
        #: counts at (0, 0)). The totals and per-position counts come from it
        #: (`totals`, `outcome_of`): one increment is the decode loop's whole bookkeeping.
        self.width = depth + 1
        self.joint = [0] * (self.width * self.width)
        #: Adaptive verification: its drafts' predicted acceptance in its last step (the
        #: budget's one-step-stale copy, `bench.twin.modes.verify`); empty before.
        self.predicted: list[float] = []
        #: Adaptive verification: the request's confidence draws as lists, one per output
        #: position (`features`); None until first read.
        self.feature_rows: list[list[float]] | None = None

    def features(self) -> list[list[float]]:
        """The request's confidence draws per output position (`TwinRequest.confidence`)."""
        rows = self.feature_rows
        if rows is None:
            drawn = self.request.confidence
            assert drawn is not None, "adaptive verification needs confidence draws"
            rows = self.feature_rows = drawn[:, : self.width - 1].tolist()
        return rows

    def hists(self) -> tuple[list[int], list[int]]:
        """(steps by drafts accepted, steps by drafts made)."""
        w, joint = self.width, self.joint
        made = [sum(joint[n * w : (n + 1) * w]) for n in range(w)]
        accepted = [sum(joint[a::w]) for a in range(w)]
        return accepted, made

    def totals(self) -> tuple[int, int, int, int]:
        """(decode steps, verify steps, drafts made, drafts accepted) so far."""
        return _totals(*self.hists())


def _totals(hist: list[int], dhist: list[int]) -> tuple[int, int, int, int]:
    """`Live.totals` from its histograms (`Live.hists`)."""
    steps = sum(dhist)
    drafted = sum(d * n for d, n in enumerate(dhist))
    accepted = sum(a * n for a, n in enumerate(hist))
    return steps, steps - dhist[0], drafted, accepted


def outcome_of(live: Live, last_t: float) -> RequestOutcome:
    """The request's outcome as vLLM's per-request metrics report it (`engine.vllm.outcome`):
    per-position counts from the accepted histogram (a suffix sum), from the drafts
    made per verify step, and jointly (`tried_per_position`), all trimmed to the
    request's k, or to the deepest step it verified where a per-step depth ran it deeper."""
    k = live.plan.k
    w = live.width
    depth = w - 1
    joint = live.joint
    hist, dhist = live.hists()
    steps, verify, drafted, accepted = _totals(hist, dhist)
    deepest = max((d for d in range(1, depth + 1) if dhist[d]), default=0)
    trim = max(k, deepest)
    accepted_pos = tuple(sum(hist[d + 1 :]) for d in range(depth))[:trim] if verify else ()
    drafted_pos = tuple(sum(dhist[d + 1 :]) for d in range(depth))[:trim] if verify else ()
    tried_pos = (
        tuple(
            sum(sum(joint[n * w + d : n * w + n + 1]) for n in range(d + 1, w))
            for d in range(depth)
        )[:trim]
        if verify
        else ()
    )
    out = live.out
    ttft = live.first_t - live.enter_t
    e2e = last_t - live.enter_t
    return RequestOutcome(
        request_id=f"twin-{live.request.index}",
        prompt_tokens=live.request.prompt_tokens,
        output_tokens=out,
        finish_reason="length",
        speculation=SpeculationOutcome(
            k, verify, drafted, accepted, accepted_pos, drafted_pos, tried_pos
        ),
        ttft_s=ttft,
        tpot_s=(e2e - ttft) / (out - 1) if out > 1 else 0.0,
        e2e_s=e2e,
        decode_steps=steps + 1,
    )


def decode_at(running: list[Live], k: int, done: list[Live]) -> int:
    """Every decoding request verifies k drafts and accepts its run's first min(run, k);
    returns the drafts accepted in the step, summed."""
    total = 0
    base = k * running[0].width if running else 0
    for live in running:
        pos = live.pos
        a = live.runs[pos]
        if a > k:
            a = k
        live.joint[base + a] += 1
        total += a
        pos += a + 1
        if pos >= live.out:
            pos = live.out
            done.append(live)
        live.pos = pos
    return total


def decode_bounded(
    running: list[Live], depth: int, done: list[Live], drafts: Callable[[Live], bool]
) -> int:
    """`decode_at` where only the requests `drafts` names verify `depth`, the others none;
    returns the drafts accepted in the step, summed."""
    drafting: list[Live] = []
    idle: list[Live] = []
    for live in running:
        (drafting if drafts(live) else idle).append(live)
    if idle:
        decode_at(idle, 0, done)
    total = decode_at(drafting, depth, done)
    if done:  # `decode_at` appends in its own order: keep the batch's
        order = {id(live): i for i, live in enumerate(running)}
        done.sort(key=lambda live: order[id(live)])
    return total


def decode_own(running: list[Live], done: list[Live]) -> None:
    """`decode_at` with each request at its own k."""
    for live in running:
        k = live.k
        pos = live.pos
        a = live.runs[pos]
        if a > k:
            a = k
        live.joint[k * live.width + a] += 1
        pos += a + 1
        if pos >= live.out:
            pos = live.out
            done.append(live)
        live.pos = pos


def decode_uniform(running: list[Live], depth: int, done: list[Live]) -> None:
    """`decode_own` under the uniform rule: each request with k > 0 verifies `depth`
    (the step's deepest k), each at k = 0 none (`engine/vllm/batch_depth.py`)."""
    decode_bounded(running, depth, done, _drafts_own)


def _drafts_own(live: Live) -> bool:
    return live.k > 0


def record_of(live: Live, last_t: float) -> RequestRecord:
    request, plan = live.request, live.plan
    _, verify, drafted, accepted = live.totals()
    return RequestRecord(
        request.index,
        request.class_index,
        request.phase,
        request.segment,
        live.start_t,
        live.first_t,
        last_t,
        live.out,
        plan.k,
        plan.k if plan.chosen is None else plan.chosen,
        verify,
        drafted,
        accepted,
        live.load,
    )
