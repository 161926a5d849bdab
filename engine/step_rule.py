"""One depth per engine step, chosen for the whole batch: the step-depth rule.

Pure Python: the scheduler runs it in the engine core (`engine.vllm.scheduler`), the
gateway's control plane builds its inputs (`ControlPlane._with_vote`), and the twin
runs the same code in virtual time (`bench.twin.modes.adaptive_step`).

On CUDA the engine verifies one depth d per step (every drafting request verifies
d, the others none; `engine/vllm/batch_depth.py`), and the step's time is the batch's
at that depth, c(B, d). A per-request k from each class's own argmax ignores that
the deepest vote sets everyone's cost. This rule instead picks, per step,

    d* = argmax_d  sum_r E_r(d) / c(B, d),   E_r(d) = 1 + sum_{j<=d} prod_{i<=j} p_{r,i}

(the expected tokens of a chain of d drafts, `DepthProfile.expected_tokens`), with
request r drafting at d when that gains it anything (E_r(d) > 1) and verifying
none otherwise. Requests of one class share p, so the batch comes as groups
(acceptance vector, count): O(G K) for G groups, O(B K) at worst.

Guard (`floor`): no request may lose by the step's depth, E_r(d) / c(B, d) >=
floor / c(B, 0): its tokens per unit time at d against the same step at depth 0.
A class whose acceptance makes every d > 0 a loss thus holds the whole batch at 0
(its null yardstick), and a weak class caps how deep its batch-mates go. `floor`
None turns the guard off (pure throughput). Ties go to the shallower depth.

Anchors: each voter also sends the depth its class chose at its load (the
controller's, which moves only for a gain above its hysteresis). Where the best of
the step's anchors that the guard allows reads within `ANCHOR_MARGIN` of d*, the step
runs there instead: the rule's argmax between near-tied depths follows the noise of
the estimates, the anchor does not.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: A depth must beat the best so far by this relative margin (ties to the shallower).
TIE = 1e-12
#: The guard the engine runs the rule with (`floor`): no request's tokens per unit time
#: at the step's depth below the same step's at depth 0; speculation is never its loss.
GUARD = 1.0
#: Consecutive steps the rule holds a voter at depth 0 before the voter runs at k = 0 for
#: the rest of its life (a depth only goes down, as under a cap). A held step keeps the
#: drafter for its voters, who may draft later (Model Runner V2's KV pass, the V1
#: runner's one draft), which a step without voters skips; a hold this long says the load
#: has outgrown what the voter's class gains from drafting. 64 read best of 16 to 256 in
#: the twin (`python -m bench twin`, `adaptive-step`: 1.064 of the best static depth on the
#: MoE profile at a Poisson rate); shorter holds retired voters a later step would use.
RETIRE_AFTER = 64
#: A step runs at a depth its voters' classes chose (`StepVote.anchor`, held with the
#: controller's hysteresis) where that reads within this relative margin of the rule's
#: best: between depths this close the estimates' noise, not the traffic, picks the
#: argmax, and the step's depth would flip with it. Half the controller's 3 %
#: hysteresis; 1 % and 3 % settled worse in the twin (`python -m bench twin`, the
#: comparison in bench/HISTORY.md).
ANCHOR_MARGIN = 0.015


def held_after(held: int, depth: int) -> int:
    """A voter's run of consecutive steps held at depth 0, after a step at `depth`; it
    retires from voting at `RETIRE_AFTER`."""
    return held + 1 if depth == 0 else 0


@dataclass(frozen=True, slots=True)
class StepDepth:
    """The rule's answer: the step's depth, who drafts, and the expected tokens per cost."""

    depth: int
    #: Per group (or request), in input order: it verifies `depth` drafts (else none).
    drafts: tuple[bool, ...]
    #: Expected tokens of the step over its cost (the cost's unit: seconds or relative).
    rate: float


def expected_tokens(p: Sequence[float], max_depth: int) -> list[float]:
    """E[tokens | d] for d = 0..max_depth; positions beyond `p` take its last value."""
    out = [1.0]
    chain = 1.0
    last = p[-1] if p else 0.0
    for d in range(max_depth):
        chain *= p[d] if d < len(p) else last
        out.append(out[-1] + chain)
    return out


def choose_step_depth(
    groups: Sequence[tuple[Sequence[float], int]],
    costs: Sequence[float],
    floor: float | None = 1.0,
    riding: Sequence[tuple[Sequence[float], int]] = (),
    anchors: Collection[int] = (),
    margin: float = ANCHOR_MARGIN,
) -> StepDepth:
    """The step's depth for `groups` of (p_1..p_K, requests) at step costs `costs`
    (c(B, d) for d = 0..K, any unit; only ratios matter), beside `riding` groups that
    verify the step's depth (E(d) tokens each) with no guard and no say in whether the
    step drafts: alone they leave it at 0. A riding group without acceptance (p = ())
    verifies none: one token a step each, a request without a vote. `anchors`: depths
    the groups' classes chose; the best of them that the guard allows wins where its
    rate is within `margin` of the best depth's. Module docstring."""
    if not costs or costs[0] <= 0:
        raise ValueError("step costs need c(B, 0) > 0")
    max_depth = len(costs) - 1
    gains = [expected_tokens(p, max_depth) for p, _ in groups]
    live = [(g, n) for g, (_, n) in zip(gains, groups, strict=True) if n > 0]
    if not live:
        return StepDepth(0, tuple(False for _ in groups), 0.0)
    along = [(expected_tokens(p, max_depth), n) for p, n in riding if n > 0]
    requests = sum(n for _, n in live) + sum(n for _, n in along)
    best, best_rate = 0, requests / costs[0]
    rates = [best_rate] + [-1.0] * max_depth  # -1: a depth the step cannot run
    for d in range(1, max_depth + 1):
        cost = costs[d]
        if cost <= 0:
            continue
        tokens = 0.0
        for group, n in along:
            tokens += n * group[d]
        worst = float("inf")
        for group, n in live:
            tokens += n * group[d]
            worst = min(worst, group[d])
        if floor is not None and worst * costs[0] < floor * cost:
            continue
        rate = rates[d] = tokens / cost
        if rate > best_rate * (1 + TIE):
            best, best_rate = d, rate
    if anchors:
        held = max(
            (a for a in set(anchors) if 0 <= a <= max_depth and rates[a] >= 0.0),
            key=lambda a: (rates[a], -a),
            default=best,
        )
        if rates[held] * (1 + margin) >= best_rate:
            best, best_rate = held, rates[held]
    drafts = tuple(
        best > 0 and n > 0 and g[best] > 1.0 for g, (_, n) in zip(gains, groups, strict=True)
    )
    return StepDepth(best, drafts, best_rate)


