"""Class bounds and per-class calibration under vLLM 0.33's adaptive verification
(`engine.vllm.class_verification`), on 0.33's own classes without a GPU.

The runner, its speculator and its adaptive-verification manager are 0.33's classes made
with `object.__new__` and given the attributes their constructors set, on CPU tensors; the
acceptance estimator is 0.33's, built by its own constructor. 0.33's budget
(`get_num_tokens`), host-side compaction (`compact_batch`) and allocation
(`reallocate_drafts`, with the uncompiled `_assign_draft_token_budget`) run as shipped.
Stood in: the runner's `add_requests` (it would build every per-request state) and the
copy to the host in `record_confidences` (a CUDA stream and events), each by a function of
the same signature doing only what the hook relies on; and the request-state table (its
tensors pin host memory)."""

from __future__ import annotations

import functools
import inspect
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
from vllm.v1.worker.gpu.spec_decode import acceptance_estimator as vllm_estimator
from vllm.v1.worker.gpu.spec_decode import adaptive_verification as vllm_av
from vllm.v1.worker.gpu.spec_decode import speculator as vllm_speculator
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

from engine.acceptance_estimator import ClassEstimators
from engine.interface import SPEC_CLASS_ARG, SPEC_DEPTH_ARG
from engine.verify_budget import assign_budget, cost_tables, step_budget
from engine.vllm.class_estimators import ClassAcceptanceEstimators, ClassGroups
from engine.vllm.class_verification import (
    HOOKS,
    ClassVerificationExtension,
    runner_supports_class_verification,
    serve_class_verification,
)
from engine.vllm.compat import hook_problem
from engine.vllm.confidence_budget import VERIFY_BUDGET_KEY

K = 4
SLOTS = 8
#: (size, ms): a drafter nearly free and a target flat to 64 tokens: every draft pays.
CHEAP = ([(1, 0.01), (SLOTS, 0.02)], [(1, 1.0), (64, 1.0)])
#: A target at 1 ms plus 0.3 ms a token (profiled at every size: 0.33 prices a size at
#: the next profiled one): only the likeliest drafts pay.
STEEP = ([(1, 0.01), (SLOTS, 0.02)], [(t, 1.0 + 0.3 * t) for t in range(1, 65)])


#: Steps per refit in the run against 0.33's interpreted kernels.
ROUND = 25


class _Worker(ClassVerificationExtension):
    def __init__(self, runner: Any) -> None:
        self.model_runner = runner


def _manager(req_states: Any, curves: tuple[Any, Any]) -> Any:
    """0.33's manager with the attributes its `__init__` sets, on CPU tensors."""
    manager: Any = object.__new__(vllm_av.AdaptiveVerificationManager)
    query_start_loc = torch.zeros(SLOTS + 1, dtype=torch.int32)
    manager.req_states = req_states
    manager.num_speculative_steps = K
    manager.num_bonus_tokens = 1
    manager._max_total_logits = 4096
    manager.query_start_loc = query_start_loc
    manager._cudagraph_limit = 0
    manager._batch_budget = None
    manager._confidence_probs = torch.ones(SLOTS, K)
    manager._batch_draft_capacity = torch.zeros(SLOTS, dtype=torch.int32)
    manager._num_non_draft_tokens = torch.empty_like(query_start_loc[:-1])
    manager._cu_num_logits = torch.empty_like(query_start_loc)
    manager._copy_admitted_drafts_to_host = False
    manager._stale_confidences = [SimpleNamespace(np=np.ones((SLOTS, K))) for _ in range(2)]
    manager._stale_idx = 0
    manager.cost_tables = vllm_av.build_cost_tables_from_curves(*curves, SLOTS, 64)

    @functools.wraps(vllm_av.AdaptiveVerificationManager.record_confidences.__get__(manager))
    def record_confidences(confidence_probs: torch.Tensor, input_batch: Any) -> None:
        # What it publishes, its copy to the host already landed (as the next step reads it).
        n = input_batch.num_reqs
        manager._confidence_probs[input_batch.idx_mapping] = confidence_probs[:n]
        manager._stale_confidences[manager._stale_idx].np[:] = manager._confidence_probs.numpy()

    manager.record_confidences = record_confidences
    return manager


