"""The engine twin's two inputs, a cost profile and a workload, as validated JSON.

Both models forbid unknown keys, so a typo is an error, not a silently ignored
field; `load_profile` / `load_workload` turn pydantic's errors into one line that
names the file and the field path (`TwinInputError`).

The profile's step costs are read the way vLLM's dynamic speculative decoding
profiler writes them (`batch_stats: {batch: {k: median step ms}}`) and
interpolated as follows (`Profile.step_ms`):

- in k, linearly between the neighbouring measured depths of that batch size;
  beyond the deepest measured k, linearly from the last two (never below the
  deepest one's time); k = 0 must be measured at every batch size;
- in the batch size, linearly between measured batch sizes; beyond the largest,
  linearly from the last two (never below the largest one's time); batch 1 must
  be measured.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

#: The deepest draft a request can verify in the twin (the controller's own bound).
MAX_DEPTH = 16
#: Mix fractions of a phase must sum to 1 within this.
MIX_TOLERANCE = 1e-6


class TwinInputError(ValueError):
    """A profile or workload file that does not validate; the message is one line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _linear(points: Mapping[int, float], x: float) -> float:
    """Piecewise-linear through `points` (sorted by key): interpolated between the
    neighbours, extrapolated from the last two beyond the largest key (never below
    the largest key's value), the first value below the smallest key."""
    keys = sorted(points)
    if x <= keys[0]:
        return points[keys[0]]
    if x >= keys[-1]:
        last = points[keys[-1]]
        if len(keys) == 1:
            return last
        a, b = keys[-2], keys[-1]
        slope = (points[b] - points[a]) / (b - a)
        return max(last, last + slope * (x - b))
    for a, b in itertools.pairwise(keys):
        if a <= x <= b:
            return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
    raise AssertionError("unreachable: x lies within the keys")


class PrefillCost(_Strict):
    """Prefill milliseconds per prompt token: the target's, and the drafter's extra."""

    target: float = Field(ge=0)
    drafter: float = Field(ge=0)


class MixedStepCost(_Strict):
    """What a step mixing k = 0 and drafting requests costs, as a multiple of the uniform
    step at its depth. Under `uniform` batch depth vLLM runs such a step PIECEWISE
    (attention outside the graphs), and its k = 0 requests verify nothing, so it loses the
    FULL graph and gains the rows it does not verify (`bench/gpu/gpu_pieces.py`). Under
    `per-request` depths (the CPU engine) its k = 0 requests verify nothing either, and no
    graph is lost (`bench/mixed_step_cpu.py`); a step whose drafting requests differ in
    depth is priced as if all drafted its deepest, an upper estimate.

    `ratio[batch][depth][share]`, share the fraction of the batch at k = 0; share 0 is the
    limit of one k = 0 request in a large batch (the graph loss alone). Between measured
    points linear in each of share, depth and batch; beyond them the nearest measured
    value."""

    source: str = Field(min_length=1)
    ratio: dict[int, dict[int, dict[float, Annotated[float, Field(gt=0)]]]]

    @field_validator("ratio")
    @classmethod
    def _grid(
        cls, value: dict[int, dict[int, dict[float, float]]]
    ) -> dict[int, dict[int, dict[float, float]]]:
        if not value:
            raise ValueError("needs at least one batch size")
        for batch, depths in value.items():
            if batch < 2 or not depths:
                raise ValueError(f"batch {batch}: a mixed step needs batch >= 2 and depths")
            for depth, shares in depths.items():
                if not 1 <= depth <= MAX_DEPTH or not shares:
                    raise ValueError(f"batch {batch}: depth {depth} needs 1..{MAX_DEPTH}, shares")
                if any(not 0 <= share < 1 for share in shares):
                    raise ValueError(f"batch {batch}, depth {depth}: shares must be in [0, 1)")
        return value


