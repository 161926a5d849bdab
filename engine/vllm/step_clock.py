"""The engine core's own step period, sent with every step's scheduler stats.

The controller's cost model needs the seconds of one engine step at each batch
size and depth. Finished requests give only a mean over their life (e2e - TTFT
over their decode steps), and in mixed traffic most lives span batches of
several depths or other requests' prefill, so few of them may be filed at all
(at concurrency 4 a model fed only by request means stayed near its start-up
calibration, k = 1 priced at 1.33x k = 0 where static runs measured 1.69x;
`GET /admin/costs` shows the live prices). The engine core knows each step
exactly: what it scheduled and how long the step took.

vLLM's own per-step record (`SchedulerIterationDetails`, behind
`--enable-logging-iteration-details`) times only the model call, not the
scheduling, the output update or the draft pickup around it: on a small CPU
about 1.3 ms of an 8 ms step at batch 1, more at larger batches. A request waits
for the whole period, so `StepClock` times the period from one output update to
the next while the core holds work, and fills the same record (vLLM's type and
meaning: context and generation requests and tokens, elapsed milliseconds) from
the scheduler, where the engine core would leave it empty. A period that began
with the core idle (no unfinished requests after the previous step, so it
blocked on its input queue) says nothing about a step and is not sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.stats import SchedulerIterationDetails
from vllm.v1.utils import compute_iteration_details


class StepClock:
    """Times the engine core's steps from inside its scheduler (`engine.vllm.scheduler`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: When the last output update ended, while the core still held work; else None.
        self._last: float | None = None
        self._index = 0

    def stamp(
        self,
        scheduler_output: SchedulerOutput,
        outputs: dict[int, EngineCoreOutputs],
        busy: bool,
    ) -> float | None:
        """After the scheduler's output update of one step: attach the step's record to
        the step's scheduler stats (where vLLM attached none); `busy`: the core still
        holds unfinished requests, so the next step follows without waiting. Returns the
        step's period in ms (None where it is not one: the core was idle before it)."""
        now = self._clock()
        last, self._last = self._last, (now if busy else None)
        if last is None or scheduler_output.total_num_scheduled_tokens <= 0:
            return None
        elapsed_ms = (now - last) * 1000.0
        stats = next((o.scheduler_stats for o in outputs.values() if o.scheduler_stats), None)
        if stats is None or stats.iteration_details is not None:
            return elapsed_ms
        counts = compute_iteration_details(scheduler_output)
        stats.iteration_details = SchedulerIterationDetails(
            iteration_index=self._index,
            num_ctx_requests=counts.num_ctx_requests,
            num_ctx_tokens=counts.num_ctx_tokens,
            num_generation_requests=counts.num_generation_requests,
            num_generation_tokens=counts.num_generation_tokens,
            elapsed_ms=elapsed_ms,
        )
        self._index += 1
        return elapsed_ms