def _runner(curves: tuple[Any, Any] = CHEAP) -> Any:
    req_states = SimpleNamespace(
        req_id_to_index={},
        free_indices=list(range(SLOTS)),
        num_speculative_steps=K,
        max_num_reqs=SLOTS,
        max_num_batched_tokens=64,
        num_computed_tokens_np=np.zeros(SLOTS, dtype=np.int32),
        prefill_len=SimpleNamespace(np=np.zeros(SLOTS, dtype=np.int32)),
    )
    speculator: Any = object.__new__(EagleSpeculator)
    speculator.acceptance_estimator = vllm_estimator.OnlineAcceptanceEstimator(
        SLOTS, K, torch.device("cpu")
    )
    speculator.draft_token_confidence_probs = torch.empty(SLOTS, K)
    runner: Any = object.__new__(RunnerV2)

    @functools.wraps(RunnerV2.add_requests.__get__(runner))
    def add_requests(scheduler_output: Any) -> None:
        for new in scheduler_output.scheduled_new_reqs:  # as `RequestState.add_request`
            req_states.req_id_to_index[new.req_id] = req_states.free_indices.pop()

    runner.add_requests = add_requests
    runner.req_states = req_states
    runner.speculator = speculator
    runner.adaptive_verification = _manager(req_states, curves)
    runner.vllm_config = SimpleNamespace(additional_config={VERIFY_BUDGET_KEY: "on"})
    return runner


def _add(runner: Any, **requests: tuple[int | None, str | None]) -> dict[str, int]:
    """Admit requests `rid=(k, class)`; their slots."""
    new = []
    for rid, (k, cls) in requests.items():
        extra = {key: v for key, v in ((SPEC_DEPTH_ARG, k), (SPEC_CLASS_ARG, cls)) if v is not None}
        new.append(SimpleNamespace(req_id=rid, sampling_params=SamplingParams(extra_args=extra)))
    runner.add_requests(SimpleNamespace(scheduled_new_reqs=new))
    return {rid: runner.req_states.req_id_to_index[rid] for rid in requests}


def _admitted(runner: Any, rids: list[str], drafts: int = K) -> tuple[list[int], int]:
    """One step of 0.33's budget and allocation, each request with `drafts` placeholders
    (the uniform rule's step depth): (admitted drafts per request, the step's budget)."""
    manager = runner.adaptive_verification
    slots = runner.req_states.req_id_to_index
    tokens = manager.get_num_tokens({r: 1 + drafts for r in rids}, {r: [-1] * drafts for r in rids})
    # `prepare_inputs` then compacts the host-side batch from the scheduled counts: its total
    # is the step's token count (per request it is an even split, as 0.33 leaves it).
    scheduled = np.full(len(rids), drafts, dtype=np.int32)
    cu = np.arange(len(rids) + 1, dtype=np.int32) * (1 + drafts)
    compacted, _ = manager.compact_batch(scheduled, scheduled + 1, cu)
    assert int(compacted.sum()) == tokens
    idx = torch.tensor([slots[r] for r in rids], dtype=torch.int64)
    _, _, budget, _ = manager.reallocate_drafts(rids, idx)
    assert tokens == len(rids) + budget
    return manager._batch_draft_capacity[: len(rids)].tolist(), budget


@pytest.fixture(autouse=True)
def _uncompiled_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.33's allocation without `torch.compile` (same function; inductor is for GPUs here)."""
    monkeypatch.setattr(
        vllm_av, "_assign_draft_token_budget_compiled", vllm_av._assign_draft_token_budget
    )


def test_every_hook_fits_vllm_033_and_runs_in_the_order_the_hook_needs() -> None:
    """The wrapped methods exist with these parameters, and `sample_tokens` grades the last
    drafts, then proposes (the drafter's graph predicts), then records the confidences."""
    assert [hook_problem(hook) for hook in HOOKS] == [None] * len(HOOKS)
    sample = inspect.getsource(RunnerV2.sample_tokens)
    grade = sample.index("self.speculator.observe_verification(")
    propose = sample.index("self.speculator.propose(")
    record = sample.index("self.adaptive_verification.record_confidences(")
    assert grade < propose < record
    # The feature the re-prediction reads is stored per request slot by the graph's kernel.
    kernels = inspect.getsource(vllm_estimator)
    assert "tl.store(features_ptr + req_state_idx * features_stride + step, feature)" in kernels
    # EAGLE's speculator predicts in `sample_draft` and grades in `observe_verification`,
    # which `sample_tokens` calls for a `DraftModelSpeculator` only.
    assert issubclass(EagleSpeculator, vllm_speculator.DraftModelSpeculator)
    base = inspect.getsource(vllm_speculator.DraftModelSpeculator)
    assert "self.acceptance_estimator.predict(" in base
    assert "self.acceptance_estimator.step(idx_mapping, num_sampled, num_rejected)" in base


