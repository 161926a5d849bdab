"""The `Engine` seam on vLLM's in-process `AsyncLLM` (the only module that builds one).

One engine serves every request at its own speculation depth k: the drafter is
configured at K (`num_speculative_tokens`) and `engine.vllm.scheduler` caps each
request's drafts at the k carried in `SamplingParams.extra_args`. Lifetime is
an async context manager (`VLLMEngine.started`) that warms the engine up before
it yields and always shuts it down, freeing the engine-core process.

Two ways in: `generate()` (the seam; streams `GenerationChunk`s, the last one carrying
the `RequestOutcome`) and `serving_client`, the `EngineClient` vLLM's own OpenAI serving
classes run on, which resolves each gateway request's outcome in `outcome_tap`
(`engine.outcomes`), where the serving port waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

from vllm import SamplingParams
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

from engine.interface import (
    GATEWAY_ID_ARG,
    SPEC_DEPTH_ARG,
    EngineDeadError,
    EngineError,
    EngineHealth,
    GenerateRequest,
    GenerationChunk,
    InvalidRequestError,
    StepListener,
)
from engine.outcomes import OutcomeTap
from engine.settings import EngineSettings
from engine.vllm.batch_depth import BatchDepthPolicy, rule_for
from engine.vllm.class_verification import serve_class_verification
from engine.vllm.depth_zero_params import serve_depth_zero_params
from engine.vllm.engine_args import checked_engine_args, engine_args
from engine.vllm.expand_fix import ExpandState
from engine.vllm.outcome import request_outcome
from engine.vllm.preflight import preflight
from engine.vllm.sigterm import cancelled_on_sigterm
from engine.vllm.stats import EngineActivity, quiet_step_lines

log = logging.getLogger(__name__)


def describe_engine(config: Any) -> str:
    """One line of what the engine resolved to run (what `spec-gateway plan` predicted)."""
    from vllm.platforms import current_platform

    spec = config.speculative_config
    rows = getattr(spec, "num_speculative_tokens_per_batch_size", None) or []
    rule = rule_for(config, current_platform.device_type, {int(row[2]) for row in rows})
    mode = getattr(config.compilation_config.cudagraph_mode, "name", "NONE")
    widths = ", ".join(f"k={d} to batch {b}" for d, b in sorted((rule.full_batch or {}).items()))
    return (
        f"engine: {current_platform.device_type}, eager {config.model_config.enforce_eager}, "
        f"cudagraph_mode {mode}, runner {'V2' if config.use_v2_model_runner else 'V1'}, "
        f"async scheduling {config.scheduler_config.async_scheduling}, max_num_seqs "
        f"{config.scheduler_config.max_num_seqs}, max_model_len "
        f"{config.model_config.max_model_len}; batch-depth rule {rule.policy.value}, "
        f"captured depths {list(rule.captured)}{'; FULL decode: ' + widths if widths else ''}"
    )


async def _built_off_loop(args: Any, stat_loggers: list[Any]) -> AsyncLLM:
    """`AsyncLLM.from_engine_args` in a thread, so that the event loop keeps serving.

    The call returns only once the engine core has loaded the model (tens of seconds on
    the CPU build, minutes for a large model on a GPU); on the loop, no probe, scrape or
    request would be answered meanwhile, at start-up nor during an in-process restart,
    and the liveness probe would kill the pod. Built outside a running loop, vLLM starts
    its output tasks at the first request or utility call instead (its own lazy path).
    A thread cannot be stopped: cancelled meanwhile, the engine is shut down once built
    and the cancellation goes on, so no engine core outlives its context.
    """
    build = asyncio.get_running_loop().run_in_executor(
        None, lambda: AsyncLLM.from_engine_args(args, stat_loggers=stat_loggers)
    )
    try:
        return await asyncio.shield(build)
    except asyncio.CancelledError:
        try:
            llm = await build
        except Exception:
            raise asyncio.CancelledError from None
        await asyncio.to_thread(llm.shutdown)
        raise


class VLLMEngine:
    """`Engine` on one `AsyncLLM`; build it with `VLLMEngine.started(...)`."""

    def __init__(
        self, llm: AsyncLLM, settings: EngineSettings, activity: EngineActivity, max_depth: int
    ) -> None:
        self._llm = llm
        self._settings = settings
        self._activity = activity
        self._max_depth = max_depth
        self._ready = False
        self._closed = False
        #: Whether steps with only k = 0 requests skip the drafter (engine/vllm/draft_skip.py).
        self.draft_skip = False
        #: Whether every worker bounds adaptive verification by class
        #: (engine/vllm/class_verification.py).
        self.class_verification = False
        #: Whether k = 0 requests may carry min_p and logit_bias (engine/vllm/depth_zero_params.py).
        self.depth_zero_params = max_depth == 0
        #: The rejection sampler's expand kernel in the workers (engine/vllm/expand_fix.py):
        #: sampled speculation is exact only where it is "ok" or "fixed" in every one
        #: (checked at start when there is a drafter; nothing to check without one).
        self.expand_kernel: ExpandState = "broken" if max_depth > 0 else "ok"
        #: The outcomes the serving port waits for, resolved by `serving_client`.
        self.outcome_tap = OutcomeTap()
        self.serving_client = OutcomeTapClient(llm, self)

    @classmethod
    @asynccontextmanager
    async def started(cls, settings: EngineSettings) -> AsyncIterator[VLLMEngine]:
        """Start, warm up, yield a ready engine; always shut it down on exit.

        Refuses first, in one line, an untested vLLM or a changed hook, a missing
        model and a drafter that does not fit the target (`engine.vllm.preflight`).
        """
        await asyncio.to_thread(preflight, settings)
        with cancelled_on_sigterm():  # `pkill` must not orphan the core and workers
            # vLLM's CPU backend reads the KV-cache size from the environment at start.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_gib)
            activity = EngineActivity()
            args = checked_engine_args(settings)
            if not settings.extra_args.get("enable_logging_iteration_details"):
                quiet_step_lines()  # the scheduler times every step (`engine.vllm.step_clock`)
            llm = await _built_off_loop(args, [activity.logger_factory()])
            k_max = settings.max_depth if args.speculative_config else 0
            log.info("%s", describe_engine(llm.vllm_config))
            engine = cls(llm, settings, activity, k_max)
            try:
                if k_max > 0:
                    states = await llm.collective_rpc("specgw_fix_expand")
                    engine.expand_kernel = (
                        "broken" if "broken" in states else "fixed" if "fixed" in states else "ok"
                    )
                    engine.depth_zero_params = await serve_depth_zero_params(llm)
                    if not engine.depth_zero_params:  # Model Runner V2: vLLM's 400 stays
                        log.info("min_p and logit_bias at depth 0 unavailable on this model runner")
                if k_max > 0 and settings.skip_drafter_at_k0:
                    installed = await llm.collective_rpc("specgw_install_draft_skip")
                    engine.draft_skip = bool(installed) and all(installed)
                    if not engine.draft_skip:
                        # k = 0 steps still run the drafter's KV pass (`v2_skip_allowed`).
                        log.info("drafter skip at depth 0 unavailable on this model runner")
                if k_max > 0 and settings.verify_budget != "off":
                    # Model Runner V2's adaptive verification under the class bounds (and,
                    # with `on`, one estimator per class); the V1 runner has none, its
                    # scheduler trims instead (`engine.vllm.confidence_budget`).
                    engine.class_verification = await serve_class_verification(llm)
                    log.info(
                        "verify budget %s: %s",
                        settings.verify_budget,
                        "class bounds in adaptive verification"
                        if engine.class_verification
                        else "trimmed by the scheduler (no adaptive verification here)",
                    )
                await engine._warm_up()
                engine._ready = True
                yield engine
            finally:
                await engine.shutdown()

    @property
    def max_depth(self) -> int:
        return self._max_depth

    @property
    def settings(self) -> EngineSettings:
        """The settings the engine was started with (its serving layer's parsers read them)."""
        return self._settings

    @property
    def one_depth_per_step(self) -> bool:
        from vllm.platforms import current_platform

        rule = rule_for(self._llm.vllm_config, current_platform.device_type)
        return rule.max_depth > 0 and rule.policy is BatchDepthPolicy.UNIFORM

    @property
    def lossless_sampling(self) -> bool:
        mode = self._settings.sampled_speculation
        if mode != "auto":
            return mode == "on"
        # vllm-cpu 0.32's rejection sampler read each request's temperature, top-k and
        # top-p from uninitialised memory, so sampled EAGLE speculation drifted from
        # the target's distribution; `engine.vllm.expand_fix` mends that in the workers
        # (`python -m bench.sampled_fidelity` measures the three engines side by side).
        return self.expand_kernel != "broken"

    @property
    def llm(self) -> AsyncLLM:
        """The underlying AsyncLLM (tests and the OpenAI front-end)."""
        return self._llm

    async def _warm_up(self) -> None:
        """Run a few short requests so the first real one does not pay first-step costs."""
        for i in range(self._settings.warmup_prompts):
            request = GenerateRequest(
                request_id=f"specgw-warmup-{i}-{uuid.uuid4().hex[:8]}",
                prompt="Warm-up: the quick brown fox jumps over the lazy dog.",
                max_tokens=8,
                k=self._max_depth if i % 2 == 0 else 0,
            )
            async for _ in self.generate(request):
                pass

    def sampling_params(self, request: GenerateRequest) -> SamplingParams:
        extra: dict[str, Any] = dict(request.extra)
        extra[SPEC_DEPTH_ARG] = max(0, min(request.k, self._max_depth))
        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=list(request.stop) or None,
            ignore_eos=request.ignore_eos,
            extra_args=extra,
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        """Stream one request; cancelling the consumer aborts it in the engine."""
        if self._closed:
            raise EngineDeadError("engine is shut down")
        params = self.sampling_params(request)
        prompt: Any = (
            TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
            if request.prompt_token_ids is not None
            else (request.prompt or "")
        )
        k = int(params.extra_args[SPEC_DEPTH_ARG]) if params.extra_args else 0
        n_out = 0
        finished = False
        with self._activity.track():
            try:
                async for output in self._llm.generate(prompt, params, request.request_id):
                    self._activity.progress()
                    completion = output.outputs[0]
                    delta = tuple(completion.token_ids)
                    n_out += len(delta)
                    outcome = None
                    if output.finished:
                        finished = True
                        outcome = request_outcome(
                            request.request_id, output, k=k, output_tokens=n_out
                        )
                    yield GenerationChunk(
                        request_id=request.request_id,
                        text_delta=completion.text,
                        token_ids_delta=delta,
                        finished=output.finished,
                        finish_reason=completion.finish_reason,
                        outcome=outcome,
                    )
            except VLLMEngineDeadError as exc:
                raise EngineDeadError(f"engine core died: {exc}") from exc
            except VLLMClientError as exc:
                raise InvalidRequestError(str(exc)) from exc
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from exc
            finally:
                if not finished and not self._llm.errored:
                    # Consumer went away (cancel or aclose): no orphaned engine request.
                    await asyncio.shield(self._llm.abort(request.request_id))
        if not finished:
            raise EngineError(f"request {request.request_id} ended without finishing")

    async def abort(self, request_id: str) -> None:
        if not self._closed and not self._llm.errored:
            await self._llm.abort(request_id)

    async def reset_prefix_cache(self) -> bool:
        """vLLM's own reset; it refuses (False) while running requests hold cached blocks."""
        if self._closed or self._llm.errored:
            return False
        return bool(await self._llm.reset_prefix_cache())

    async def health(self) -> EngineHealth:
        counts = self._activity.counts()
        if self._closed:
            return EngineHealth(alive=False, ready=False, detail="shut down")
        if self._llm.errored:
            return EngineHealth(alive=False, ready=False, detail="engine core died")
        stalled = self._activity.stalled_for()
        detail = "" if self._ready else "warming up"
        if stalled >= self._settings.stall_bound_s:
            detail = f"stalled: work admitted, no output for {stalled:.1f} s"
        return EngineHealth(
            alive=True,
            ready=self._ready and stalled < self._settings.stall_bound_s,
            detail=detail,
            running_requests=counts.running,
            waiting_requests=counts.waiting,
            stalled_for_s=stalled,
        )

    async def ping(self) -> None:
        """A utility round trip to the engine core (`is_sleeping`), which its busy loop
        answers between steps: no request, token or `vllm:*` count; a stopped core never
        answers. The workers are not asked: after each message a worker busy-polls its
        shared-memory queue for a second (vLLM's `SpinCondition`), so `check_health` on
        every worker (`collective_rpc`) every 2 s cost 18 CPU seconds a minute at idle
        (`python -m bench.canary_cost`). An idle worker that hangs is found by the stall
        bound at the next request."""
        if self._closed or self._llm.errored:
            raise EngineDeadError("engine core is not running")
        await self._llm.is_sleeping()

    def request_counts(self) -> tuple[int, int, float]:
        """(running, waiting, monotonic time of the report) as the engine core last said."""
        counts = self._activity.counts()
        return counts.running, counts.waiting, counts.reported_at

    def engine_core_pids(self) -> list[int]:
        """PIDs of the engine-core processes (tests kill one to check failure handling)."""
        manager = getattr(self._llm.engine_core.resources, "engine_manager", None)
        procs = getattr(manager, "processes", []) if manager is not None else []
        return [p.pid for p in procs if p.pid is not None]

    @property
    def block_size(self) -> int:
        """Tokens per KV-cache block (the prefix cache's unit)."""
        return int(self._llm.vllm_config.cache_config.block_size)

    async def drafter_skips(self) -> int:
        """Engine steps so far in which the drafter was skipped (all requests k = 0)."""
        counts = await self._llm.collective_rpc("specgw_draft_skips")
        return int(sum(counts))

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ready = False
        self.outcome_tap.close()
        await self._stop_output_handler()
        await asyncio.to_thread(self._llm.shutdown)

    async def _stop_output_handler(self) -> None:
        """Cancel AsyncLLM's output handler, on this loop, before the core is stopped.

        vLLM 0.32's `AsyncLLM.shutdown` stops the engine core first and cancels the
        handler last; stopping the core cancels `AsyncMPClient`'s socket reader, which
        answers by queueing an `EngineDeadError` (`core_client.process_outputs_socket`),
        and a handler still reading logs it at ERROR ("AsyncLLM output_handler failed.")
        on every clean shutdown (vllm-project/vllm#48745). A handler already done has
        failed for real, and logged it, while serving. Any stream still waiting gets
        what the handler would have given it on the way out: `EngineDeadError`.
        """
        handler = self._llm.output_handler
        if handler is None or handler.done():
            return
        handler.cancel()
        await asyncio.wait([handler])
        self._llm.output_processor.propagate_error(VLLMEngineDeadError())

    @property
    def activity(self) -> EngineActivity:
        return self._activity

    def on_step(self, listener: StepListener | None) -> None:
        self._activity.on_step(listener)


class OutcomeTapClient:
    """An `EngineClient` for vLLM's serving classes: the AsyncLLM plus an outcome tap.

    Everything is forwarded to the AsyncLLM; `generate` passes the stream through
    unchanged and, when a request that carries `extra_args[GATEWAY_ID_ARG]`
    finishes, builds its `RequestOutcome` and resolves it in the engine's
    `outcome_tap` *before* yielding the final output, so the gateway has it when vLLM
    renders the end; a stream that ends any other way (an error, an abort without a
    final output, the consumer closing it) resolves it None.
    """

    def __init__(self, llm: AsyncLLM, engine: VLLMEngine) -> None:
        self._llm = llm
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    @property
    def outcome_tap(self) -> OutcomeTap:
        """Where it resolves each gateway request's outcome (the engine's)."""
        return self._engine.outcome_tap

    async def generate(
        self, prompt: Any, sampling_params: SamplingParams, request_id: str, **kwargs: Any
    ) -> AsyncIterator[Any]:
        extra = sampling_params.extra_args or {}
        gateway_id = extra.get(GATEWAY_ID_ARG)
        tap = gateway_id is not None and sampling_params.n == 1
        k = _clamp(extra.get(SPEC_DEPTH_ARG), self._engine.max_depth)
        delta = sampling_params.output_kind == RequestOutputKind.DELTA
        n_out = 0
        activity = self._engine.activity
        outcomes = self._engine.outcome_tap
        try:
            with activity.track():
                stream = self._llm.generate(prompt, sampling_params, request_id, **kwargs)
                async with aclosing(stream):  # closed early: vLLM aborts it at once
                    async for output in stream:
                        activity.progress()
                        if output.outputs:
                            count = len(output.outputs[0].token_ids)
                            n_out = n_out + count if delta else count
                        if tap and output.finished:
                            outcome = request_outcome(
                                str(gateway_id), output, k=k, output_tokens=n_out
                            )
                            outcomes.resolve(str(gateway_id), outcome)
                        yield output
        finally:
            if gateway_id is not None:
                outcomes.resolve(str(gateway_id), None)  # no outcome came: None


def _clamp(value: Any, max_depth: int) -> int:
    try:
        k = int(value) if value is not None else max_depth
    except (TypeError, ValueError):
        k = max_depth
    return max(0, min(k, max_depth))


def new_request_id() -> str:
    return f"specgw-{uuid.uuid4().hex}"


__all__ = ["OutcomeTapClient", "VLLMEngine", "engine_args", "new_request_id"]
