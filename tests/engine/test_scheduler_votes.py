"""The step-depth rule in the real vLLM schedulers, driven step by step without a model
(`tests/engine/test_scheduler.py`'s harness): voters run at the rule's depth, each at
most its own k; non-voters keep theirs; a depth-0 voter step still drafts once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.v1.request import Request

from engine.interface import SPEC_DEPTH_ARG
from engine.step_rule import (
    GUARD,
    RETIRE_AFTER,
    SPEC_COSTS_ARG,
    SPEC_NEWS_ARG,
    SPEC_VOTE_ARG,
    StepCostTable,
    StepVote,
    vote_step_depth,
)
from engine.vllm.batch_depth import BatchDepthPolicy
from engine.vllm.draft_skip import DRAFTER_IDLE
from engine.vllm.scheduler import AsyncSpecDepthScheduler, SpecDepthScheduler
from tests.engine.test_scheduler import K, _run_step, _scheduler
from tools.model.testing_models import TinyModels

#: Each draft adds 10 % of a step at every batch size; no first-token prices.
CHEAP = StepCostTable((1, 64), ((1.0, 1.1, 1.2, 1.3, 1.4),) * 2, ((), ()))
#: Each draft doubles the step: only a near-certain class gains from drafting.
DEAR = StepCostTable((1, 64), ((1.0, 2.0, 3.0, 4.0, 5.0),) * 2, ((), ()))
#: Each draft adds half a step.
MID = StepCostTable((1, 64), ((1.0, 1.5, 2.0, 2.5, 3.0),) * 2, ((), ()))
STRONG = StepVote((0.9, 0.85, 0.8, 0.75))
WEAK = StepVote((0.1, 0.1, 0.1, 0.1))


def _request(
    rid: str,
    k: int,
    vote: StepVote | None = None,
    costs: StepCostTable | None = None,
    max_tokens: int = 50,
) -> Request:
    extra: dict[str, Any] = {SPEC_DEPTH_ARG: k}
    if vote is not None:
        extra[SPEC_VOTE_ARG] = vote.to_arg()
    if costs is not None:
        extra[SPEC_COSTS_ARG] = costs.to_arg()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, extra_args=extra)
    return Request(rid, list(range(10, 30)), params, None)


def _drafts(sched: Any, steps: int) -> tuple[dict[str, list[int]], list[int]]:
    """Drafts each request verified per step, and the drafts asked for per step."""
    seen: dict[str, list[int]] = {rid: [] for rid in sched.requests}
    asked = []
    for _ in range(steps):
        out = sched.schedule()
        asked.append(out.num_spec_tokens_to_schedule)
        for rid in out.num_scheduled_tokens:
            seen[rid].append(len(out.scheduled_spec_decode_tokens.get(rid, [])))
        _run_step(sched, out)
    return seen, asked


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_voters_run_at_the_rules_depth_bounded_by_their_k(cls: type[Any], tiny: TinyModels) -> None:
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("strong", K, STRONG, CHEAP))
    sched.add_request(_request("bounded", 2, STRONG))
    want = vote_step_depth([STRONG, STRONG], CHEAP, 2, False, None, GUARD)
    assert want == K  # cheap drafts, a strong class: the deepest depth pays
    seen, asked = _drafts(sched, 5)
    assert asked[2:] == [K] * 3
    assert seen["strong"][2:] == [K] * 3
    assert seen["bounded"][2:] == [2] * 3  # its k bounds it (per-request rule on the CPU)


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_voters_keep_to_their_classs_anchor_within_the_margin(
    cls: type[Any], tiny: TinyModels
) -> None:
    """Depths 3 and 4 within 0.2 % for the strong class: the rule's argmax is 4, but the
    vote's anchor (its class chose 3) holds the step at 3 through the wire."""
    near = StepCostTable((1, 64), ((1.0, 1.1, 1.2, 1.3, 1.48),) * 2, ((), ()))
    anchored = replace(STRONG, anchor=3)
    assert vote_step_depth([STRONG, STRONG], near, 2, False, None, GUARD) == K
    assert vote_step_depth([anchored, anchored], near, 2, False, None, GUARD) == 3
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("a", K, anchored, near))
    sched.add_request(_request("b", K, anchored))
    seen, asked = _drafts(sched, 5)
    assert asked[2:] == [3] * 3
    assert seen["a"][2:] == [3] * 3
    assert seen["b"][2:] == [3] * 3


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_class_that_loses_by_drafting_holds_its_voters_at_zero(
    cls: type[Any], tiny: TinyModels
) -> None:
    """The guard: drafts twice the step's price and a 10 % class: every d > 0 loses.
    The step still drafts one token (so the drafter's KV stays whole), verified by none;
    a non-voter beside them keeps its own k."""
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("weak", K, WEAK, DEAR))
    sched.add_request(_request("weak2", 3, WEAK))
    assert vote_step_depth([WEAK, WEAK], DEAR, 2, False, None, GUARD) == 0
    seen, asked = _drafts(sched, 4)
    assert asked[1:] == [1] * 3
    assert seen["weak"] == [0] * 4
    assert seen["weak2"] == [0] * 4
    assert sched.specgw_voted_steps.get(0, 0) >= 3
    sched.add_request(_request("plain", 3))
    seen, asked = _drafts(sched, 4)
    assert asked[1:] == [3] * 3  # the non-voter's k sets the drafting depth
    assert seen["plain"][2:] == [3] * 2
    assert seen["weak"] == [0] * 4  # per-request rule: voters verify none


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_requests_at_zero_beside_a_voter_weigh_in_the_steps_depth(
    cls: type[Any], tiny: TinyModels
) -> None:
    """A strong voter alone drafts 2 where each draft costs half a step; beside three
    requests at k = 0, which would pay that step's time for nothing, the rule holds the
    step at 0 (where depth 0 skips the drafter the step drafts one, verified by none)."""
    alone = vote_step_depth([STRONG], MID, 1, False, None, GUARD)
    assert alone == 2
    assert vote_step_depth([STRONG], MID, 4, False, None, GUARD, None, 3) == 0
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("strong", K, STRONG, MID))
    for i in range(3):
        sched.add_request(_request(f"zero{i}", 0))
    seen, _ = _drafts(sched, 4)
    assert seen["strong"][1:] == [0] * 3
    assert all(seen[f"zero{i}"] == [0] * 4 for i in range(3))
    assert sched.specgw_voted_steps.get(0, 0) >= 3


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_without_costs_a_voter_runs_at_its_k_and_a_bad_table_is_not_kept(
    cls: type[Any], tiny: TinyModels
) -> None:
    sched = _scheduler(cls, tiny)
    broken = _request("a", 2, STRONG)
    assert broken.sampling_params is not None
    assert broken.sampling_params.extra_args is not None
    broken.sampling_params.extra_args[SPEC_COSTS_ARG] = {"buckets": [1], "decode": [[0.0, 1.0]]}
    sched.add_request(broken)
    assert sched.specgw_costs is None
    seen, _ = _drafts(sched, 4)
    assert seen["a"][2:] == [2, 2]
    assert sched.specgw_voted_steps == {}


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_malformed_vote_leaves_the_request_its_own_k(cls: type[Any], tiny: TinyModels) -> None:
    sched = _scheduler(cls, tiny)
    request = _request("odd", 2, None, DEAR)
    assert request.sampling_params is not None
    assert request.sampling_params.extra_args is not None
    request.sampling_params.extra_args[SPEC_VOTE_ARG] = {"p": ["x"], "probe": 0}
    sched.add_request(request)
    seen, _ = _drafts(sched, 4)
    assert seen["odd"][2:] == [2, 2]  # DEAR would have held a voter at 0


