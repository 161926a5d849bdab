"""The verify budget in the synchronous scheduler, driven step by step without a model (as
`test_scheduler` does): the drafter's log-odds are set where the engine core would read
them from the worker; the rule trims each request's drafts after its k, per class."""

from __future__ import annotations

from typing import Any

import pytest
from vllm import SamplingParams
from vllm.v1.request import Request

from engine.interface import SPEC_CLASS_ARG, SPEC_DEPTH_ARG
from engine.vllm.confidence_budget import (
    PRIOR_MS,
    REFIT_STEPS,
    VERIFY_BUDGET_KEY,
    ConfidenceBudget,
    Draft,
    StepCosts,
)
from engine.vllm.scheduler import SpecDepthScheduler
from tests.engine.test_scheduler import K, _run_step, _scheduler
from tools.model.testing_models import TinyModels

CONFIDENT = 12.0  # log-odds of a draft the drafter is sure of
DOUBTFUL = -6.0


def _budget_scheduler(tiny: TinyModels, mode: str) -> Any:
    sched = _scheduler(SpecDepthScheduler, tiny)
    sched.vllm_config.additional_config = {VERIFY_BUDGET_KEY: mode}
    sched.specgw_verify_budget = sched._verify_budget()
    return sched


def _request(rid: str, k: int, class_id: str) -> Request:
    extra = {SPEC_DEPTH_ARG: k, SPEC_CLASS_ARG: class_id}
    params = SamplingParams(max_tokens=50, temperature=0.0, extra_args=extra)
    return Request(rid, list(range(10, 30)), params, None)


def _steps(sched: Any, features: dict[str, float], steps: int) -> list[dict[str, int]]:
    """Run `steps` steps, each request's drafts at `features[rid]` log-odds; the drafts
    each step verifies per request."""
    verified = []
    for _ in range(steps):
        out = sched.schedule()
        verified.append({r: len(t) for r, t in out.scheduled_spec_decode_tokens.items()})
        sched.specgw_verify_budget.confidences = {rid: [f] * K for rid, f in features.items()}
        _run_step(sched, out, accept_all=False)
    return verified


def test_doubtful_drafts_are_not_verified_and_confident_ones_are(tiny: TinyModels) -> None:
    sched = _budget_scheduler(tiny, "on")
    sched.add_request(_request("sure", K, "code"))
    sched.add_request(_request("unsure", K, "tools"))
    sched.add_request(_request("off", 0, "tools"))
    verified = _steps(sched, {"sure": CONFIDENT, "unsure": DOUBTFUL, "off": CONFIDENT}, 6)
    later = verified[2:]
    assert all(v.get("sure") == K for v in later)
    assert all(v.get("unsure", 0) == 0 for v in later)
    assert all(v.get("off", 0) == 0 for v in later)  # its class bound: verify nothing
    budget = sched.specgw_verify_budget
    assert budget.admitted < budget.offered
    # One estimator per class, each fed with what the target accepted (nothing, here).
    assert budget.estimators.count == 2
    assert budget.observed.get("code", 0) > 0


def test_vllm_av_pools_every_class_in_one_estimator(tiny: TinyModels) -> None:
    sched = _budget_scheduler(tiny, "vllm-av")
    sched.add_request(_request("a", K, "code"))
    sched.add_request(_request("b", K, "tools"))
    _steps(sched, {"a": CONFIDENT, "b": CONFIDENT}, 4)
    assert sched.specgw_verify_budget.estimators.count == 1


def test_off_builds_no_budget(tiny: TinyModels) -> None:
    assert _budget_scheduler(tiny, "off").specgw_verify_budget is None


def test_drafts_without_confidences_are_verified_as_offered() -> None:
    budget = ConfidenceBudget(positions=4, max_requests=8, max_tokens=64)
    assert budget.trim([Draft("x", "c", 3), Draft("y", "c", 0)], running=2) == [3, 0]
    assert budget.estimators.count == 0


@pytest.mark.parametrize("truth", [(5.0, 1.0, 0.3), (2.0, 0.2, 0.05)])
def test_step_costs_recover_the_drafter_and_target_parts(
    truth: tuple[float, float, float],
) -> None:
    a, b, c = truth
    costs = StepCosts(max_requests=16, max_tokens=128)
    assert costs.coefficients == PRIOR_MS
    for i in range(40 * REFIT_STEPS):
        n = 1 + i % 8
        t = n * (1 + (i // 8) % 5)  # 0..4 drafts each: tokens vary apart from requests
        costs.observe(n, t, a + b * n + c * t)
    fit = costs.coefficients
    # The ridge keeps the intercept a little toward the prior; the parts are what matter.
    assert fit[0] == pytest.approx(a, abs=0.3)
    assert fit[1:] == pytest.approx((b, c), rel=0.05, abs=0.02)
    assert costs.curves.step_ms(4, 12) == pytest.approx(a + 4 * b + 12 * c, rel=0.02)