def test_the_hook_installs_on_the_real_runners_attribute_names() -> None:
    runner = _runner()
    assert runner_supports_class_verification(runner)
    worker = _Worker(runner)
    assert worker.specgw_install_class_verification() is True
    assert worker.specgw_install_class_verification() is False  # once per runner
    manager, estimator = runner.adaptive_verification, runner.speculator.acceptance_estimator
    for owner, name in (
        (runner, "add_requests"),
        (manager, "get_num_tokens"),
        (manager, "record_confidences"),
        (estimator, "step"),
    ):
        assert name in vars(owner), name  # wrapped on the instance
        assert callable(getattr(type(owner), name))  # over the class's own method
    report = worker.specgw_class_verification()
    slope, intercepts = report["classes"][""]
    assert slope == pytest.approx(vllm_estimator._INIT_SLOPE)
    assert intercepts == pytest.approx([vllm_estimator._INIT_BIAS] * K)


def test_no_install_without_adaptive_verification_or_its_estimator() -> None:
    runner = _runner()
    runner.adaptive_verification = None
    assert _Worker(runner).specgw_install_class_verification() is False
    runner = _runner()
    runner.speculator.acceptance_estimator = None  # a confidence head (DSpark)
    assert _Worker(runner).specgw_install_class_verification() is False
    assert _Worker(_runner()).specgw_class_verification() == {}


def test_a_bound_of_zero_admits_none_of_its_drafts_beside_a_drafting_batch_mate() -> None:
    runner = _runner(CHEAP)
    assert _Worker(runner).specgw_install_class_verification() is True
    _add(runner, tool=(0, "tool"), chat=(None, "chat"), code=(2, "code"))
    admitted, budget = _admitted(runner, ["tool", "chat", "code"])
    assert admitted == [0, K, 2]  # every draft pays on the cheap target: each at its bound
    assert budget == K + 2
    assert _Worker(runner).specgw_class_verification()["bounded_steps"] == 1


def test_a_bound_of_two_admits_at_most_two_where_the_budget_binds() -> None:
    runner = _runner(STEEP)
    assert _Worker(runner).specgw_install_class_verification() is True
    slots = _add(runner, a=(2, "x"), b=(K, "y"))
    stale = runner.adaptive_verification._stale_confidences[0].np
    live = runner.adaptive_verification._confidence_probs
    for rid, row in (("a", [0.99] * K), ("b", [0.9, 0.5, 0.2, 0.1])):  # a's the likeliest
        stale[slots[rid]] = row
        live[slots[rid]] = torch.tensor(row)
    admitted, budget = _admitted(runner, ["a", "b"])
    # Survivals a .99 .98 (its bound), b .9 .45 .09: tokens per ms peak at three drafts.
    assert (admitted, budget) == ([2, 1], 3)


def test_the_budget_is_engine_verify_budgets_rule_on_the_same_inputs() -> None:
    """0.33's budget and allocation, with the class bounds applied, give what the pure-Python
    rule the CPU engine and the twin run gives (`engine.verify_budget`)."""
    rng = random.Random(7)
    draft_curve, verify_curve = [(1, 0.3), (4, 0.5), (SLOTS, 0.9)], [(1, 5.0), (16, 6.0), (64, 9.5)]
    tables = cost_tables(draft_curve, verify_curve, SLOTS, 64)
    vllm_tables = vllm_av.build_cost_tables_from_curves(draft_curve, verify_curve, SLOTS, 64)
    assert list(tables.draft_ms) == pytest.approx(vllm_tables[0].tolist())
    assert list(tables.verify_ms) == pytest.approx(vllm_tables[1].tolist())
    for _ in range(30):
        runner = _runner((draft_curve, verify_curve))
        assert _Worker(runner).specgw_install_class_verification() is True
        rids = [f"r{i}" for i in range(rng.randint(1, SLOTS))]
        bounds = {r: rng.randint(0, K) for r in rids}
        slots = _add(runner, **{r: (bounds[r], f"c{i % 3}") for i, r in enumerate(rids)})
        manager = runner.adaptive_verification
        confidences = [[rng.uniform(0.05, 0.99) for _ in range(K)] for _ in rids]
        for r, row in zip(rids, confidences, strict=True):
            manager._stale_confidences[0].np[slots[r]] = row
            manager._confidence_probs[slots[r]] = torch.tensor(row)
        admitted, budget = _admitted(runner, rids)
        caps = [bounds[r] for r in rids]
        assert budget == step_budget(confidences, caps, tables, len(rids), len(rids))
        assert admitted == assign_budget(confidences, caps, budget)


