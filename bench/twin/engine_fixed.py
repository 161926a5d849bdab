"""The engine's replay for modes whose depths are fixed per request (`fixed_depths`).

`nospec`, `static-k<k>` and the oracle give each request its depth k at arrival and
read nothing of the run. A request at k then advances by min(run, k) + 1 tokens a
step whatever its batch-mates do, so the steps it decodes and the drafts it accepts
are its own (`walk`, once per request and depth for every arrival process), and a
step's cost needs only its batch's size and deepest k. This replays
`bench.twin.engine.simulate` step by step, with the same sums in the same order (so
the same floats and records), without visiting every request in every step: each
request's last step is known as it enters.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from bench.twin.costs import StepCosts
from bench.twin.records import RequestRecord, RunResult
from bench.twin.requests import TwinRequest

if TYPE_CHECKING:
    from bench.twin.arrivals import Arrivals
    from bench.twin.engine import DepthSource, Plan, VirtualClock


def walk(request: TwinRequest, k: int) -> tuple[int, int]:
    """(decode steps, drafts accepted) of a request at depth k after its first token."""
    runs, out = request.runs, request.output_tokens
    pos, steps, accepted = 1, 0, 0
    while pos < out:
        a = runs[pos]
        if a > k:
            a = k
        accepted += a
        pos += a + 1
        steps += 1
    return steps, accepted


class Walks:
    """`walk` of every request of one list at each depth, computed as first asked.

    Holds the list itself, so that it is compared by identity while it lives: every
    mode and arrival process of a seed replays the same list (`bench.twin.runner`).
    """

    __slots__ = ("_by_k", "requests")

    def __init__(self, requests: list[TwinRequest]) -> None:
        self.requests = requests
        self._by_k: dict[int, dict[int, tuple[int, int]]] = {}

    def of(self, request: TwinRequest, k: int) -> tuple[int, int]:
        row = self._by_k.get(k)
        if row is None:
            row = self._by_k[k] = {}
        found = row.get(request.index)
        if found is None:
            found = row[request.index] = walk(request, k)
        return found


_LAST: list[Walks] = []


def walks_of(requests: list[TwinRequest]) -> Walks:
    """The walks of this request list (kept for the last list asked about)."""
    if not _LAST or _LAST[0].requests is not requests:
        _LAST[:] = [Walks(requests)]
    return _LAST[0]


class _Entry:
    """One request in the engine: what its record needs, and its last step."""

    __slots__ = ("accepted", "first_t", "k", "load", "plan", "prefill_s", "request", "start_t")

    def __init__(self, request: TwinRequest, plan: Plan, start_t: float, load: int) -> None:
        self.request = request
        self.plan = plan
        self.k = plan.k
        self.start_t = start_t
        self.load = load
        self.first_t = 0.0
        self.prefill_s = 0.0
        self.accepted = 0


def simulate_fixed(
    requests: list[TwinRequest],
    source: DepthSource,
    costs: StepCosts,
    clock: VirtualClock,
    arrivals: Arrivals,
    max_running: int,
    noise_start: int,
) -> RunResult:
    """`simulate` for a source with `fixed_depths` (module docstring)."""
    walks = walks_of(requests)
    waiting: deque[_Entry] = deque()
    records: list[RequestRecord] = []
    clock.now = 0.0
    steps = 0
    first_arrival: float | None = None
    noise = costs.noise
    #: Requests decoding, at each depth; the deepest of them.
    at_depth = [0] * (costs.max_k + 1)
    running = deepest = 0
    #: Step index -> the requests whose last step it is, in the order they entered.
    ending: dict[int, list[_Entry]] = {}
    while True:
        now = clock.now
        newcomers: list[_Entry] = []
        if waiting:
            _admit(waiting, running, newcomers, source, costs, now, max_running)
        if arrivals.next_at <= now:
            for request, at in arrivals.due(now):
                if first_arrival is None:
                    first_arrival = at
                in_engine = running + len(newcomers)
                plan = source.arrive(request, in_engine, len(waiting))
                if plan.cap is not None:
                    raise ValueError("a mode with fixed depths lowers no request")
                waiting.append(_Entry(request, plan, at, in_engine + 1))
                _admit(waiting, running, newcomers, source, costs, now, max_running)
        if not running and not newcomers:
            later = arrivals.next_time()
            if later is None:
                break
            clock.now = later
            continue
        jitter = noise[(noise_start + steps) % len(noise)]
        steps += 1
        seconds = _seconds(running, deepest, newcomers, source, costs) * jitter
        clock.now += seconds
        now = clock.now
        for entry in newcomers:
            entry.first_t = now
            decode_steps, entry.accepted = walks.of(entry.request, entry.k)
            ending.setdefault(steps + decode_steps, []).append(entry)
            if decode_steps:
                running += 1
                at_depth[entry.k] += 1
        done = ending.pop(steps, ())
        for entry in done:
            if entry.request.output_tokens > 1:  # it decoded (`walk`), so it was counted
                running -= 1
                at_depth[entry.k] -= 1
            records.append(_record(entry, now, walks))
            source.finish(entry.plan, None)
            arrivals.freed()
        if newcomers or done:
            deepest = max((k for k, n in enumerate(at_depth) if n), default=0)
    makespan = clock.now - (first_arrival or 0.0)
    return RunResult(records, makespan, steps)


def _admit(
    waiting: deque[_Entry],
    running: int,
    newcomers: list[_Entry],
    source: DepthSource,
    costs: StepCosts,
    now: float,
    max_running: int,
) -> None:
    """`engine._admit` without caps (a mode with fixed depths sets none)."""
    while waiting and running + len(newcomers) < max_running:
        entry = waiting.popleft()
        prompt = entry.request.prompt_tokens
        entry.prefill_s = prompt * costs.prefill_target_s
        if source.prefills_drafter(entry.k):
            entry.prefill_s += prompt * costs.prefill_drafter_s
        source.enter(entry.plan)
        newcomers.append(entry)


def _seconds(
    running: int, deepest: int, newcomers: list[_Entry], source: DepthSource, costs: StepCosts
) -> float:
    """The step's time before jitter, summed as `engine._step` sums it: the decode step at
    the deepest k (every request of an engine-wide mode is at its one depth), then each
    newcomer's prefill, then the largest first-token extra."""
    if running:
        seconds = costs.spec[running][deepest] if source.drafter else costs.no_spec[running]
    else:
        seconds = 0.0
    if newcomers:
        extra = 0.0
        first_extra = costs.first_extra_s
        shared = source.engine_wide and running
        for entry in newcomers:
            seconds += entry.prefill_s
            k = deepest if shared else entry.k
            if k > 0 and first_extra[k] > extra:
                extra = first_extra[k]
        seconds += extra
    return seconds


def _record(entry: _Entry, last_t: float, walks: Walks) -> RequestRecord:
    request, plan, k = entry.request, entry.plan, entry.k
    decode_steps = walks.of(request, k)[0]
    return RequestRecord(
        request.index,
        request.class_index,
        request.phase,
        request.segment,
        entry.start_t,
        entry.first_t,
        last_t,
        request.output_tokens,
        plan.k,
        plan.k if plan.chosen is None else plan.chosen,
        decode_steps if k else 0,
        decode_steps * k,
        entry.accepted,
        entry.load,
    )
