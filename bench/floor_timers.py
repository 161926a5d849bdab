"""Per-component step timers inside a running engine (`bench.floor_interleaved --profile`).

Two halves, both loaded into vLLM through its own extension points and nothing else:

* `FloorProfileWorker` (`worker_extension_cls`): the gateway's worker extension plus
  `specgw_floor_install`, which wraps the model runner's per-step methods (the same
  instance-attribute wrapping `engine.vllm.draft_skip` does) with inclusive timers;
* `FloorProfileScheduler` (`scheduler_cls`): the gateway's depth-capping scheduler
  with its `schedule` and `update_from_output` timed, and the engine core's `step`
  and `post_step` wrapped, readable through the utility call `specgw_floor_profile`.

Each step is filed under its phase: `prefill` when it schedules any prompt tokens
(a new request, or more tokens for a request than 1 + its drafts), else `decode`.
Timers are inclusive: `core.step` (the engine core's whole step) holds `core.schedule`,
`core.update_from_output` and the round trip to the worker process, which holds
`execute_model` (itself holding `_prepare_inputs`, which holds `_calc_spec_decode_metadata`)
and `sample_tokens`; `bench.floor_summary.Case` reads `core.step` less those four as
`executor+ipc`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.floor_summary import Totals
from engine.vllm.scheduler import SpecDepthScheduler
from engine.vllm.worker import SpecGatewayWorker

#: Model-runner methods timed per step (V1 runner, vLLM 0.32; absent ones are skipped).
RUNNER_TIMED: tuple[str, ...] = (
    "execute_model",
    "_update_states",
    "_prepare_inputs",
    "_calc_spec_decode_metadata",
    "_get_slot_mappings",
    "_build_attention_metadata",
    "_preprocess",
    "_model_forward",
    "sample_tokens",
    "_sample",
    "_bookkeeping_sync",
    "propose_draft_token_ids",
    "take_draft_token_ids",
)


def step_phase(scheduler_output: Any) -> str:
    """`prefill` if the step schedules prompt tokens for any request, else `decode`."""
    if getattr(scheduler_output, "scheduled_new_reqs", None):
        return "prefill"
    spec = getattr(scheduler_output, "scheduled_spec_decode_tokens", {}) or {}
    for req_id, tokens in (scheduler_output.num_scheduled_tokens or {}).items():
        if tokens > 1 + len(spec.get(req_id, ())):
            return "prefill"
    return "decode"


class PhaseTimers:
    """Seconds and calls per (phase, component); the phase is set once per step."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.phase = "decode"
        self.totals: Totals = {}

    def add(self, component: str, seconds: float) -> None:
        cell = self.totals.setdefault(self.phase, {}).setdefault(component, [0.0, 0.0])
        cell[0] += seconds
        cell[1] += 1

    def timed(self, component: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """`call` wrapped so that each call's wall time is added under `component`."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = self._clock()
            try:
                return call(*args, **kwargs)
            finally:
                self.add(component, self._clock() - start)

        return wrapper

    def take(self) -> Totals:
        totals, self.totals = self.totals, {}
        return totals


class FloorProfileWorker(SpecGatewayWorker):
    """The gateway's worker extension plus runner timers (installed by RPC)."""

    def specgw_floor_install(self) -> list[str]:
        """Wrap the runner's timed methods; the names wrapped."""
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        timers = PhaseTimers()
        wrapped = []
        for name in RUNNER_TIMED:
            method = getattr(runner, name, None)
            if method is None:
                continue
            if name == "execute_model":
                method = _phase_setting(timers, method)
            setattr(runner, name, timers.timed(name, method))
            wrapped.append(name)
        holder = getattr(runner.model, "model", runner.model)
        add_hidden = getattr(holder, "_maybe_add_hidden_state", None)
        if add_hidden is not None:  # EAGLE-3 aux hidden-state capture, called per layer
            holder._maybe_add_hidden_state = timers.timed("aux_hidden_capture", add_hidden)
            wrapped.append("aux_hidden_capture")
        runner._specgw_floor_timers = timers
        return wrapped

    def specgw_floor_take(self) -> Totals:
        """Totals since the last take, then cleared."""
        timers = getattr(self.model_runner, "_specgw_floor_timers", None)  # type: ignore[attr-defined]
        return timers.take() if timers is not None else {}


def _phase_setting(timers: PhaseTimers, execute_model: Callable[..., Any]) -> Callable[..., Any]:
    def execute(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        timers.phase = step_phase(scheduler_output)
        return execute_model(scheduler_output, *args, **kwargs)

    return execute


class FloorProfileScheduler(SpecDepthScheduler):
    """The synchronous depth-capping scheduler, timed, with the engine core's step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.specgw_floor = PhaseTimers()
        _time_engine_core(self)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        self.specgw_floor.phase = step_phase(output)
        self.specgw_floor.add("core.schedule", time.perf_counter() - start)
        return output

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        outputs = super().update_from_output(*args, **kwargs)
        self.specgw_floor.add("core.update_from_output", time.perf_counter() - start)
        return outputs


def _time_engine_core(scheduler: FloorProfileScheduler) -> None:
    """Wrap `EngineCore.step`/`post_step` (class level, once per engine-core process) and
    add the utility `specgw_floor_profile` that returns and clears the scheduler's totals."""
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore, "_specgw_floor", False):
        return
    step, post_step = EngineCore.step, EngineCore.post_step

    def timed_step(self: Any) -> Any:
        start = time.perf_counter()
        result = step(self)
        timers = getattr(self.scheduler, "specgw_floor", None)
        if timers is not None and result[1]:
            timers.add("core.step", time.perf_counter() - start)
        return result

    def timed_post_step(self: Any, model_executed: bool) -> None:
        start = time.perf_counter()
        post_step(self, model_executed)
        timers = getattr(self.scheduler, "specgw_floor", None)
        if timers is not None and model_executed:
            timers.add("core.post_step", time.perf_counter() - start)

    def specgw_floor_profile(self: Any) -> Totals:
        timers = getattr(self.scheduler, "specgw_floor", None)
        return timers.take() if timers is not None else {}

    EngineCore.step = timed_step  # type: ignore[method-assign]
    EngineCore.post_step = timed_post_step  # type: ignore[method-assign]
    EngineCore.specgw_floor_profile = specgw_floor_profile  # type: ignore[attr-defined]
    EngineCore._specgw_floor = True  # type: ignore[attr-defined]


class AuxKeptWorker(FloorProfileWorker):
    """The profile's worker with depth-0 steps still taking the EAGLE-3 aux hidden states:
    the engine as it was before `engine.vllm.draft_skip._aux_capture` (the "before" of an A/B)."""

    def specgw_install_draft_skip(self) -> bool:
        import engine.vllm.draft_skip

        engine.vllm.draft_skip._aux_capture = lambda runner: None
        return super().specgw_install_draft_skip()
