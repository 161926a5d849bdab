"""The policy seam: what a speculation policy reads, returns and hears.

A policy turns one class's evidence at one batch bucket into a k. The controller
calls it off the request path (`ClassState.refresh`, after each response), and
inline only for a bucket or flag bounds it has not evaluated:

    inp = policy.inputs(situation)   # the policy gathers what it reads
    choice = policy.choose(inp)      # the k and why
    policy.score(inp)                # its objective per k (the k = 0 probe gate asks it)
    policy.observe(class_id, outcome)  # each finished request of a live class
    policy.forget(class_id)          # the class was evicted

`BasePolicy` gives the common inputs and no memory; a policy that needs more
(a reply length, a prompt-cache price) gathers it in its own `inputs` and keeps
per-class memory fed by `observe`. Policies are built by name from
`gateway.control.policies.POLICIES`, each with its parameter model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from engine.interface import RequestOutcome
from gateway.control.cost_model import CostModel
from gateway.control.depth_profile import DepthProfile
from gateway.control.estimator import AcceptanceEstimator

if TYPE_CHECKING:
    from gateway.control.settings import ControllerSettings


# Not frozen: both are built once per policy evaluation, and a frozen dataclass's
# __init__ (object.__setattr__ per field) costs over a microsecond more; neither
# outlives the evaluation.
@dataclass(slots=True)
class PolicyInput:
    """A class's evidence and situation at one batch bucket."""

    profile: DepthProfile
    #: Requests since the class appeared or last drifted (merged ones included).
    samples: float
    current_k: int
    k_min: int
    k_max: int
    #: Requests of the class since its k at this bucket last changed.
    since_change: int
    #: cost(k, b) / cost(0, b) for k = 0..K from the cost model.
    relative_cost: tuple[float, ...]
    #: Time to the first token at k = 0..K in steps at k = 0 (empty: not measured).
    first_token: tuple[float, ...] = ()
    #: Mean output tokens of the class's requests (what the first token is spread over).
    output_tokens: float = 0.0
    #: At current_k = 0: steps at k = 0 a request at any k > 0 pays on top of `first_token`,
    #: prefilling again the prompt tokens the class's k = 0 runs find cached (k = 0
    #: requests cache apart, `engine.vllm.scheduler`). 0 elsewhere: leaving k > 0 is not priced.
    switch_steps: float = 0.0


@dataclass(slots=True)
class Choice:
    k: int
    reason: str
    #: Expected goodput per k (empty when the policy did not compute it).
    goodput: tuple[float, ...] = ()
    #: A deeper depth the estimate favours but the evidence does not yet carry past the
    #: margin: exploration probes it (`Exploration.probe`) so the evidence arrives.
    reach: int | None = None


@dataclass(slots=True)
class Situation:
    """One class at one batch bucket, as the controller holds it: where a policy's
    inputs come from."""

    class_id: str
    estimator: AcceptanceEstimator
    cost: CostModel
    bucket: int
    current_k: int
    k_min: int
    k_max: int
    #: Requests of the class since its k at this bucket last changed.
    since_change: int


class Policy(Protocol):
    name: str

    def inputs(self, at: Situation) -> PolicyInput:
        """What this policy reads of the class and the cost model at `at`."""
        ...

    def choose(self, inp: PolicyInput) -> Choice: ...

    def score(self, inp: PolicyInput) -> tuple[float, ...]:
        """The objective `choose` maximises, for k = 0..min(k_max, K)."""
        ...

    def observe(self, class_id: str, outcome: RequestOutcome) -> None:
        """A finished request of a live class (after the estimator has it)."""
        ...

    def forget(self, class_id: str) -> None:
        """The class was evicted: drop what the policy keeps for it."""
        ...

    def under_queue(self, at: Situation, k: int, queued: int, batch: int) -> int:
        """The depth at most k for a request deciding while `queued` requests wait for
        admission beside a batch of `batch` (its chosen k where the policy prices no queue)."""
        ...


def shared_inputs(at: Situation) -> PolicyInput:
    """The inputs every policy can use: the depth profile and its samples, the k and
    its bounds, the dwell, and the bucket's relative step costs."""
    est = at.estimator
    return PolicyInput(
        profile=est.profile(),
        samples=est.samples_since_reset,
        current_k=at.current_k,
        k_min=at.k_min,
        k_max=at.k_max,
        since_change=at.since_change,
        relative_cost=at.cost.relative_costs(at.bucket),
    )


class BasePolicy:
    """Defaults of the seam: the shared inputs, no per-class memory."""

    name = "base"

    def inputs(self, at: Situation) -> PolicyInput:
        return shared_inputs(at)

    def observe(self, class_id: str, outcome: RequestOutcome) -> None:
        return None

    def forget(self, class_id: str) -> None:
        return None

    def under_queue(self, at: Situation, k: int, queued: int, batch: int) -> int:
        return k


P = TypeVar("P", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class PolicySpec(Generic[P]):
    """A policy's parameter model and its factory.

    Parameters are read from the `ControllerSettings` field of the same name where
    there is one (bounds and `--help` there), then from `policy_params` (a policy's
    own parameters: `SPECGW_CONTROL_POLICY_PARAMS='{"share": 0.5}'`); the model
    validates them and supplies defaults.
    """

    params: type[P]
    factory: Callable[[P], Policy]

    def parameters(self, settings: ControllerSettings) -> P:
        known = type(settings).model_fields
        values: dict[str, object] = {
            name: getattr(settings, name) for name in self.params.model_fields if name in known
        }
        values.update(settings.policy_params)
        try:
            return self.params.model_validate(values)
        except ValidationError as err:  # named for the settings' own error
            raise ValueError(f"policy {settings.policy!r}: {err}") from None

    def build(self, settings: ControllerSettings) -> Policy:
        return self.factory(self.parameters(settings))
