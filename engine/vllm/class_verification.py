"""Class bounds and per-class calibration under vLLM 0.33's adaptive verification (Model Runner V2).

vLLM 0.33's adaptive verification (`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`,
`AdaptiveVerificationManager`) picks each step's draft budget from every draft's predicted
acceptance and admits the globally best slots (the rule: `engine.verify_budget`). Two things
of the gateway's reach it here, in the worker, through the request's `extra_args`:

1. **Class bound.** A request's drafts never exceed its class bound k (`SPEC_DEPTH_ARG`;
   missing = K; 0 = verify nothing). Under the uniform batch-depth rule the scheduler gives
   every drafting request the step's depth (`engine.vllm.batch_depth`), so the bound is
   applied where 0.33 reads each request's scheduled drafts: `get_num_tokens` (the budget's
   argmax and the capacities it stashes for `reallocate_drafts`) is given each request's
   drafts, and its scheduled tokens, less those past its k. Its slots past k never compete,
   as slots past its scheduled drafts never do in 0.33; the step's token count is its
   non-draft tokens plus the budget, as 0.33 counts it.
2. **Per-class calibration** (vLLM issue 57533: 0.33's estimator pools every request on a
   worker). The drafter's graph still runs 0.33's `OnlineAcceptanceEstimator.predict`, which
   stores each draft's feature per request slot (`features`); `record_confidences`, which
   runs eagerly after `propose` and before anything reads the step's confidences, is
   preceded by their re-prediction with the request's class coefficients
   (`engine.vllm.class_estimators`), written where 0.33's would be (`predictions` for the
   grading, the speculator's `draft_token_confidence_probs` for the ranking and the next
   budget). The estimator's `step` (eager, in `sample_tokens`, before `propose`) is replaced
   by the per-class fit of the same drafts' outcomes. Each class cold-starts from the
   coefficients the pooled estimator held at install (0.33's `_INIT_SLOPE`, `_INIT_BIAS`).

Why it is lossless: a trimmed draft is not verified, which 0.33 already does to any draft
its budget leaves out; the admitted drafts are verified by 0.33's rejection sampler,
unchanged. The bound and the class's coefficients depend on the request, never on the
drafted token (0.33's own argument for its feature: it scores the draft distribution, so
trimming never conditions on the token trimmed). What changes is only which drafts are
verified. Every tensor-parallel rank sees the same scheduler outputs and fits alike (the
per-class sums are deterministic), so every rank trims alike, as 0.33 requires.

Cost per step: one pass over the step's requests in Python where a bound cuts (a dict
copy), and a handful of small kernels for the re-prediction and the fit (rows x K x
classes), launched after `propose`, off the drafter's graph.

Installed after the engine starts (`specgw_install_class_verification` through
`collective_rpc`, `serve_class_verification`; mixed into the worker by
`engine.vllm.worker.SpecGatewayWorker`). Nothing it wraps is inside a CUDA graph, so the
graphs captured at start stay valid. Where a wrapped method moved or changed (`HOOKS`), or
the runner has no adaptive verification or no acceptance estimator (a confidence head:
DSpark), the install returns False and nothing changes. A newcomer's cap
(`SPEC_CAP_ARG`) lowers depths in the scheduler only: the bound here is the request's own k.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.interface import SPEC_CLASS_ARG, SPEC_DEPTH_ARG, depth_arg
from engine.vllm.class_estimators import DEFAULT_GROUPS, ClassAcceptanceEstimators, ClassGroups
from engine.vllm.compat import Hook, hook_problem
from engine.vllm.confidence_budget import VERIFY_BUDGET_KEY

_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
_AV = "vllm.v1.worker.gpu.spec_decode.adaptive_verification:AdaptiveVerificationManager"
_EST = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator:OnlineAcceptanceEstimator"
_FEATURE = "class bounds and per-class calibration under adaptive verification"

#: What the install wraps or relies on in vLLM 0.33 (checked before it installs).
HOOKS: tuple[Hook, ...] = (
    Hook(_FEATURE, f"{_RUNNER}.add_requests", ("scheduler_output",), ("scheduled_new_reqs",)),
    Hook(
        _FEATURE,
        f"{_RUNNER}.sample_tokens",
        ("grammar_output",),
        ("observe_verification", "record_confidences", "draft_token_confidence_probs"),
    ),
    Hook(
        _FEATURE,
        f"{_AV}.get_num_tokens",
        ("num_tokens_per_req", "draft_tokens"),
        ("len(draft_tokens.get(req_id, ()))", "self._batch_budget = ("),
    ),
    Hook(_FEATURE, f"{_AV}.reallocate_drafts", ("req_ids", "idx_mapping"), ("num_drafts_per_req",)),
    Hook(
        _FEATURE,
        f"{_AV}.record_confidences",
        ("confidence_probs", "input_batch"),
        ("self._confidence_probs[input_batch.idx_mapping] = confidence_probs[:num_reqs]",),
    ),
    Hook(_FEATURE, f"{_EST}.step", ("idx_mapping", "num_sampled", "num_rejected")),
    Hook(
        _FEATURE,
        f"{_EST}.__init__",
        None,
        ("self.features", "self.predictions", "self.slope", "self.intercepts"),
    ),
)


@dataclass
class ClassVerification:
    """The hook's state in one worker: per request slot its bound and class group."""

    estimators: ClassAcceptanceEstimators | None
    groups: ClassGroups
    max_depth: int
    #: Per slot: the request's class bound (host) and its group (host and device).
    bound: np.ndarray
    slot_group_host: np.ndarray
    slot_group: Any
    #: Steps in which some request's bound cut its scheduled drafts.
    bounded_steps: int = 0

    def admit(
        self, slot: int, extra_args: Mapping[str, Any] | None, live: Callable[[], Iterable[int]]
    ) -> None:
        """A request entered `slot`: its bound and its class's group from `extra_args`
        (`live`: the slots of the requests in the runner, read only when every group is
        taken)."""
        k = depth_arg(extra_args, SPEC_DEPTH_ARG)
        self.bound[slot] = self.max_depth if k is None else min(k, self.max_depth)
        if self.estimators is None:
            return
        class_id = extra_args.get(SPEC_CLASS_ARG) if extra_args else None

        def busy() -> set[int]:
            return {int(self.slot_group_host[s]) for s in live() if s != slot}

        group, reset = self.groups.group_of(class_id, busy)
        if reset:
            self.estimators.reset(group)
        if int(self.slot_group_host[slot]) != group:
            self.slot_group_host[slot] = group
            self.slot_group[slot] = group

    def bounded(
        self,
        num_tokens_per_req: Mapping[str, int],
        draft_tokens: Mapping[str, list[int]],
        slots: Mapping[str, int],
    ) -> tuple[Mapping[str, int], Mapping[str, list[int]]]:
        """Each request's scheduled tokens and drafts with its drafts cut to its bound: a cut
        draft leaves the request's tokens too (0.33 counts tokens less drafts as the step's
        non-draft tokens). The same dicts where no request is cut."""
        tokens: dict[str, int] | None = None
        drafts: dict[str, list[int]] = {}
        for req_id, ids in draft_tokens.items():
            slot = slots.get(req_id)
            if slot is None:
                continue
            cap = int(self.bound[slot])
            if len(ids) > cap:
                if tokens is None:
                    tokens, drafts = dict(num_tokens_per_req), dict(draft_tokens)
                tokens[req_id] -= len(ids) - cap
                drafts[req_id] = list(ids[:cap])
        if tokens is None:
            return num_tokens_per_req, draft_tokens
        self.bounded_steps += 1
        return tokens, drafts

    def report(self) -> dict[str, Any]:
        """Plain values (they cross `collective_rpc`): each class's coefficients and counts."""
        out: dict[str, Any] = {"bounded_steps": self.bounded_steps, "folded": self.groups.folded}
        est = self.estimators
        if est is not None:
            groups = {"": 0} | self.groups.known()
            out["classes"] = {name: est.coefficients(g) for name, g in groups.items()}
            out["refits"] = est.refits
        return out