def _graded_steps(runner: Any, slots: dict[str, int], classes: dict[str, str], steps: int) -> Any:
    """`steps` engine steps in the order `sample_tokens` runs them: the last drafts graded
    (`step`), new ones drafted (the graph's kernel stores each feature per slot), the
    confidences recorded. Class `tool` accepts its drafts far more often than `chat`. The
    same outcomes feed the pure-Python rule per class and pooled; both are returned."""
    rng = random.Random(3)
    estimator = runner.speculator.acceptance_estimator
    manager = runner.adaptive_verification
    probs = runner.speculator.draft_token_confidence_probs
    rids = list(slots)
    idx = torch.tensor([slots[r] for r in rids], dtype=torch.int64)
    batch = SimpleNamespace(num_reqs=len(rids), idx_mapping=idx)
    per_class, pooled = ClassEstimators(K, pooled=False), ClassEstimators(K, pooled=True)
    for _ in range(steps):
        sampled, rejected = [], []
        for r in rids:
            f = estimator.features[slots[r]].tolist()
            p = estimator.predictions[slots[r]].tolist()
            accepted = 0
            while accepted < K and rng.random() < (0.85 if classes[r] == "tool" else 0.25):
                accepted += 1
            sampled.append(accepted + 1)
            rejected.append(min(1, K - accepted))
            admitted = accepted + rejected[-1]
            per_class.of(classes[r]).observe(f, p, accepted, admitted)
            pooled.of(classes[r]).observe(f, pooled.of(classes[r]).predict(f), accepted, admitted)
        estimator.step(idx, torch.tensor(sampled), torch.tensor(rejected))
        per_class.end_step()
        pooled.end_step()
        features = torch.tensor([[rng.uniform(-1.0, 5.0) for _ in range(K)] for _ in rids])
        estimator.features[idx] = features
        manager.record_confidences(probs, batch)
    return per_class, pooled


def test_each_class_fits_its_own_estimator_where_the_pooled_one_gives_one() -> None:
    runner = _runner()
    worker = _Worker(runner)
    assert worker.specgw_install_class_verification() is True
    classes = {"t1": "tool", "t2": "tool", "c1": "chat", "c2": "chat"}
    slots = _add(runner, **{r: (K, c) for r, c in classes.items()})
    per_class, pooled = _graded_steps(runner, slots, classes, steps=1000)
    report = worker.specgw_class_verification()
    assert report["refits"] == 10
    tool, chat = report["classes"]["tool"], report["classes"]["chat"]
    for name, (slope, intercepts) in (("tool", tool), ("chat", chat)):
        reference = per_class.of(name)  # the same fit in pure Python, class by class
        assert slope == pytest.approx(reference.slope, abs=1e-4)
        assert intercepts == pytest.approx(reference.intercepts, abs=1e-4)
    # The same feature reads differently by class; pooled, both classes read one value.
    estimator = runner.speculator.acceptance_estimator
    idx = torch.tensor([slots["t1"], slots["c1"]])
    estimator.features[idx] = 2.0
    runner.adaptive_verification.record_confidences(
        runner.speculator.draft_token_confidence_probs, SimpleNamespace(num_reqs=2, idx_mapping=idx)
    )
    published = runner.adaptive_verification._confidence_probs
    assert (published[slots["t1"]] - published[slots["c1"]] > 0.2).all()
    assert estimator.predictions[slots["t1"]].tolist() == published[slots["t1"]].tolist()
    assert pooled.count == 1  # vLLM as shipped: one fit, so one value between the two
    one = pooled.of("tool").predict([2.0] * K)
    for j in range(K):
        assert float(published[slots["c1"], j]) < one[j] < float(published[slots["t1"], j])


