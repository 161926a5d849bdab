"""What every speculation policy sees and returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.control.depth_profile import DepthProfile


# Not frozen: both are built once per policy evaluation on the request path, and a
# frozen dataclass's __init__ (object.__setattr__ per field) costs over a microsecond
# more; neither outlives the evaluation.
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
    #: requests cache apart, `engine.scheduler`). 0 elsewhere: leaving k > 0 is not priced.
    switch_steps: float = 0.0


@dataclass(slots=True)
class Choice:
    k: int
    reason: str
    #: Expected goodput per k (empty when the policy did not compute it).
    goodput: tuple[float, ...] = ()


class Policy(Protocol):
    name: str

    def choose(self, inp: PolicyInput) -> Choice: ...