# ---- what travels to the engine --------------------------------------------------------
#: `SamplingParams.extra_args` key of a request's vote (`StepVote.to_arg`). Gateway-only.
SPEC_VOTE_ARG = "specgw_vote"
#: `SamplingParams.extra_args` key of the step costs (`StepCostTable.to_arg`) as the
#: gateway's cost model had them when the request was admitted. Gateway-only.
SPEC_COSTS_ARG = "specgw_costs"
#: `SamplingParams.extra_args` key of other classes' newer estimates (`StepArgs.news`).
SPEC_NEWS_ARG = "specgw_news"


@dataclass(frozen=True, slots=True)
class StepVote:
    """A request's part in the step rule: its class's live p_1..p_K at admission, its
    class (whose newer estimates later requests bring, `Estimates`) and, where the control
    plane explores a deeper depth for the class, that depth (`probe`)."""

    acceptance: tuple[float, ...]
    probe: int = 0
    class_id: str = ""
    #: A rider: a request at k = 0, so it has no say in the step's depth; it
    #: verifies the depth its step's voters set, counted at its class's E(d) with no
    #: guard (the step runs at that depth whatever it does), while its drafter KV is
    #: whole (`engine.vllm.step_votes`).
    rides: bool = False
    #: The depth its class chose at its load with the controller's hysteresis (-1:
    #: none): the step keeps to it where the rule's best gains little (`ANCHOR_MARGIN`).
    anchor: int = -1

    def to_arg(self) -> dict[str, Any]:
        arg = {"p": list(self.acceptance), "probe": self.probe, "class": self.class_id}
        if self.rides:
            arg["rides"] = True
        if self.anchor >= 0:
            arg["anchor"] = self.anchor
        return arg

    @classmethod
    def from_arg(cls, value: object) -> StepVote | None:
        """The vote in `value` (what `to_arg` wrote), None when malformed: such a request
        keeps its own k as its step depth, as if it carried no vote."""
        if not isinstance(value, Mapping):
            return None
        acceptance = _acceptance(value.get("p"))
        probe, class_id = value.get("probe", 0), value.get("class", "")
        rides = value.get("rides", False)
        anchor = value.get("anchor", -1)
        if (
            acceptance is None
            or not isinstance(probe, int)
            or not isinstance(class_id, str)
            or not isinstance(rides, bool)
            or not isinstance(anchor, int)
            or isinstance(anchor, bool)
        ):
            return None
        return cls(acceptance, max(0, probe), class_id, rides, max(-1, anchor))


