"""The goodput policy's queue cost: with requests waiting for admission, a request's extra
step time is charged for their wait (`policies/goodput.py`, `GoodputPolicy.under_queue`)."""

from __future__ import annotations

import random

import pytest

from gateway.control.controller import Controller
from gateway.control.cost_model import CostModel
from gateway.control.decision import ControlOverrides, LoadSnapshot
from gateway.control.depth_profile import DepthProfile
from gateway.control.estimator import AcceptanceEstimator, EstimatorParams
from gateway.control.features import RequestFeatures
from gateway.control.policies import GoodputPolicy, PolicyInput, Situation
from gateway.control.policies.goodput import goodput_of, queue_charged
from gateway.control.settings import ControllerSettings
from tests.control.simulator import simulate

#: Every draft costs 30 % of a step at k = 0: a class at 0.8 acceptance gains by drafting
#: (E / c at k = 2: 2.44 / 1.6 = 1.53) but pays 0.6 step-seconds per step at k = 2.
COST = tuple(1.0 + 0.3 * k for k in range(6))
GOOD = DepthProfile((0.8,) * 5, (100.0,) * 5)


def _input(current: int = 2) -> PolicyInput:
    return PolicyInput(GOOD, 100.0, current, 0, 5, 100, COST, (), 100.0)


def test_no_queue_no_weight_leaves_goodput_as_it_is() -> None:
    inp = _input()
    assert queue_charged(inp, 5, 0.0) == pytest.approx(goodput_of(inp, 5))


@pytest.mark.parametrize("per_request", [0.5, 1.0, 4.0])
def test_the_charge_falls_with_depth_and_leaves_k0_alone(per_request: float) -> None:
    inp = _input()
    plain, charged = goodput_of(inp, 5), queue_charged(inp, 5, per_request)
    assert charged[0] == pytest.approx(plain[0])
    shares = [c / p for c, p in zip(charged[1:], plain[1:], strict=True)]
    assert all(s < 1.0 for s in shares)
    assert shares == sorted(shares, reverse=True)  # deeper drafts cost the queue more


def _situation(k: int) -> Situation:
    settings = ControllerSettings()
    params = EstimatorParams(5, settings.ewma_alpha, settings.window, settings.prior_strength, 0.0)
    estimator = AcceptanceEstimator(params, (0.8,) * 5)
    cost = CostModel(5, 0.02, 0.3, 1e9, 1000.0, 0.01)
    return Situation("c", estimator, cost, 1, k, 0, 5, 100)


@pytest.mark.parametrize(
    ("weight", "queued", "lowered"), [(0.0, 64, False), (1.0, 0, False), (2.0, 64, True)]
)
def test_under_queue_lowers_k_only_with_a_weight_and_a_queue(
    weight: float, queued: int, lowered: bool
) -> None:
    policy = GoodputPolicy(min_samples=1, hysteresis=0.03, min_dwell=0, queue_weight=weight)
    k = policy.under_queue(_situation(3), 3, queued, 4)
    assert (k < 3) is lowered


def _trained(queue_weight: float) -> Controller:
    settings = ControllerSettings(policy_params={"queue_weight": queue_weight})
    controller = Controller(settings, rng=random.Random(1))
    cls = controller.classify(RequestFeatures("chat"))
    rng = random.Random(2)
    load = LoadSnapshot(running=3)
    for k in range(6):  # each draft adds 30 % of a step at batch 4
        for _ in range(3):
            controller.cost_model.observe(k, load.batch, 0.02 * (1 + 0.3 * k), depth=k)
    for _ in range(120):
        decision = controller.decide(cls, load)
        controller.observe(cls, decision, simulate(rng, (0.8,) * 6, decision.k), load)
    return controller


def test_the_controller_lowers_a_request_under_a_queue_and_not_without() -> None:
    off = ControlOverrides(exploration_share=0.0)
    charged, plain = _trained(4.0), _trained(0.0)
    cls = charged.classify(RequestFeatures("chat"))
    idle, queued = LoadSnapshot(running=3), LoadSnapshot(running=3, queued=64)
    k = charged.decide(cls, idle, off).k
    assert k > 0
    assert plain.decide(cls, queued, off).k == k  # weight 0: the queue changes nothing
    lowered = charged.decide(cls, queued, off)
    assert lowered.k < k
    assert lowered.reason == "queue: 64 waiting"
