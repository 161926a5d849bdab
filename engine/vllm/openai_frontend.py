"""vLLM's own OpenAI serving layer bound to the embedded engine.

Chat templating, tool-call parsing (hermes for the embedded model), structured
output, logprobs and the SSE chunk format all come from
`vllm.entrypoints.openai` (`OpenAIServingChat`, `OpenAIServingCompletion`,
`OpenAIServingResponses`, `OpenAIServingModels`, built by vLLM's `init_app_state`
exactly as `vllm serve` builds them). What this module adds is the control plane's
one input: each request's speculation depth k and the gateway's request id, carried
to the scheduler and the outcome tap in `SamplingParams.extra_args` (via `vllm_xargs`),
and each answer `Served` with the outcome that tap resolves (`engine.outcomes`);
and one guard: chat input is tokenized as text (`engine.vllm.control_tokens`). Where vLLM
traces (its `otlp_traces_endpoint` engine argument is set), the current span's W3C trace
context goes with each request, so vLLM's `llm_request` span joins the gateway's trace.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.datastructures import State

from engine.interface import GATEWAY_ID_ARG, SPEC_CAP_ARG, SPEC_DEPTH_ARG, InvalidRequestError
from engine.outcomes import OutcomeTap, served
from engine.port import (
    RESERVED_XARGS,
    ChatResult,
    CompletionResult,
    ResponsesResult,
    SampledRequest,
    Sampling,
)
from engine.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    ModelList,
    ResponsesRequest,
    ResponsesResponse,
)
from engine.step_rule import StepArgs
from engine.vllm.control_tokens import ControlTokenGuard, guard_chat_template
from engine.vllm.errors import framed_events, raising, refused

__all__ = [
    "RESERVED_XARGS",
    "ChatResult",
    "CompletionResult",
    "FrontendConfig",
    "OpenAIFrontend",
]


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """What vLLM's serving layer needs beyond the engine's own config."""

    model: str
    served_model_name: str
    #: Further names the model answers to (vLLM's `--served-model-name a b`: the first
    #: is the one answers report).
    served_aliases: tuple[str, ...] = ()
    #: Resolved by `engine.vllm.parsers` from the settings and the model.
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = None
    #: `/v1/completions` prompts are raw by design (a client may write the template's
    #: markers on purpose); True reads their control-token strings as text too.
    split_completion_prompts: bool = False


@contextmanager
def _client_errors() -> Iterator[None]:
    """vLLM signals a bad request (context too long, max_tokens too large) by raising
    `VLLMClientError`s and, in places, plain `ValueError`s; `vllm serve` maps both to
    400 in its exception handlers, and so does the gateway, through this one type."""
    from vllm.exceptions import VLLMClientError, VLLMValidationError

    try:
        yield
    except VLLMValidationError as exc:
        message = str(exc.args[0]) if exc.args else str(exc)
        raise InvalidRequestError(message, exc.parameter) from exc
    except (VLLMClientError, ValueError) as exc:
        raise InvalidRequestError(str(exc)) from exc


class _TraceCarrier:
    """The one part of an HTTP request vLLM's serving layer reads trace context from.

    `create_chat_completion(request, raw_request)` reads `traceparent` / `tracestate` from
    the request's headers (`BaseServing._get_trace_headers`) and passes them on to
    `AsyncLLM.generate(trace_headers=...)`; it also reads `X-Request-Id`, priority,
    session and data-parallel rank headers, and sets `state.request_metadata`. This
    carrier holds the trace headers alone, so the gateway's request id stays the one used.
    """

    __slots__ = ("headers", "state")

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers
        self.state = State()


async def _client_faults(events: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """vLLM's event generator, its client errors raised as `InvalidRequestError`."""
    with _client_errors():
        async for event in events:
            yield event


def _answer(result: Any) -> Any:
    """vLLM's reply as the port's: an answer, or a stream whose error line is raised; an
    `ErrorResponse` raised as an engine error (`engine.vllm.errors`)."""
    if isinstance(result, ErrorResponse):
        raise refused(result)
    if hasattr(result, "__aiter__"):
        return raising(result)
    return result


