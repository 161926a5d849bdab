"""The virtual-time engine: vLLM-style continuous batching with an EAGLE drafter, simulated.

Requests arrive (a closed loop of C clients, or Poisson arrival times), wait
while the engine holds `max_running`, and enter at a step boundary. A request
prefills in the step it enters, which yields its first token; from the next step
on it decodes. One step:

    cost = step(b, D) + sum(prefill of the newcomers) + max(first-token extra of the newcomers)

with b the requests decoding and D the deepest k among them (the drafter drafts
that deep for every request: vLLM's drafter runs batch-wide), read from the
profile (`bench.twin.costs`); an engine with no drafter pays `no_spec(b)`. The
whole step's time is then multiplied by the run's jitter for that step index
(`StepCosts.noise`, lognormal with median 1; `noise_start` offsets the index). A
newcomer's prefill costs its prompt tokens at the target's rate, plus the
drafter's where the depth source says the drafter prefills it; the first
drafts of the newcomers run as one batched pass, so the step pays the largest
first-token extra among them. Each decoding request at depth k_i <= D verifies
k_i drafts (on a `uniform` profile D where k_i > 0, as CUDA's FULL decode graphs
make it: `engine/vllm/batch_depth.py`; there a step with k = 0 requests beside
drafting ones costs `StepCosts.mixed_factor` times step(b, D)) and accepts
min(run, drafts) of them (`bench.twin.requests`), emitting accepted + 1 tokens,
capped at the tokens it has left. A step with newcomers is reported with
`prefill_requests > 0` (the cost model files no such step).

A mode is a `DepthSource`: the engine asks it for each request's depth at
arrival, for one depth per step where the mode is engine-wide, and tells it of
every step and every finished request. Single-threaded, no wall clock, no
unordered iteration: the same inputs give the same results, bit for bit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from bench.twin.arrivals import Arrivals
from bench.twin.costs import StepCosts
from bench.twin.engine_fixed import simulate_fixed
from bench.twin.live import (
    Live,
    decode_at,
    decode_bounded,
    decode_own,
    decode_uniform,
    outcome_of,
    record_of,
)
from bench.twin.records import RequestRecord, RunResult
from bench.twin.requests import TwinRequest
from engine.interface import EngineStep, RequestOutcome

if TYPE_CHECKING:
    from bench.twin.modes.verify import BudgetedVerification

#: vLLM's default `max_num_seqs`: requests beyond it wait outside the batch.
MAX_RUNNING = 256


class VirtualClock:
    """The twin's time in seconds; the engine advances it, the control plane reads it."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Plan(NamedTuple):
    """A mode's answer for one arriving request."""

    #: Depth the request verifies (engine-wide modes: the depth at its arrival).
    k: int
    #: Lower every request already in the engine to at most this as it enters (None: no).
    cap: int | None = None
    #: The mode's own handle, passed back to `enter` and `finish`.
    handle: Any = None
    #: The depth its class chose at its load (differs from k where a probe replaced it
    #: or a batch rule held it below or let it ride above; None: k).
    chosen: int | None = None


class LiveRequest(Protocol):
    """What a mode may read of a request in the engine (the clairvoyant bound reads draws;
    a per-step rule reads the plan, whose handle names the request's class)."""

    runs: bytes
    pos: int
    out: int
    plan: Plan