def test_each_class_fit_is_vllms_own_estimator_fed_that_class_alone(tmp_path: Path) -> None:
    """The per-class fit against vLLM 0.33's own kernels (Triton's interpreter, its own
    process: `tests/cuda/vllm_estimator_run.py`): each class's coefficients are those of
    0.33's estimator fed only that class's rows; 0.33's pooled one, fed both, fits neither.
    Rounds of `ROUND` steps, not 0.33's 100, for the interpreter's sake: the same arithmetic."""
    gen = torch.Generator().manual_seed(11)
    classes = torch.tensor([1, 1, 1, 2, 2, 2])
    slots = torch.tensor([5, 1, 6, 0, 3, 7])
    rate = torch.where(classes == 1, 0.85, 0.25).unsqueeze(1)
    pooled_run: list[Any] = []
    by_class: dict[int, list[Any]] = {1: [], 2: []}
    for _ in range(3 * ROUND):
        features = torch.rand(6, K, generator=gen) * 8 - 2
        accepted = (torch.rand(6, K, generator=gen) < rate).long().cumprod(1).sum(1)
        step = (slots, features, accepted + 1, (accepted < K).long())
        pooled_run.append(step)
        for g, run in by_class.items():
            rows = classes == g
            run.append(tuple(x[rows] for x in step))
    path = tmp_path / "runs.pt"
    runs = [by_class[1], by_class[2], pooled_run]
    torch.save({"slots": SLOTS, "positions": K, "refit_interval": ROUND, "runs": runs}, path)
    env = {**os.environ, "TRITON_INTERPRET": "1", "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.cuda.vllm_estimator_run", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tool, chat, pooled = json.loads(done.stdout.strip().splitlines()[-1])
    assert tool["refits"] == chat["refits"] == pooled["refits"] == 3
    est = vllm_estimator.OnlineAcceptanceEstimator
    fit = ClassAcceptanceEstimators(
        3,
        K,
        slope=vllm_estimator._INIT_SLOPE,
        intercepts=[vllm_estimator._INIT_BIAS] * K,
        refit_interval=ROUND,
        damping=est.DAMPING_OBSERVATIONS,
        l2=est.L2,
    )
    for _, features, sampled, rejected in pooled_run:
        predictions = fit.predict(features, classes)
        fit.accumulate(features, predictions, classes, sampled, rejected)
        fit.end_step()
    for group, reference in ((1, tool), (2, chat)):
        slope, intercepts = fit.coefficients(group)
        assert slope == pytest.approx(reference["slope"], abs=1e-5)
        assert intercepts == pytest.approx(reference["intercepts"], abs=1e-5)
    for reference in (tool, chat):
        pairs = zip(pooled["intercepts"], reference["intercepts"], strict=True)
        gap = max(abs(a - b) for a, b in pairs)
        assert gap > 0.3


def test_a_class_group_goes_to_a_newcomer_only_once_no_live_request_uses_it() -> None:
    groups = ClassGroups(capacity=3)  # the unclassified group and two classes
    assert groups.group_of(None) == (0, False)
    assert groups.group_of("a") == (1, False)
    assert groups.group_of("b") == (2, False)
    assert groups.group_of("a") == (1, False)  # seen again: "b" is now the oldest
    assert groups.group_of("c", lambda: {1, 2}) == (0, False)  # every group live: folded
    assert groups.folded == 1
    assert groups.group_of("c", lambda: {1}) == (2, True)  # "b"'s, reset before use
    assert groups.known() == {"a": 1, "c": 2}


class _Engine:
    """An `AsyncLLM`'s `collective_rpc` over workers in this process."""

    def __init__(self, *workers: _Worker) -> None:
        self.workers = workers

    async def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return [getattr(worker, method)(*args) for worker in self.workers]


async def test_the_engine_installs_it_as_the_verify_budget_setting_says() -> None:
    """`on`: bounds and per-class estimators; `vllm-av`: bounds, 0.33's pooled estimator
    (as the CPU's scheduler trims); `off` or none: nothing."""
    for mode in ("off", None):
        runner = _runner()
        runner.vllm_config.additional_config = {} if mode is None else {VERIFY_BUDGET_KEY: mode}
        assert await serve_class_verification(_Engine(_Worker(runner))) is False
        assert "get_num_tokens" not in vars(runner.adaptive_verification)
    runner = _runner()
    runner.vllm_config.additional_config[VERIFY_BUDGET_KEY] = "vllm-av"
    assert await serve_class_verification(_Engine(_Worker(runner))) is True
    assert "get_num_tokens" in vars(runner.adaptive_verification)
    assert "step" not in vars(runner.speculator.acceptance_estimator)
    assert "classes" not in _Worker(runner).specgw_class_verification()
    runners = [_runner(), _runner()]  # two tensor-parallel ranks
    assert await serve_class_verification(_Engine(*(_Worker(r) for r in runners))) is True
    assert all("step" in vars(r.speculator.acceptance_estimator) for r in runners)
    lone = _runner()
    lone.adaptive_verification = None  # one rank without: not installed everywhere
    assert await serve_class_verification(_Engine(_Worker(_runner()), _Worker(lone))) is False