def _acceptance(value: object) -> tuple[float, ...] | None:
    """p_1..p_K from the wire: a non-empty list of probabilities, else None."""
    if not isinstance(value, list | tuple) or not value:
        return None
    try:
        acceptance = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        return None
    return acceptance if all(0.0 <= x <= 1.0 for x in acceptance) else None


class Estimates:
    """The newest p_1..p_K of each class, as the requests brought them.

    A request lives seconds to minutes, and its class's estimates move under it (a drift,
    the forgetting counts); each newcomer brings its own class's estimates and those of the
    other classes in flight that moved since last sent (`StepArgs.news`), so every voter
    is read at its class's newest, not its admission's (the twin: at concurrency 64 the
    admission snapshot lost up to 3 % on the measured H100 profile,
    `python -m bench twin`). At most MAX_CLASSES, the least recently updated dropped.
    """

    MAX_CLASSES = 4096

    def __init__(self) -> None:
        self._by_class: dict[str, tuple[float, ...]] = {}

    def take(self, vote: StepVote, news: Mapping[str, tuple[float, ...]]) -> None:
        by_class = self._by_class
        for class_id, acceptance in (*news.items(), (vote.class_id, vote.acceptance)):
            if class_id:
                by_class.pop(class_id, None)
                by_class[class_id] = acceptance
        while len(by_class) > self.MAX_CLASSES:
            del by_class[next(iter(by_class))]

    def current(self, vote: StepVote) -> tuple[float, ...]:
        return self._by_class.get(vote.class_id, vote.acceptance)


@dataclass(frozen=True, slots=True)
class StepCostTable:
    """c(B, d) / c(B, 0) for d = 0..K per batch bucket, and the time to the first token
    at each d in steps at depth 0 (empty rows: not calibrated).

    Buckets are powers of two; batch B reads the smallest bucket >= B, the last one
    above it: the cost model's own bucketing (`gateway.control.cost_steps.batch_bucket`).
    """

    buckets: tuple[int, ...]
    decode: tuple[tuple[float, ...], ...]
    first: tuple[tuple[float, ...], ...]

    def row(self, batch: int) -> int:
        for i, bucket in enumerate(self.buckets):
            if batch <= bucket:
                return i
        return len(self.buckets) - 1

    def costs(self, batch: int, newcomers: bool) -> tuple[float, ...]:
        """The step's relative cost at each depth: the decode step, plus, in a step that
        newcomers enter, their first drafts at that depth (the drafter drafts every
        newcomer's first chain at the step's depth)."""
        i = self.row(batch)
        decode = self.decode[i]
        first = self.first[i] if newcomers else ()
        if len(first) != len(decode):
            return decode
        return tuple(c + max(f - first[0], 0.0) for c, f in zip(decode, first, strict=True))

    def to_arg(self) -> dict[str, Any]:
        return {
            "buckets": list(self.buckets),
            "decode": [list(r) for r in self.decode],
            "first": [list(r) for r in self.first],
        }

    @classmethod
    def from_arg(cls, value: object) -> StepCostTable | None:
        """The table in `value`, None when malformed (the engine keeps its last one)."""
        if not isinstance(value, Mapping):
            return None
        try:
            buckets = tuple(int(b) for b in value["buckets"])
            decode = tuple(tuple(float(c) for c in r) for r in value["decode"])
            first = tuple(tuple(float(c) for c in r) for r in value["first"])
        except (KeyError, TypeError, ValueError):
            return None
        if (
            not buckets
            or len(decode) != len(buckets)
            or len(first) != len(buckets)
            or list(buckets) != sorted(set(buckets))
            or any(not r or r[0] <= 0 for r in decode)
        ):
            return None
        return cls(buckets, decode, first)