def _trace_carrier() -> Any:
    """A carrier of the current span's trace context, or None outside a valid span."""
    headers: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(headers)
    return _TraceCarrier(headers) if headers else None


class OpenAIFrontend:
    """Runs one OpenAI request through vLLM's serving classes at a given depth.

    The vLLM implementation of `engine.port.ServingPort`.
    """

    def __init__(
        self,
        state: State,
        served_model_name: str,
        *,
        lossless_sampling: bool = True,
        prompt_guard: ControlTokenGuard | None = None,
        outcomes: OutcomeTap | None = None,
    ) -> None:
        self._state = state
        self.served_model_name = served_model_name
        #: The engine's tap (`VLLMEngine.outcome_tap`), where each answer's outcome is
        #: resolved; without one (no engine client that taps), outcomes resolve never.
        self.outcomes = outcomes if outcomes is not None else OutcomeTap()
        self._lossless_sampling = lossless_sampling
        #: Set: completion prompts holding control-token strings are encoded as text.
        self._prompt_guard = prompt_guard

    @classmethod
    async def create(
        cls,
        engine_client: Any,
        config: FrontendConfig,
        *,
        lossless_sampling: bool = True,
        outcomes: OutcomeTap | None = None,
    ) -> OpenAIFrontend:
        """Build vLLM's serving objects on `engine_client` (an AsyncLLM or a proxy of one).

        `lossless_sampling` is the engine's (`Engine.lossless_sampling`); `outcomes` the
        tap `engine_client` resolves outcomes in (`VLLMEngine.serving_client` and
        `VLLMEngine.outcome_tap`).
        """
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        from engine.vllm.compat import make_arg_parser

        names = [config.served_model_name, *config.served_aliases]
        argv = ["--model", config.model, "--served-model-name", *names]
        # usage.prompt_tokens_details.cached_tokens, as OpenAI reports it.
        argv += ["--enable-prompt-tokens-details"]
        if config.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
        if config.reasoning_parser:
            argv += ["--reasoning-parser", config.reasoning_parser]
        if config.chat_template:
            argv += ["--chat-template", config.chat_template]
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)  # type: ignore[no-untyped-call]
        state = State()
        tasks = await engine_client.get_supported_tasks()
        await init_app_state(engine_client, state, args, tasks)
        # Client text is tokenized as text, never as the template's control tokens.
        guard = guard_chat_template(engine_client.renderer.tokenizer)
        return cls(
            state,
            config.served_model_name,
            lossless_sampling=lossless_sampling,
            prompt_guard=guard if config.split_completion_prompts else None,
            outcomes=outcomes,
        )

    def sampling_of(self, request: SampledRequest) -> Sampling:
        """How vLLM will sample this request: the request's temperature and min_p, else
        the model's generation-config defaults, else 1.0 (below vLLM's 1e-5: greedy) and
        0; `lossless` the engine's."""
        temperature, min_p = request.temperature, request.min_p
        if temperature is None or min_p is None:
            defaults = self._defaults(request)
            temperature = defaults.get("temperature", 1.0) if temperature is None else temperature
            min_p = defaults.get("min_p", 0.0) if min_p is None else min_p
        return Sampling(float(temperature), float(min_p), self._lossless_sampling)

    def _defaults(self, request: SampledRequest) -> Mapping[str, Any]:
        """The sampling defaults vLLM fills into a request that sets none: the model's
        generation config (`ModelConfig.get_diff_sampling_param`), as its serving keeps them."""
        defaults: Mapping[str, Any] = self._serving(request).default_sampling_params
        return defaults

    def _serving(self, request: SampledRequest) -> Any:
        """vLLM's serving object whose checks and defaults apply to the request: the
        completions one for a completion, the chat one otherwise (Responses included)."""
        state = self._state
        if isinstance(request, CompletionRequest):
            return state.openai_serving_completion
        return state.openai_serving_chat

    @property
    def engine_traces(self) -> bool:
        """Whether vLLM exports its own spans: without an `otlp_traces_endpoint` it drops
        the trace context a request brings (with a warning), so none is passed then."""
        config = getattr(self._state, "vllm_config", None)
        observability = getattr(config, "observability_config", None)
        return bool(getattr(observability, "otlp_traces_endpoint", None))

    @property
    def harmony_messages(self) -> bool:
        """Whether the model takes OpenAI-harmony messages (author/channel: gpt-oss only).

        vLLM's request model accepts them for every model, but only a harmony model's
        renderer reads them; for others the gateway refuses them up front.
        """
        model_type = self._state.openai_serving_chat.model_config.hf_config.model_type
        return bool(model_type == "gpt_oss")

    @staticmethod
    def _stamp(
        request: SampledRequest, k: int, gateway_id: str, cap: int | None, step: StepArgs | None
    ) -> None:
        xargs: dict[str, Any] = dict(request.vllm_xargs or {})
        xargs[SPEC_DEPTH_ARG] = k
        xargs[GATEWAY_ID_ARG] = gateway_id
        if cap is not None:
            xargs[SPEC_CAP_ARG] = cap
        if step is not None:
            xargs.update(step.extra_args())
        request.vllm_xargs = xargs
        request.request_id = gateway_id

    @served
    async def chat(
        self,
        request: ChatCompletionRequest,
        *,
        k: int,
        gateway_id: str,
        cap: int | None = None,
        step: StepArgs | None = None,
    ) -> ChatResult:
        """Run a chat request at depth k; `cap`: lower the requests in flight to it first."""
        self._stamp(request, k, gateway_id, cap, step)
        with _client_errors():
            result = await self._state.openai_serving_chat.create_chat_completion(
                request, _trace_carrier() if self.engine_traces else None
            )
        answer: ChatResult = _answer(result)
        return answer

    @served
    async def completion(
        self,
        request: CompletionRequest,
        *,
        k: int,
        gateway_id: str,
        cap: int | None = None,
        step: StepArgs | None = None,
    ) -> CompletionResult:
        self._stamp(request, k, gateway_id, cap, step)
        with _client_errors():
            self._split_prompt(request)
            serving = self._state.openai_serving_completion
            carrier = _trace_carrier() if self.engine_traces else None
            result = await serving.create_completion(request, carrier)
        answer: CompletionResult = _answer(result)
        return answer

    @served
    async def responses(
        self,
        request: ResponsesRequest,
        *,
        k: int,
        gateway_id: str,
        cap: int | None = None,
        step: StepArgs | None = None,
    ) -> ResponsesResult:
        """Run a Responses API request at depth k through vLLM's `OpenAIServingResponses`.

        k reaches the scheduler as for chat: `ResponsesRequest.to_sampling_params` passes
        `vllm_xargs` on as `SamplingParams.extra_args`. The answer's id is the request's
        (`resp_<gateway id>`); vLLM runs it as engine request `resp_<gateway id>_0`.
        """
        self._stamp(request, k, gateway_id, cap, step)
        request.request_id = f"resp_{gateway_id}"
        serving = self._state.openai_serving_responses
        with _client_errors():
            carrier = _trace_carrier() if self.engine_traces else None
            result = await serving.create_responses(request, carrier)
        if isinstance(result, ErrorResponse):
            raise refused(result)
        if isinstance(result, ResponsesResponse):
            return result
        return framed_events(_client_faults(result))

    def _split_prompt(self, request: CompletionRequest) -> None:
        """With `split_completion_prompts`: control-token strings in the prompt as text."""
        if self._prompt_guard is not None:
            ids = self._prompt_guard.completion_ids(request.prompt, request.add_special_tokens)
            if ids is not None:
                request.prompt = ids

    async def check_model(self, request: SampledRequest) -> None:
        """vLLM's own check (`OpenAIServing._check_model`: a served name, a loaded LoRA
        adapter, one the runtime LoRA resolver loads, or none), the one each answering
        method runs first."""
        error = await self._serving(request)._check_model(request)
        if error is not None:
            raise refused(error)

    async def models(self) -> ModelList:
        listed: ModelList = await self._state.openai_serving_models.show_available_models()
        return listed