class DepthSource(Protocol):
    """A speculation mode as the engine sees it."""

    #: The engine loads a drafter (step costs from `batch_stats`; else `no_spec`).
    drafter: bool
    #: One depth for every request in a step (`step_depth`); else each request's own k.
    engine_wide: bool
    #: Wants `observe_step` with each step and `finish` with a full `RequestOutcome`.
    observes: bool

    @property
    def drafts_once_at_zero(self) -> bool:
        """Engine-wide modes whose depth-0 steps still draft one where depth 0 skips the
        drafter (`bench.twin.modes.static.EngineWide.drafts_once_at_zero`), read after
        each `step_depth`."""
        ...

    #: Engine-wide modes some of whose requests verify no drafts whatever the step's depth
    #: (`drafts`).
    bounded: bool

    #: Adaptive verification: prices each step and verifies each request's admitted
    #: drafts (`bench.twin.modes.verify`); None: the depth rules above.
    verification: BudgetedVerification | None

    def drafts(self, live: LiveRequest) -> bool:
        """Bounded modes: whether a request verifies the step's depth (else none)."""
        ...

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan: ...

    def enter(self, plan: Plan) -> None: ...

    def prefills_drafter(self, k: int) -> bool:
        """Whether a request entering at depth k pays the drafter's prefill."""
        ...

    def step_depth(self, batch: int, running: Sequence[LiveRequest]) -> int:
        """Engine-wide modes: the depth of the next step of `batch` decoding requests."""
        ...

    def verified(self, batch: int, depth: int, accepted: int) -> None:
        """Engine-wide modes: a decode step's batch, depth and summed accepted drafts."""
        ...

    def observe_step(self, step: EngineStep) -> None: ...

    def finish(self, plan: Plan, outcome: RequestOutcome | None) -> None: ...


def simulate(
    requests: list[TwinRequest],
    source: DepthSource,
    costs: StepCosts,
    clock: VirtualClock,
    *,
    times: list[float] | None = None,
    clients: int = 1,
    max_running: int = MAX_RUNNING,
    noise_start: int = 0,
) -> RunResult:
    """Replay `requests` through the engine under one mode; see the module docstring.

    A source with `fixed_depths` (its plans' depths hold for each request's life and it
    reads nothing of the run) is replayed by `bench.twin.engine_fixed`, to the same result,
    unless its requests' depths differ and the profile verifies them uniformly.
    """
    arrivals = Arrivals(requests, times, clients)
    # Under the uniform rule a request's drafts follow its batch-mates' depths.
    fixed = getattr(source, "fixed_depths", False) and not source.observes
    if fixed and (source.engine_wide or not costs.uniform) and not costs.idle_skips_drafter:
        return simulate_fixed(requests, source, costs, clock, arrivals, max_running, noise_start)
    waiting: deque[Live] = deque()
    running: list[Live] = []
    records: list[RequestRecord] = []
    clock.now = 0.0
    steps = 0
    first_arrival: float | None = None
    depth = costs.max_k
    noise = costs.noise
    observes = source.observes
    while True:
        now = clock.now
        newcomers: list[Live] = []
        if waiting:
            _admit(waiting, running, newcomers, source, costs, now, max_running)
        if arrivals.next_at <= now:
            for request, at in arrivals.due(now):
                if first_arrival is None:
                    first_arrival = at
                # Planned at arrival with the load it sees, admitted at once if there is room.
                in_engine = len(running) + len(newcomers)
                plan = source.arrive(request, in_engine, len(waiting))
                waiting.append(Live(request, plan, at, depth, in_engine + 1))
                _admit(waiting, running, newcomers, source, costs, now, max_running)
        if not running and not newcomers:
            later = arrivals.next_time()
            if later is None:
                break
            clock.now = later
            continue
        jitter = noise[(noise_start + steps) % len(noise)]
        steps += 1
        done = _step(running, newcomers, source, costs, clock, jitter)
        for live in done:
            last = clock.now
            records.append(record_of(live, last))
            source.finish(live.plan, outcome_of(live, last) if observes else None)
            arrivals.freed()
    makespan = clock.now - (first_arrival or 0.0)
    return RunResult(records, makespan, steps)


def _admit(
    waiting: deque[Live],
    running: list[Live],
    newcomers: list[Live],
    source: DepthSource,
    costs: StepCosts,
    now: float,
    max_running: int,
) -> None:
    """Admit waiting requests (first come, first served) up to `max_running` into
    `newcomers`; each applies its cap to the requests in the engine as it enters."""
    while waiting and len(running) + len(newcomers) < max_running:
        live = waiting.popleft()
        cap = live.plan.cap
        if cap is not None:
            for other in running:
                if other.k > cap:
                    other.k = cap
            for other in newcomers:
                if other.k > cap:
                    other.k = cap
        live.enter_t = now
        prompt = live.request.prompt_tokens
        live.prefill_s = prompt * costs.prefill_target_s
        if source.prefills_drafter(live.k):
            live.prefill_s += prompt * costs.prefill_drafter_s
        elif costs.idle_skips_drafter:
            live.drafter_s = prompt * costs.prefill_drafter_s
        source.enter(live.plan)
        newcomers.append(live)


