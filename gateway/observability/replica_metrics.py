"""The replica's own state in the `specgw_*` catalogue: build, engine, admission, store, flags.

`GatewayMetrics` (`gateway.observability.metrics`) extends this with the per-class
request families; both live on the one injected registry. These families carry
no `class` label: one series per replica (per state, flag or step kind).

* `specgw_build_info{version, model, drafter, vllm_version, max_depth}` is 1: join
  it to put a replica's drafter next to its per-class series, e.g. acceptance by
  drafter::

      sum by (drafter, class) (rate(specgw_accepted_tokens_total[5m])
        * on (namespace, job, instance) group_left (drafter) specgw_build_info)

* `specgw_engine_ready` is 1 exactly when `specgw_engine_state{state="ready"}` is;
  both follow `gateway.engine_watch` (dead, hung, restarting, draining: 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Info

from gateway.engine_watch import EngineState

RedisState = Literal["up", "degraded", "disabled"]
REDIS_STATES: tuple[RedisState, ...] = ("up", "degraded", "disabled")
#: The runtime modes of vLLM's `CUDAGraphStat` (`vllm.config.compilation.CUDAGraphMode`).
GRAPH_MODES = ("FULL", "PIECEWISE", "NONE")


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """What a replica runs, as `specgw_build_info` labels it."""

    version: str
    model: str
    drafter: str
    vllm_version: str
    max_depth: int
    #: Whether the engine sets each step's depth from the requests' votes (`step_rule`).
    step_rule: bool = False

    def labels(self) -> dict[str, str]:
        return {
            "version": self.version,
            "model": self.model,
            "drafter": self.drafter,
            "vllm_version": self.vllm_version,
            "max_depth": str(self.max_depth),
            "step_rule": "on" if self.step_rule else "off",
        }


class ReplicaMetrics:
    """The replica-level families with their setters; `flags` bounds `specgw_flag_state`."""

    def __init__(
        self, registry: CollectorRegistry, *, flags: Sequence[str] = (), max_depth: int = 0
    ) -> None:
        self.registry = registry
        self._flags = tuple(flags)
        r = registry
        self.flag_state = Gauge(
            "specgw_flag_state", "Current value of an ops flag.", ["flag"], registry=r
        )
        self.redis_state = Gauge(
            "specgw_redis_state",
            "Cluster-state store: 1 for the current state (up, degraded, disabled).",
            ["state"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "specgw_admission_queue_depth", "Requests waiting for admission.", registry=r
        )
        self.running = Gauge(
            "specgw_running_requests", "Requests admitted and running.", registry=r
        )
        self.engine_ready = Gauge(
            "specgw_engine_ready", "1 when the engine is ready to serve, else 0.", registry=r
        )
        engine_steps = Counter(
            "specgw_engine_steps",
            "Timed engine steps heard, by whether the cost model filed them (decode-only "
            "steps whose batch the gateway knows).",
            ["filed"],
            registry=r,
        )
        #: Bound once: `record_engine_step` runs for every engine step.
        self._steps_filed = engine_steps.labels("true")
        self._steps_skipped = engine_steps.labels("false")
        step_depth = Counter(
            "specgw_engine_step_depth",
            "Timed engine steps with decoding requests, by the drafts each of them verified "
            "(`mixed`: their depths differed): the depths the engine ran, whoever chose them.",
            ["depth"],
            registry=r,
        )
        #: Bound once, 0..K and `mixed`.
        self._step_depths = tuple(step_depth.labels(str(d)) for d in range(max_depth + 1))
        self._steps_mixed = step_depth.labels("mixed")
        graph_steps = Counter(
            "specgw_engine_cudagraph_steps",
            "Timed engine steps by how the target's forward ran: FULL CUDA graph, PIECEWISE "
            "(attention outside the graph) or NONE (eager); counted where vLLM reports it "
            "(cudagraph_metrics, on with CUDA graphs).",
            ["mode"],
            registry=r,
        )
        #: Bound once, vLLM's `CUDAGraphMode` names a step can run under.
        self._graph_steps = {m: graph_steps.labels(m) for m in GRAPH_MODES}
        self.engine_state = Gauge(
            "specgw_engine_state",
            "1 for the engine's current state as the gateway sees it (ready, starting, hung, "
            "draining, dead, restarting, failed).",
            ["state"],
            registry=r,
        )
        self.build_info = Info(
            "specgw_build",
            "What the replica runs: gateway version, served model, drafter, vLLM version, K.",
            registry=r,
        )
        for flag in self._flags:
            self.flag_state.labels(flag)
        self.set_redis_state("disabled")
        self.set_engine_state(EngineState.STARTING)

    def set_build_info(self, build: BuildInfo) -> None:
        self.build_info.info(build.labels())

    def set_flags(self, values: Iterable[tuple[str, float]]) -> None:
        """Export flag values; flags not named at construction are ignored (bounded)."""
        for name, value in values:
            if name in self._flags:
                self.flag_state.labels(name).set(value)

    def set_redis_state(self, state: RedisState) -> None:
        for s in REDIS_STATES:
            self.redis_state.labels(s).set(1 if s == state else 0)

    def set_load(self, waiting: int, running: int) -> None:
        self.queue_depth.set(waiting)
        self.running.set(running)

    def set_engine_state(self, state: EngineState) -> None:
        """The engine's state (`gateway.engine_watch`); ready is the only serving one."""
        for s in EngineState:
            self.engine_state.labels(s.value).set(1 if s is state else 0)
        self.engine_ready.set(1 if state is EngineState.READY else 0)

    def set_engine_ready(self, ready: bool) -> None:
        self.set_engine_state(EngineState.READY if ready else EngineState.STARTING)

    def record_engine_step(
        self,
        filed: bool,
        depth: int | None = None,
        decoded: bool = False,
        graph_mode: str | None = None,
    ) -> None:
        """One timed engine step; the filed share says how well the cost model is fed::

        rate(specgw_engine_steps_total{filed="true"}[5m]) / rate(specgw_engine_steps_total[5m])

        `decoded`: it had decoding requests, each verifying `depth` drafts (None: mixed);
        `graph_mode`: how its forward ran, where the engine reports it; the FULL-graph
        share, what the one-depth-per-step rule is for::

            rate(specgw_engine_cudagraph_steps_total{mode="FULL"}[5m])
              / rate(specgw_engine_cudagraph_steps_total[5m])
        """
        (self._steps_filed if filed else self._steps_skipped).inc()
        counter = self._graph_steps.get(graph_mode) if graph_mode is not None else None
        if counter is not None:
            counter.inc()
        if decoded:
            depths = self._step_depths
            if depth is not None and depth < len(depths):
                depths[depth].inc()
            else:
                self._steps_mixed.inc()
