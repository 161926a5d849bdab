"""vLLM 0.33's engine client with its engine core stood in: it "generates" a scripted reply.

`ScriptedEngineClient` is wired as `AsyncLLM` wires itself (`vllm/v1/engine/async_llm.py`):
vLLM's renderer (`renderer_from_config`: the tokenizer and the model's chat template),
its `InputProcessor` (the checks and defaults `AsyncLLM.add_request` applies to every
request) and its `OutputProcessor` (detokenisation, stop strings, the `RequestOutput`s
the serving classes read). Only the engine core is not there: where a GPU would run the
model, it emits the token ids of the next scripted reply (`replies`, else `DEFAULT_REPLY`),
one per step and then `<|eot_id|>` (the reply repeats past it), and stops as the
scheduler's `check_stop` does (the request's eos or a stop token: `stop`; `max_tokens`
reached: `length`).

`ScriptedCoreBackend` is the gateway's vLLM backend (`engine.vllm.backend`) with that
client in place of `AsyncLLM`: the engine arguments and config are the production ones
(`checked_engine_args` under the current platform), the engine is `VLLMEngine`, and the
serving port is the vLLM backend's own `OpenAIFrontend`. The worker RPCs a real start makes
(the expand-kernel check, the depth-0 parameters, the drafter skip) are not run: no worker
exists; tests/cuda/test_runner_hooks.py and test_depth_zero_params.py check them on
Model Runner V2's classes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from vllm.renderers import renderer_from_config
from vllm.renderers.inputs.preprocess import extract_prompt_components
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

from engine.vllm.backend import VLLMBackend
from engine.vllm.engine import VLLMEngine
from engine.vllm.engine_args import checked_engine_args
from engine.vllm.stats import EngineActivity

#: What the engine core reports a generating model supports.
TASKS = ("generate",)
DEFAULT_REPLY = "Sure."
#: A request still running after this many steps is a bug of the script, not a long reply.
MAX_STEPS = 100_000
END_OF_TURN = "<|eot_id|>"


class ScriptedEngineClient:
    """What vLLM's `init_app_state` and serving classes use of an `EngineClient`."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.observability_config = vllm_config.observability_config
        self.renderer = renderer_from_config(vllm_config)
        self.input_processor = InputProcessor(vllm_config, self.renderer)
        self.output_processor = OutputProcessor(
            self.renderer.tokenizer,
            log_stats=True,
            stream_interval=vllm_config.scheduler_config.stream_interval,
        )
        #: Replies to give, oldest first (text; the end-of-turn token is added).
        self.replies: deque[str] = deque()
        #: Every request that reached the engine core, as `InputProcessor` built it.
        self.requests: list[EngineCoreRequest] = []
        self.aborted: list[str] = []
        self.output_handler: asyncio.Task[None] | None = None
        self._dead = False

    @property
    def tokenizer(self) -> Any:
        return self.renderer.tokenizer

    def get_tokenizer(self) -> Any:
        return self.renderer.get_tokenizer()

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return TASKS

    @property
    def is_running(self) -> bool:
        return not self._dead

    @property
    def is_stopped(self) -> bool:
        return self._dead

    @property
    def errored(self) -> bool:
        return self._dead

    @property
    def dead_error(self) -> BaseException:
        return EngineDeadError()

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        pass

    async def is_tracing_enabled(self) -> bool:
        return self.observability_config.otlp_traces_endpoint is not None

    async def do_log_stats(self) -> None:
        pass

    async def check_health(self) -> None:
        if self._dead:
            raise self.dead_error

    async def is_sleeping(self) -> bool:
        return False

    async def reset_prefix_cache(self, *_: Any, **__: Any) -> bool:
        return True

    async def abort(self, request_id: str | Iterable[str], internal: bool = False) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.aborted.extend(ids)
        self.output_processor.abort_requests(ids, internal)

    def shutdown(self) -> None:
        self._dead = True

    async def _engine_request(
        self, prompt: Any, params: Any, request_id: str, kwargs: dict[str, Any]
    ) -> tuple[EngineCoreRequest, str | None]:
        """`AsyncLLM.add_request` for one prompt (n = 1), up to the engine core: the
        request and the prompt's text."""
        options = {
            "supported_tasks": TASKS,
            "lora_request": kwargs.get("lora_request"),
            "tokenization_kwargs": kwargs.get("tokenization_kwargs"),
            "trace_headers": kwargs.get("trace_headers"),
            "priority": kwargs.get("priority", 0),
        }
        process = self.input_processor
        if isinstance(prompt, dict) and "type" in prompt:  # rendered by vLLM's renderer
            rendered: Any = prompt
            request = process.process_inputs(request_id, rendered, params, **options)
        else:
            request = await process.process_inputs_async(request_id, prompt, params, **options)
        prompt_text = kwargs.get("prompt_text")
        if prompt_text is None:
            prompt_text, _, _ = extract_prompt_components(self.model_config, prompt)
        process.assign_request_id(request)
        return request, prompt_text

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any
    ) -> AsyncIterator[Any]:
        if self._dead:
            raise EngineDeadError()
        request, text = await self._engine_request(prompt, sampling_params, request_id, kwargs)
        params = request.sampling_params
        assert params is not None
        assert params.n == 1, "the scripted core runs n = 1"
        queue = RequestOutputCollector(params.output_kind, request.request_id)
        self.output_processor.add_request(request, text, None, 0, queue)
        self.requests.append(request)
        reply = self.replies.popleft() if self.replies else DEFAULT_REPLY
        text_ids = self.tokenizer.encode(reply, add_special_tokens=False)
        end = self.tokenizer.convert_tokens_to_ids(END_OF_TURN)
        # Past its end the reply repeats: a request that ignores eos runs to max_tokens.
        tokens = itertools.chain(text_ids, [end], itertools.cycle(text_ids))
        for step, token in enumerate(itertools.islice(tokens, MAX_STEPS), start=1):
            finish, stop_reason = _check_stop(token, step, params)
            output = EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[token],
                finish_reason=finish,
                stop_reason=stop_reason,
            )
            self.output_processor.process_outputs([output], time.monotonic(), None)
            out = queue.get_nowait()
            if out is not None:
                yield out
                if out.finished:
                    return
            await asyncio.sleep(0)  # a step boundary: other requests' streams run
        raise AssertionError(f"{request_id}: no stop in {MAX_STEPS} steps")


def _check_stop(token: int, step: int, params: Any) -> tuple[FinishReason | None, int | None]:
    """The scheduler's `check_stop` for one new token (no min_tokens, no repetition)."""
    if token == params.eos_token_id:
        return FinishReason.STOP, None
    if token in (params.stop_token_ids or ()):
        return FinishReason.STOP, token
    if params.max_tokens is not None and step >= params.max_tokens:
        return FinishReason.LENGTH, None
    return None, None


class ScriptedCoreBackend(VLLMBackend):
    """The vLLM backend on `ScriptedEngineClient` (the serving port is the backend's)."""

    def start_engine(self, engine_settings: Any) -> AbstractAsyncContextManager[Any]:
        @asynccontextmanager
        async def started() -> AsyncIterator[VLLMEngine]:
            args = checked_engine_args(engine_settings)
            client = ScriptedEngineClient(args.create_engine_config())
            k_max = engine_settings.max_depth if args.speculative_config else 0
            engine = VLLMEngine(client, engine_settings, EngineActivity(), k_max)  # type: ignore[arg-type]
            engine._ready = True
            try:
                yield engine
            finally:
                await engine.shutdown()

        return started()


BACKEND = ScriptedCoreBackend()