def _step(
    running: list[Live],
    newcomers: list[Live],
    source: DepthSource,
    costs: StepCosts,
    clock: VirtualClock,
    jitter: float = 1.0,
) -> list[Live]:
    """Run one engine step, its time times `jitter`; returns the requests that finished
    in it (in batch order)."""
    b = len(running)
    engine_wide = source.engine_wide
    depth = 0
    #: Drafts scheduled in the step (each request's own k where the depth is not shared).
    drafts = 0
    drafting = b
    verification = getattr(source, "verification", None)
    if b and verification is not None:
        seconds, depth, drafting, drafts = verification.price(running)
    elif b:
        if engine_wide:
            depth = source.step_depth(b, running)
            if source.bounded:
                drafting = sum(1 for live in running if source.drafts(live))
            drafts = drafting * depth
        else:
            drafting = 0
            for live in running:
                k = live.k
                drafts += k
                drafting += k > 0
                if k > depth:
                    depth = k
            if costs.uniform:
                drafts = drafting * depth
        if not source.drafter:
            seconds = costs.no_spec[b]
        elif depth == 0 and source.drafts_once_at_zero:
            # Its requests may draft later: where depth 0 skips the drafter the engine
            # drafts one (verified by none), else the step keeps the drafter's KV pass.
            held = costs.held_zero
            if held is not None:
                seconds = held[b]
            else:
                seconds = costs.spec[b][1 if costs.zero_skips_drafter else 0]
        else:
            # k = 0 requests beside drafting ones: not one width, no FULL graph (`mixed`)
            seconds = costs.spec[b][depth] * costs.mixed_factor(b, depth, b - drafting)
    else:
        seconds = 0.0
    if newcomers:
        extra = 0.0
        first_extra = costs.first_extra_s
        # The drafter runs in the step (its prefill of every newcomer with it) unless no
        # request drafts in it, now or later: no running one, and no newcomer.
        drafting_step = costs.idle_skips_drafter and (
            (depth > 0 and drafting > 0)
            or (engine_wide and b > 0 and source.drafts_once_at_zero)
            or any(_drafts_later(source, live, engine_wide) for live in newcomers)
        )
        for live in newcomers:
            seconds += live.prefill_s
            if drafting_step:
                seconds += live.drafter_s
            k = depth if engine_wide and b else live.k
            if k > 0 and first_extra[k] > extra:
                extra = first_extra[k]
        seconds += extra
    seconds *= jitter
    clock.now += seconds
    now = clock.now
    done: list[Live] = []
    if verification is not None:
        if b:
            verification.decode(running, done)
    elif engine_wide:
        if source.bounded:
            accepted_sum = decode_bounded(running, depth, done, source.drafts)
        else:
            accepted_sum = decode_at(running, depth, done)
        if b:
            source.verified(b, depth, accepted_sum)
    elif costs.uniform:
        decode_uniform(running, depth, done)
    else:
        decode_own(running, done)
    if source.observes:
        prefill_tokens = 0
        for live in newcomers:
            prefill_tokens += live.request.prompt_tokens
        source.observe_step(EngineStep(seconds, b, b + drafts, len(newcomers), prefill_tokens))
    if done:
        running[:] = [live for live in running if live.pos < live.out]
    for live in newcomers:
        live.first_t = now
        live.pos = 1
        if live.out <= 1:
            done.append(live)
        else:
            running.append(live)
    return done


def _drafts_later(source: DepthSource, live: Live, engine_wide: bool) -> bool:
    """Whether a newcomer may draft in its life: a voter of an engine-wide bounded mode,
    every request of another engine-wide mode, else a request at k > 0."""
    if engine_wide:
        return source.drafts(live) if source.bounded else True
    return live.k > 0