def test_under_the_uniform_rule_only_captured_depths_are_chosen(tiny: TinyModels) -> None:
    """With FULL graphs for 1 + 1 and 1 + K only, a rule that would pick 2 or 3 picks a
    captured depth, and every voter verifies it."""
    sched = _scheduler(SpecDepthScheduler, tiny)
    sched.specgw_depth_rule = replace(
        sched.specgw_depth_rule, policy=BatchDepthPolicy.UNIFORM, captured=(1, K)
    )
    # Drafts dear past 2: the free rule picks 2 for a strong class.
    table = StepCostTable((1, 64), ((1.0, 1.05, 1.1, 2.0, 3.0),) * 2, ((), ()))
    assert vote_step_depth([STRONG], table, 1, False, None, GUARD) == 2
    chosen = vote_step_depth([STRONG], table, 1, False, (1, K), GUARD)
    assert chosen in (1, K)
    sched.add_request(_request("a", K, STRONG, table))
    seen, asked = _drafts(sched, 4)
    assert asked[1:] == [chosen] * 3
    assert seen["a"][2:] == [chosen] * 2


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_newcomer_brings_newer_estimates_for_the_voters_in_flight(
    cls: type[Any], tiny: TinyModels
) -> None:
    """A voter is read at its class's newest estimates: a newcomer of another class that
    brings the first class's drop (`StepArgs.news`) moves the step with it."""
    sched = _scheduler(cls, tiny)
    chat = StepVote(STRONG.acceptance, class_id="chat")
    sched.add_request(_request("chat", K, chat, CHEAP))
    seen, _ = _drafts(sched, 3)
    assert seen["chat"][2:] == [K]
    code = StepVote(STRONG.acceptance, class_id="code")
    newcomer = _request("code", K, code)
    assert newcomer.sampling_params is not None
    assert newcomer.sampling_params.extra_args is not None
    newcomer.sampling_params.extra_args[SPEC_NEWS_ARG] = {"chat": list(WEAK.acceptance)}
    sched.add_request(newcomer)
    seen, _ = _drafts(sched, 4)
    weak_chat = StepVote(WEAK.acceptance, class_id="chat")
    want = vote_step_depth([weak_chat, code], CHEAP, 2, False, None, GUARD)
    assert want < K
    assert seen["chat"][2:] == [want, want]
    assert seen["code"][2:] == [want, want]


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_where_the_drafter_runs_at_depth_zero_anyway_a_zero_step_drafts_nothing(
    cls: type[Any], tiny: TinyModels
) -> None:
    """Model Runner V2 runs its drafter's KV pass in a step with voters: no draft is
    asked for."""
    sched = _scheduler(cls, tiny)
    sched.specgw_depth_rule = replace(sched.specgw_depth_rule, zero_skips_drafter=False)
    sched.add_request(_request("weak", K, WEAK, DEAR))
    seen, asked = _drafts(sched, 4)
    assert asked[1:] == [0] * 3
    assert seen["weak"] == [0] * 4


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_voter_held_at_zero_long_enough_runs_at_zero_and_frees_the_drafter(
    cls: type[Any], tiny: TinyModels
) -> None:
    """A strong voter beside three requests at k = 0 is held at depth 0 (each draft costs
    half a step); held `RETIRE_AFTER` steps, it runs at k = 0 from that step on, so no
    request of the step drafts now or later and the drafter is idle (`DRAFTER_IDLE`, no
    draft asked for), where before every held step kept it for the voter."""
    sched = _scheduler(cls, tiny)
    long = RETIRE_AFTER + 20
    sched.add_request(_request("strong", K, STRONG, MID, max_tokens=long))
    for i in range(3):
        sched.add_request(_request(f"zero{i}", 0, max_tokens=long))
    idle, asked = [], []
    for _ in range(RETIRE_AFTER + 3):
        out = sched.schedule()
        idle.append(getattr(out, DRAFTER_IDLE))
        asked.append(out.num_spec_tokens_to_schedule)
        _run_step(sched, out)
    assert idle == [False] * (RETIRE_AFTER - 1) + [True] * 4
    assert sched.specgw_retired == 1
    assert sched._depth(sched.requests["strong"]) == 0
    assert asked[-4:] == [0] * 4
    assert all(n == 1 for n in asked[1 : RETIRE_AFTER - 1])  # held: draft once, verify none


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_rider_verifies_the_voters_depth_and_none_without_them(
    cls: type[Any], tiny: TinyModels
) -> None:
    """A rider (its class's own depth is 0) beside a strong voter verifies the voter's
    depth; it keeps the drafter while its prompt prefills, and once a step without voters
    skips the drafter it runs at k = 0 for good (its drafter KV has a gap)."""
    rider = StepVote(WEAK.acceptance, class_id="tools", rides=True)
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("strong", K, STRONG, CHEAP, max_tokens=12))
    sched.add_request(_request("rider", K, rider, max_tokens=60))
    seen, asked = _drafts(sched, 4)
    assert asked[2:] == [K] * 2
    assert seen["rider"][2:] == [K] * 2  # cheap drafts: the voter's depth, verified
    assert sched.specgw_riders_dropped == 0
    while "strong" in sched.requests and not sched.requests["strong"].is_finished():
        _drafts(sched, 1)
    seen, asked = _drafts(sched, 3)
    # The first step after the voter verifies the drafts made in the voter's last step.
    assert seen["rider"][1:] == [0] * 2
    assert asked == [0] * 3
    assert sched.specgw_riders_dropped == 1
    assert sched._depth(sched.requests["rider"]) == 0


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_riders_alone_keep_no_drafter_and_run_at_zero_from_then_on(
    cls: type[Any], tiny: TinyModels
) -> None:
    """Riders alone: no step of theirs runs the drafter (`DRAFTER_IDLE`, no draft asked
    for, not even one where depth 0 skips the drafter), so their drafter KV has a gap
    from their first step and they run at k = 0 for good."""
    rider = StepVote(STRONG.acceptance, class_id="tools", rides=True)
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("r1", K, rider, CHEAP))
    sched.add_request(_request("r2", K, rider))
    idle, asked = [], []
    for _ in range(3):
        out = sched.schedule()
        idle.append(getattr(out, DRAFTER_IDLE))
        asked.append(out.num_spec_tokens_to_schedule)
        for rid in out.num_scheduled_tokens:
            assert not out.scheduled_spec_decode_tokens.get(rid)
        _run_step(sched, out)
    assert idle == [True] * 3
    assert asked == [0] * 3
    assert sched.specgw_riders_dropped == 2
    assert [sched._depth(sched.requests[r]) for r in ("r1", "r2")] == [0, 0]