@dataclass(frozen=True, slots=True)
class StepArgs:
    """What a voter sends the engine: its vote, the step costs of its admission, and the
    newer estimates of the other classes in flight (`Estimates`)."""

    vote: StepVote
    costs: StepCostTable
    news: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def extra_args(self) -> dict[str, Any]:
        """The `SamplingParams.extra_args` entries that carry them."""
        args = {SPEC_VOTE_ARG: self.vote.to_arg(), SPEC_COSTS_ARG: self.costs.to_arg()}
        if self.news:
            args[SPEC_NEWS_ARG] = {c: list(p) for c, p in self.news.items()}
        return args


def news_from_arg(value: object) -> dict[str, tuple[float, ...]]:
    """The classes' estimates in `value` (`StepArgs.extra_args`); malformed entries dropped."""
    if not isinstance(value, Mapping):
        return {}
    news = {}
    for class_id, raw in value.items():
        acceptance = _acceptance(raw)
        if isinstance(class_id, str) and class_id and acceptance is not None:
            news[class_id] = acceptance
    return news


def vote_step_depth(
    votes: Sequence[StepVote],
    table: StepCostTable,
    batch: int,
    newcomers: bool,
    allowed: Collection[int] | None = None,
    floor: float | None = 1.0,
    estimates: Estimates | None = None,
    riders: int = 0,
) -> int:
    """The step's depth for the voters in it: `choose_step_depth` over their classes
    (votes with equal acceptance form one group) at the table's costs for `batch`.

    `allowed`: the depths the engine can run as one step (a FULL decode graph); the
    others are never chosen. `estimates`: each voter read at its class's newest.
    `riders`: the step's requests without a vote, which verify none at any depth but
    pay the step's time (`choose_step_depth`); votes that ride (`StepVote.rides`) are
    counted at their class's E(d) without the guard, and a step of riders alone runs
    at 0. A probe runs the step at its depth only where its class is the whole step: in
    a mixed batch every request would pay for it, and there the other classes' deeper
    votes already try those positions.
    """
    counts: dict[tuple[float, ...], int] = {}
    riding: dict[tuple[float, ...], int] = {}
    anchors: set[int] = set()
    probe = 0
    for vote in votes:
        p = vote.acceptance if estimates is None else estimates.current(vote)
        if vote.rides:
            riding[p] = riding.get(p, 0) + 1
            continue
        counts[p] = counts.get(p, 0) + 1
        probe = max(probe, vote.probe)
        if vote.anchor >= 0:  # a depth outside `allowed` costs 0 below: no anchor there
            anchors.add(vote.anchor)
    if not counts:
        return 0
    costs = list(table.costs(batch, newcomers))
    if allowed is not None:
        costs = [c if d == 0 or d in allowed else 0.0 for d, c in enumerate(costs)]
    # Requests without a vote first: the sums then add in the order they always did.
    passengers = [((), riders), *riding.items()] if riders > 0 else list(riding.items())
    depth = choose_step_depth(list(counts.items()), costs, floor, passengers, anchors).depth
    if len(counts) == 1 and not passengers and probe > depth:
        max_depth = len(costs) - 1
        target = min(probe, max_depth)
        deeper = [d for d in range(target, max_depth + 1) if allowed is None or d in allowed]
        depth = min(deeper, default=depth)
    return depth