def runner_supports_class_verification(runner: Any) -> bool:
    """Whether `runner` is a Model Runner V2 under adaptive verification with 0.33's own
    acceptance estimator, and every hook fits the installed vLLM."""
    from vllm.v1.worker.gpu.spec_decode.acceptance_estimator import OnlineAcceptanceEstimator
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
    )

    manager = getattr(runner, "adaptive_verification", None)
    estimator = getattr(getattr(runner, "speculator", None), "acceptance_estimator", None)
    if not isinstance(manager, AdaptiveVerificationManager):
        return False
    if not isinstance(estimator, OnlineAcceptanceEstimator):
        return False
    if getattr(runner, "req_states", None) is None:
        return False
    return all(hook_problem(hook) is None for hook in HOOKS)


class ClassVerificationExtension:
    """Worker extension (mixed into vLLM's worker class by `worker_extension_cls`)."""

    def specgw_install_class_verification(
        self, per_class: bool | None = None, groups: int = DEFAULT_GROUPS
    ) -> bool:
        """Install the bounds, and with `per_class` the per-class estimators (else 0.33's
        pooled one stays). None: as the verify-budget setting says (`VERIFY_BUDGET_KEY` in
        the engine's `additional_config`): `on` per class, `vllm-av` pooled (the CPU's
        scheduler trims alike: `engine.vllm.confidence_budget`), anything else not at all."""
        runner: Any = getattr(self, "model_runner", None)
        if runner is None or getattr(runner, "_specgw_class_verification", None) is not None:
            return False
        if per_class is None:
            extra = getattr(getattr(runner, "vllm_config", None), "additional_config", None)
            mode = extra.get(VERIFY_BUDGET_KEY) if isinstance(extra, dict) else None
            if mode not in ("on", "vllm-av"):
                return False
            per_class = mode == "on"
        if not runner_supports_class_verification(runner):
            return False
        runner._specgw_class_verification = install(runner, per_class=per_class, groups=groups)
        return True

    def specgw_class_verification(self) -> dict[str, Any]:
        """The hook's report (`ClassVerification.report`); empty where not installed."""
        state = getattr(getattr(self, "model_runner", None), "_specgw_class_verification", None)
        return state.report() if isinstance(state, ClassVerification) else {}


