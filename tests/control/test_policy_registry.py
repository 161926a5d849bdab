"""The policy registry: a policy registered in a test runs through the controller.

`frugal` is the control README's example of a new policy (one module plus its
registry line): the shallowest k whose decode-only goodput E[tokens | k] / c(k, b)
reaches `share` of the best k's. Here it is registered for the test only.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from pydantic import BaseModel, ConfigDict, Field

from engine.interface import RequestOutcome
from gateway.control.controller import Controller
from gateway.control.decision import ControlOverrides, LoadSnapshot
from gateway.control.features import RequestFeatures
from gateway.control.policies import POLICIES, BasePolicy, Choice, PolicyInput, PolicySpec
from gateway.control.settings import ControllerSettings
from tests.control.simulator import simulate


class FrugalParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    share: float = Field(0.9, gt=0, le=1)
    min_samples: int  # the settings' field of that name


class FrugalPolicy(BasePolicy):
    name = "frugal"

    def __init__(self, params: FrugalParams) -> None:
        self.params = params
        #: Finished requests heard per class (`observe`), dropped on eviction (`forget`).
        self.heard: dict[str, int] = {}

    def score(self, inp: PolicyInput) -> tuple[float, ...]:
        k_max = min(inp.k_max, inp.profile.depth, len(inp.relative_cost) - 1)
        expected = inp.profile.expected_tokens()
        return tuple(expected[k] / inp.relative_cost[k] for k in range(k_max + 1))

    def choose(self, inp: PolicyInput) -> Choice:
        score = self.score(inp)
        k_min = min(inp.k_min, len(score) - 1)
        if inp.samples < self.params.min_samples:
            return Choice(min(max(inp.current_k, k_min), len(score) - 1), "cold start")
        best = max(score[k_min:])
        k = next(k for k in range(k_min, len(score)) if score[k] >= self.params.share * best)
        return Choice(k, f"frugal: {score[k] / best:.0%} of the best", score)

    def observe(self, class_id: str, outcome: RequestOutcome) -> None:
        self.heard[class_id] = self.heard.get(class_id, 0) + 1

    def forget(self, class_id: str) -> None:
        self.heard.pop(class_id, None)


SPEC = PolicySpec(FrugalParams, FrugalPolicy)
P = (0.9,) * 6
IDLE = LoadSnapshot()
QUIET = ControlOverrides(exploration_share=0.0)


@pytest.fixture
def frugal() -> Iterator[None]:
    """`frugal` in the registry for one test (the registry line of the README's diff)."""
    POLICIES["frugal"] = SPEC
    yield
    del POLICIES["frugal"]


def trained(share: float, n: int = 120) -> Controller:
    """A controller on `frugal`, its batch-1 step costs 1 + 0.1 k, after n requests at p = 0.9."""
    settings = ControllerSettings(policy="frugal", policy_params={"share": share})
    controller = Controller(settings, rng=random.Random(3))
    for _ in range(30):
        for k in range(6):
            controller.cost_model.observe_step(1, k, 0.01 * (1 + 0.1 * k))
    cls = controller.classify(RequestFeatures("chat"))
    rng = random.Random(4)
    for _ in range(n):
        decision = controller.decide(cls, IDLE, QUIET)
        controller.observe(cls, decision, simulate(rng, P, decision.k), IDLE)
    return controller


# E[tokens | k] at p = 0.9: 1, 1.9, 2.71, 3.44, 4.10, 4.69; over 1 + 0.1 k: 1, 1.73, 2.26,
# 2.65, 2.93, 3.13 (k = 5 the best), so a share s picks the first k at or above s * 3.13.
SHARES = [(1.0, 5), (0.9, 4), (0.8, 3), (0.5, 1), (0.25, 0)]


@pytest.mark.usefixtures("frugal")
@pytest.mark.parametrize(("share", "k"), SHARES, ids=[f"share {s}" for s, _ in SHARES])
def test_a_registered_policy_decides_through_the_controller(share: float, k: int) -> None:
    controller = trained(share)
    cls = controller.classify(RequestFeatures("chat"))
    decision = controller.decide(cls, IDLE, QUIET)
    assert decision.k == k, decision.reason
    policy = controller._policy
    assert isinstance(policy, FrugalPolicy)
    assert policy.params.min_samples == ControllerSettings().min_samples
    assert policy.heard == {cls.class_id: 120}  # its observe hook heard every request


@pytest.mark.usefixtures("frugal")
def test_an_evicted_class_is_forgotten_by_the_policy() -> None:
    now = [0.0]
    settings = ControllerSettings(policy="frugal", max_classes=1, class_idle_s=1.0)
    controller = Controller(settings, rng=random.Random(1), clock=lambda: now[0])
    first = controller.classify(RequestFeatures("chat"))
    decision = controller.decide(first, IDLE)
    controller.observe(first, decision, simulate(random.Random(2), P, decision.k), IDLE)
    policy = controller._policy
    assert isinstance(policy, FrugalPolicy)
    assert first.class_id in policy.heard
    now[0] = 5.0
    controller.classify(RequestFeatures("llama2"))  # evicts the idle `chat` class
    assert first.class_id not in policy.heard


@pytest.mark.usefixtures("frugal")
def test_a_policys_own_parameters_are_checked_with_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="share"):
        ControllerSettings(policy="frugal", policy_params={"share": 2.0})
    with pytest.raises(ValueError, match="depth"):
        ControllerSettings(policy="frugal", policy_params={"depth": 2})
    monkeypatch.setenv("SPECGW_CONTROL_POLICY", "frugal")
    monkeypatch.setenv("SPECGW_CONTROL_POLICY_PARAMS", '{"share": 0.5}')
    policy = Controller(ControllerSettings())._policy
    assert isinstance(policy, FrugalPolicy)
    assert policy.params.share == 0.5


def test_the_settings_name_the_registered_policies() -> None:
    assert "frugal" not in POLICIES
    with pytest.raises(ValueError, match="policy must be one of goodput"):
        ControllerSettings(policy="frugal")
    assert ControllerSettings().policy in POLICIES
