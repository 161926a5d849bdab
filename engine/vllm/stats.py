"""What the engine is doing right now: in-flight work, last output, engine-core counts.

Health needs two things vLLM does not hand the front-end directly: whether work
is admitted but nothing comes out (a stall), and how many requests the engine
core itself holds. The first is tracked here around every stream; the second
arrives with every engine-core output batch as `SchedulerStats`, which a stat
logger (vLLM's `StatLoggerBase` plug-in point) copies here. The same stats carry
each step's timing (`engine.vllm.step_clock`), which goes to the step listener.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from engine.interface import EngineStep, StepListener

#: vLLM's `LoggingStatLogger` logs every step's `iteration_details` at info ("Iteration(").
_VLLM_STAT_LOGGER = "vllm.v1.metrics.loggers"


@dataclass(frozen=True, slots=True)
class CoreCounts:
    """Requests in the engine core's scheduler, as of `reported_at` (monotonic s)."""

    running: int = 0
    waiting: int = 0
    reported_at: float = 0.0


class EngineActivity:
    """In-flight streams and their last output time; the core's last reported counts."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._last_progress = time.monotonic()
        self._counts = CoreCounts()
        self._on_step: StepListener | None = None

    @contextmanager
    def track(self) -> Iterator[None]:
        if self._in_flight == 0:
            self._last_progress = time.monotonic()
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    def progress(self) -> None:
        self._last_progress = time.monotonic()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def stalled_for(self) -> float:
        """Seconds without output while work is in flight (0 when idle)."""
        if self._in_flight == 0:
            return 0.0
        return time.monotonic() - self._last_progress

    def record_counts(self, running: int, waiting: int) -> None:
        self._counts = CoreCounts(running, waiting, time.monotonic())

    def counts(self) -> CoreCounts:
        return self._counts

    def on_step(self, listener: StepListener | None) -> None:
        self._on_step = listener

    def record_step(self, details: Any, graph_mode: str | None = None) -> None:
        """One step's `SchedulerIterationDetails` (`engine.vllm.step_clock`) to the listener,
        with how its forward ran (`CUDAGraphStat.runtime_mode`, where vLLM reports it)."""
        if self._on_step is None or details.is_dummy or details.elapsed_ms <= 0:
            return
        self._on_step(
            EngineStep(
                details.elapsed_ms / 1000.0,
                int(details.num_generation_requests),
                int(details.num_generation_tokens),
                int(details.num_ctx_requests),
                int(details.num_ctx_tokens),
                graph_mode,
            )
        )

    def logger_factory(self) -> Callable[..., StatLoggerBase]:
        """A vLLM `StatLoggerFactory` whose loggers report into this object."""

        def factory(vllm_config: Any, engine_index: int = 0) -> StatLoggerBase:
            return SchedulerCountsLogger(vllm_config, engine_index, activity=self)

        return factory


class SchedulerCountsLogger(StatLoggerBase):
    """Copies the engine core's running/waiting counts into an `EngineActivity`."""

    def __init__(
        self, vllm_config: Any, engine_index: int = 0, *, activity: EngineActivity | None = None
    ) -> None:
        self._activity = activity or EngineActivity()

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self._activity.record_counts(
                int(scheduler_stats.num_running_reqs), int(scheduler_stats.num_waiting_reqs)
            )
            details = getattr(scheduler_stats, "iteration_details", None)
            if details is not None:
                graphs = getattr(scheduler_stats, "cudagraph_stats", None)
                mode = None if graphs is None else str(graphs.runtime_mode)
                self._activity.record_step(details, mode)

    def log_engine_initialized(self) -> None:
        return None


class _NoStepLines(logging.Filter):
    """Drops vLLM's per-step "Iteration(...)" info lines, keeps its periodic summaries."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Iteration(" not in str(record.msg)


def quiet_step_lines() -> None:
    """Keep vLLM's default stat logger from logging every timed step (idempotent).

    The scheduler fills each step's `iteration_details` (`engine.vllm.step_clock`); vLLM's
    logger prints any it finds, a line per step, which it was never meant to do
    unless `--enable-logging-iteration-details` asked for it.
    """
    logger = logging.getLogger(_VLLM_STAT_LOGGER)
    if not any(isinstance(f, _NoStepLines) for f in logger.filters):
        logger.addFilter(_NoStepLines())