class Profile(_Strict):
    """A cost profile: step times by batch size and depth, prefill and first-token costs."""

    name: str = Field(min_length=1)
    source: str = Field(min_length=1)
    max_k: int = Field(ge=1, le=MAX_DEPTH)
    batch_stats: dict[int, dict[int, float]]
    no_spec_step_ms: dict[int, float] | None = None
    prefill_ms_per_token: PrefillCost
    first_token_extra_ms: dict[int, float] = Field(default_factory=dict)
    #: Marginal acceptance per position the profile was measured with (vLLM's profiler).
    acceptance_rate_per_pos: list[Annotated[float, Field(ge=0, le=1)]] | None = None
    #: The workload (by name) this profile runs by default (`python -m bench twin`).
    workload: str | None = None
    #: How a step's requests verify under modes that give each request its own k
    #: (`engine/vllm/batch_depth.py`): `per-request`, each its own k (the CPU engine);
    #: `uniform`, every drafting request the step's deepest k, k = 0 none (CUDA with
    #: FULL decode graphs, vLLM's default).
    batch_depth: Literal["per-request", "uniform"] = "per-request"
    #: A step at depth 0 skips the drafter, so `batch_stats` k = 0 holds no drafter work
    #: (vLLM's V1 runner with the gateway's draft skip, as on the CPU); false where a
    #: depth-0 step still runs the drafter's KV pass (Model Runner V2, CUDA's default).
    #: The step rule's depth-0 steps then draft one (`engine/vllm/scheduler.py`).
    zero_skips_drafter: bool = False
    #: The cost of a step mixing k = 0 and drafting requests; None: the uniform step at
    #: its depth, as if every request verified it.
    mixed_step: MixedStepCost | None = None
    notes: str = ""

    @field_validator("batch_stats")
    @classmethod
    def _batches(cls, value: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
        if 1 not in value:
            raise ValueError("batch size 1 must be measured")
        for batch, row in value.items():
            if batch < 1:
                raise ValueError(f"batch size {batch} is not >= 1")
            if 0 not in row:
                raise ValueError(f"batch {batch}: k = 0 must be measured")
            for k, ms in row.items():
                if not 0 <= k <= MAX_DEPTH:
                    raise ValueError(f"batch {batch}: k = {k} is outside 0..{MAX_DEPTH}")
                if ms <= 0:
                    raise ValueError(f"batch {batch}, k = {k}: step time must be > 0 ms")
        return value

    @field_validator("no_spec_step_ms")
    @classmethod
    def _no_spec(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is not None:
            if 1 not in value:
                raise ValueError("batch size 1 must be measured")
            if any(b < 1 or ms <= 0 for b, ms in value.items()):
                raise ValueError("batch sizes must be >= 1 and step times > 0 ms")
        return value

    @field_validator("first_token_extra_ms")
    @classmethod
    def _first(cls, value: dict[int, float]) -> dict[int, float]:
        if any(not 0 <= k <= MAX_DEPTH or ms < 0 for k, ms in value.items()):
            raise ValueError(f"depths must be in 0..{MAX_DEPTH} and times >= 0 ms")
        return value

    def step_ms(self, batch: int, k: int) -> float:
        """Median ms of a decode step of `batch` requests whose deepest drafts k."""
        at_batch = {b: _linear(row, k) for b, row in self.batch_stats.items()}
        return _linear(at_batch, batch)

    def no_spec_ms(self, batch: int) -> float:
        """Median ms of a decode step of `batch` requests on an engine with no drafter."""
        if self.no_spec_step_ms is None:
            return self.step_ms(batch, 0)
        return _linear(self.no_spec_step_ms, batch)

    def first_token_extra(self, k: int) -> float:
        """Extra ms to the first token at depth k (0 at k = 0 unless measured)."""
        return _linear({0: 0.0, **self.first_token_extra_ms}, k)


class FixedLength(_Strict):
    dist: Literal["fixed"]
    value: int = Field(ge=1)


class UniformLength(_Strict):
    dist: Literal["uniform"]
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self


class LognormalLength(_Strict):
    dist: Literal["lognormal"]
    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min: int = Field(ge=1)
    max: int = Field(ge=1)

    @model_validator(mode="after")
    def _order(self) -> LognormalLength:
        if self.max < self.min:
            raise ValueError("max must be >= min")
        return self


Length = Annotated[FixedLength | UniformLength | LognormalLength, Field(discriminator="dist")]


class WorkloadClass(_Strict):
    """One class of requests: a sample OpenAI body, its acceptance and its lengths.

    `acceptance[d-1]` is P(draft d accepted | drafts 1..d-1 accepted); deeper
    positions take the last value.
    """

    request: dict[str, Any]
    endpoint: Literal["chat", "completions"] = "chat"
    acceptance: list[Annotated[float, Field(ge=0, le=1)]] = Field(min_length=1)
    prompt_tokens: Length
    output_tokens: Length
    temperature: float = Field(0.0, ge=0)
    #: The drafter's discrimination on this class (`Confidence.auc`); None: the workload's.
    confidence_auc: float | None = Field(None, ge=0.5, lt=1.0)

    @model_validator(mode="after")
    def _body(self) -> WorkloadClass:
        if self.endpoint == "chat" and not isinstance(self.request.get("messages"), list):
            raise ValueError("a chat class's request needs a `messages` list")
        if self.endpoint == "completions" and not isinstance(self.request.get("prompt"), str):
            raise ValueError("a completions class's request needs a `prompt` string")
        return self


class Shift(_Strict):
    """From fraction `after` of its phase's requests on, a class's acceptance is scaled."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    class_name: str = Field(alias="class")
    after: float = Field(ge=0, le=1)
    acceptance_scale: float = Field(ge=0)


class Phase(_Strict):
    name: str = Field(min_length=1)
    requests: int = Field(ge=1)
    mix: dict[str, Annotated[float, Field(ge=0)]]
    shifts: list[Shift] = Field(default_factory=list)
    acceptance_scale: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)

    @field_validator("mix")
    @classmethod
    def _sums_to_one(cls, value: dict[str, float]) -> dict[str, float]:
        total = sum(value.values())
        if abs(total - 1.0) > MIX_TOLERANCE:
            raise ValueError(f"fractions sum to {total:g}, not 1")
        return value


class ClosedArrival(_Strict):
    """C clients, each sending its next request when its previous one has finished."""

    kind: Literal["closed"]
    concurrency: int = Field(ge=1)

    @property
    def label(self) -> str:
        return f"c{self.concurrency}"


class PoissonArrival(_Strict):
    """Requests arriving with exponential gaps at `rate_per_s`."""

    kind: Literal["poisson"]
    rate_per_s: float | None = Field(None, gt=0)
    #: Instead of a rate: this share of the profile's no-speculation capacity (the
    #: `nospec` mode's requests per second with the engine full,
    #: `bench.twin.runner.capacity_rate`).
    load: float | None = Field(None, gt=0, le=2)

    @model_validator(mode="after")
    def _one_rate(self) -> PoissonArrival:
        if (self.rate_per_s is None) == (self.load is None):
            raise ValueError("a poisson arrival needs exactly one of rate_per_s and load")
        return self

    @property
    def label(self) -> str:
        if self.load is not None:
            return f"poisson-load{self.load:g}"
        return f"poisson{self.rate_per_s:g}"


Arrival = Annotated[ClosedArrival | PoissonArrival, Field(discriminator="kind")]


class Confidence(_Strict):
    """How well the drafter's confidence tells an accepted draft from a rejected one:
    the area under its ROC curve, per class (`WorkloadClass.confidence_auc`) or for the
    whole workload here, and where the figure comes from (`bench.twin.confidence`)."""

    auc: float = Field(0.75, ge=0.5, lt=1.0)
    source: str = "assumption: no measurement of this drafter's confidence"


class Workload(_Strict):
    """Classes, phases (mix and drift) and the arrival processes to replay them under."""

    name: str = Field(min_length=1)
    source: str = Field(min_length=1)
    classes: dict[str, WorkloadClass] = Field(min_length=1)
    phases: list[Phase] = Field(min_length=1)
    arrivals: list[Arrival] = Field(min_length=1)
    confidence: Confidence = Field(default_factory=Confidence)
    notes: str = ""

    def confidence_auc(self, name: str) -> float:
        own = self.classes[name].confidence_auc
        return self.confidence.auc if own is None else own

    @model_validator(mode="after")
    def _known_classes(self) -> Workload:
        for i, phase in enumerate(self.phases):
            named = [
                *((f"mix.{c}", c) for c in phase.mix),
                *((f"shifts.{j}.class", s.class_name) for j, s in enumerate(phase.shifts)),
                *((f"acceptance_scale.{c}", c) for c in phase.acceptance_scale),
            ]
            for path, name in named:
                if name not in self.classes:
                    raise ValueError(f"phases.{i}.{path}: unknown class {name!r}")
        labels = [a.label for a in self.arrivals]
        if len(set(labels)) != len(labels):
            raise ValueError(f"arrivals repeat: {', '.join(labels)}")
        return self

    @property
    def total_requests(self) -> int:
        return sum(p.requests for p in self.phases)


def _one_line(path: Path, error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{path}: {where + ': ' if where else ''}{message}{more}"


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise TwinInputError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise TwinInputError(f"{path}: not JSON: {exc.msg} (line {exc.lineno})") from None


def load_profile(path: Path) -> Profile:
    """Read and validate a cost profile; `TwinInputError` names the file and the field."""
    try:
        return Profile.model_validate(_read(path))
    except ValidationError as exc:
        raise TwinInputError(_one_line(path, exc)) from None


def load_workload(path: Path) -> Workload:
    """Read and validate a workload; `TwinInputError` names the file and the field."""
    try:
        return Workload.model_validate(_read(path))
    except ValidationError as exc:
        raise TwinInputError(_one_line(path, exc)) from None
