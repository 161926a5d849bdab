"""The engine-core stats the stat logger hands on: counts, timed steps, quiet logs."""

from __future__ import annotations

import logging

from vllm.v1.metrics.stats import SchedulerIterationDetails, SchedulerStats

from engine.interface import EngineStep
from engine.vllm.stats import EngineActivity, SchedulerCountsLogger, quiet_step_lines


def _details(elapsed_ms: float, dummy: bool = False) -> SchedulerIterationDetails:
    return SchedulerIterationDetails(
        iteration_index=7,
        num_ctx_requests=1,
        num_ctx_tokens=40,
        num_generation_requests=3,
        num_generation_tokens=9,
        elapsed_ms=elapsed_ms,
        is_dummy=dummy,
    )


def test_a_timed_step_reaches_the_listener_with_its_counts() -> None:
    activity = EngineActivity()
    steps: list[EngineStep] = []
    activity.on_step(steps.append)
    logger = SchedulerCountsLogger(None, activity=activity)
    stats = SchedulerStats(num_running_reqs=4, num_waiting_reqs=1)
    stats.iteration_details = _details(12.5)
    logger.record(stats, None)
    logger.record(SchedulerStats(num_running_reqs=4), None)  # a step the core did not time
    stats.iteration_details = _details(3.0, dummy=True)  # a data-parallel dummy step
    logger.record(stats, None)
    assert steps == [EngineStep(0.0125, 3, 9, 1, 40)]
    assert (activity.counts().running, activity.counts().waiting) == (4, 1)
    activity.on_step(None)
    stats.iteration_details = _details(12.5)
    logger.record(stats, None)
    assert len(steps) == 1


def test_the_steps_cuda_graph_mode_goes_with_it() -> None:
    """vLLM's `CUDAGraphStat` (with `cudagraph_metrics`) rides on the step's stats."""
    from vllm.compilation.cuda_graph import CUDAGraphStat

    activity = EngineActivity()
    steps: list[EngineStep] = []
    activity.on_step(steps.append)
    stats = SchedulerStats(num_running_reqs=3)
    stats.iteration_details = _details(10.0)
    stats.cudagraph_stats = CUDAGraphStat(9, 10, 1, "FULL")
    SchedulerCountsLogger(None, activity=activity).record(stats, None)
    assert steps == [EngineStep(0.01, 3, 9, 1, 40, "FULL")]


def test_vllm_per_step_lines_are_dropped_and_its_summaries_kept() -> None:
    quiet_step_lines()
    quiet_step_lines()  # idempotent: one filter
    logger = logging.getLogger("vllm.v1.metrics.loggers")
    assert len([f for f in logger.filters if type(f).__name__ == "_NoStepLines"]) == 1

    def passes(msg: str) -> bool:
        record = logger.makeRecord(logger.name, logging.INFO, __file__, 1, msg, (), None)
        return all(f.filter(record) for f in logger.filters)  # type: ignore[union-attr]

    assert not passes("%sIteration(%d): %d context requests, %d context tokens")
    assert passes("Engine %03d: Avg prompt throughput: %.1f tokens/s")