def install(
    runner: Any, *, per_class: bool = True, groups: int = DEFAULT_GROUPS
) -> ClassVerification:
    """Wrap the runner's `add_requests`, its manager's `get_num_tokens` and, with
    `per_class`, `record_confidences` and the estimator's `step` (module docstring)."""
    import torch

    manager = runner.adaptive_verification
    estimator = runner.speculator.acceptance_estimator
    speculator = runner.speculator
    req_states = runner.req_states
    slots, positions = estimator.features.shape
    device = estimator.features.device
    fit = None
    if per_class:
        fit = ClassAcceptanceEstimators(
            groups,
            positions,
            slope=float(estimator.slope.reshape(-1)[0]),
            intercepts=estimator.intercepts.tolist(),
            refit_interval=int(type(estimator).REFIT_INTERVAL),
            damping=float(type(estimator).DAMPING_OBSERVATIONS),
            l2=float(type(estimator).L2),
            device=device,
        )
    state = ClassVerification(
        estimators=fit,
        groups=ClassGroups(groups),
        max_depth=positions,
        bound=np.full(slots, positions, dtype=np.int32),
        slot_group_host=np.zeros(slots, dtype=np.int64),
        slot_group=torch.zeros(slots, dtype=torch.int64, device=device),
    )
    add_requests = runner.add_requests
    get_num_tokens = manager.get_num_tokens

    def add_requests_noting(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        out = add_requests(scheduler_output, *args, **kwargs)
        index = req_states.req_id_to_index
        for new in scheduler_output.scheduled_new_reqs:
            slot = index.get(new.req_id)
            params = new.sampling_params
            if slot is not None:
                extra = params.extra_args if params is not None else None
                state.admit(slot, extra, index.values)
        return out

    def get_num_tokens_bounded(
        num_tokens_per_req: dict[str, int], draft_tokens: dict[str, list[int]]
    ) -> int:
        tokens, drafts = state.bounded(num_tokens_per_req, draft_tokens, req_states.req_id_to_index)
        return int(get_num_tokens(tokens, drafts))

    wrapped: list[tuple[Any, str, Callable[..., Any]]] = [
        (runner, "add_requests", add_requests_noting),
        (manager, "get_num_tokens", get_num_tokens_bounded),
    ]
    if fit is not None:
        wrapped += _per_class(state, fit, manager, estimator, speculator)
    for owner, name, wrapper in wrapped:
        setattr(owner, name, wrapper)
    return state


def _per_class(
    state: ClassVerification,
    fit: ClassAcceptanceEstimators,
    manager: Any,
    estimator: Any,
    speculator: Any,
) -> list[tuple[Any, str, Callable[..., Any]]]:
    """The per-class re-prediction before `record_confidences` and the per-class `step`."""
    record_confidences = manager.record_confidences

    def record_per_class(confidence_probs: Any, input_batch: Any, *args: Any, **kw: Any) -> Any:
        num_reqs = int(input_batch.num_reqs)
        if num_reqs > 0 and confidence_probs is speculator.draft_token_confidence_probs:
            idx = input_batch.idx_mapping[:num_reqs]
            probs = fit.predict(estimator.features[idx], state.slot_group[idx])
            estimator.predictions[idx] = probs
            confidence_probs[:num_reqs] = probs
        return record_confidences(confidence_probs, input_batch, *args, **kw)

    def step_per_class(idx_mapping: Any, num_sampled: Any, num_rejected: Any) -> None:
        n = int(idx_mapping.shape[0])
        if n > 0:
            fit.accumulate(
                estimator.features[idx_mapping],
                estimator.predictions[idx_mapping],
                state.slot_group[idx_mapping],
                num_sampled[:n],
                num_rejected[:n],
            )
        fit.end_step()

    return [(manager, "record_confidences", record_per_class), (estimator, "step", step_per_class)]


async def serve_class_verification(llm: Any) -> bool:
    """The install on every worker of a started `AsyncLLM`, as its verify-budget setting
    says: whether every worker took it (False where the setting is off, and on a runner
    without adaptive verification: the CPU's V1 runner trims in its scheduler)."""
    installed = await llm.collective_rpc("specgw_install_class_verification")
    return bool(installed) and all(installed)


__all__ = [
    "HOOKS",
    "ClassVerification",
    "ClassVerificationExtension",
    "install",
    "runner_supports_class_verification",
    "serve_class_verification",
]
