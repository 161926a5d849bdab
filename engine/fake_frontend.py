"""`FakeFrontend`: the serving port (`engine.port.ServingPort`) on the scripted `FakeEngine`.

Real code, not a mock: it answers OpenAI chat and completion requests with vLLM's
own wire models, in vLLM's SSE framing (`engine.fake_wire`), from what
`FakeEngine` generates (tokens a deterministic function of the prompt, acceptance
scripted per prompt marker), with vLLM's per-request `metrics.speculative_decoding`
block on a reply and on a stream's usage chunk, as vLLM's serving writes it. The
gateway's id, k and cap reach the engine as vLLM's do (`GenerateRequest.k`, `extra`
keyed like `vllm_xargs`), and each answer comes `Served` with its outcome, which the
engine resolves in its tap (`engine.outcomes`). It lets the whole gateway serve `/v1`
in process, with no vLLM engine: the unit test tier and `spec-gateway serve --backend
fake`.

What differs from vLLM, on purpose: the chat template is `role: text` lines
(`fake_wire.chat_prompt`), a token is a whitespace-separated word, and a request
without `max_tokens` gets `default_max_tokens` (vLLM: the rest of the context; the
fake model has no end-of-sequence token to stop on). Refused like vLLM: a model it
does not serve (an `ErrorResponse`, 404), a prompt or `max_tokens` over the
context, and `min_p` or `logit_bias` on a request that drafts (k > 0 on an engine with
a drafter; `InvalidRequestError`, vLLM's `VLLMValidationError`). The fake accepts both
parameters and ignores them: its tokens are a function of the prompt.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from engine.depth_zero import VLLM_REFUSAL, refused_with_drafts
from engine.fake import FakeEngine
from engine.fake_responses import FakeResponse, responses_prompt
from engine.fake_wire import (
    DONE,
    chat_prompt,
    forced_tool_call,
    named_choice,
    not_found,
    sse,
    usage,
)
from engine.interface import (
    GATEWAY_ID_ARG,
    SPEC_CAP_ARG,
    SPEC_DEPTH_ARG,
    GenerateRequest,
    InvalidRequestError,
    RequestOutcome,
)
from engine.outcomes import OutcomeTap, served
from engine.port import ChatResult, CompletionResult, ResponsesResult, SampledRequest, Sampling
from engine.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ModelCard,
    ModelList,
    PerRequestMetrics,
    ResponsesRequest,
    SpeculativeDecodingMetrics,
    ToolCall,
)
from engine.spec_decode_report import speculative_decoding
from engine.step_rule import StepArgs


@dataclass(frozen=True, slots=True)
class FakeFrontendConfig:
    """What the fake serving layer needs beyond its engine."""

    served_model_name: str = "specgw-default"
    #: Further names the model answers to, listed after it (as vLLM lists them).
    served_aliases: tuple[str, ...] = ()
    #: The temperature of a request that sets none (vLLM: the model's generation
    #: config, else 1.0; the embedded model's sets none).
    default_temperature: float = 1.0
    #: `max_tokens` of a request that sets none.
    default_max_tokens: int = 16
    #: The min_p of a request that sets none (vLLM: the model's generation config).
    default_min_p: float = 0.0


@dataclass(slots=True)
class _Run:
    """A finished engine request, collected."""

    text: str
    tokens: int
    finish: str | None
    outcome: RequestOutcome | None = None


def _metrics(outcome: RequestOutcome | None) -> PerRequestMetrics | None:
    """vLLM's per-request `metrics`: its `speculative_decoding` block, on an engine with
    a drafter (vLLM's serving writes it from the same counts, `engine.spec_decode_report`)."""
    block = speculative_decoding(outcome.speculation) if outcome is not None else None
    if block is None:
        return None
    return PerRequestMetrics(speculative_decoding=SpeculativeDecodingMetrics(**block))


def _is_stream_request(request: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(request.stream)


def _include_usage(request: ChatCompletionRequest | CompletionRequest) -> bool:
    return bool(request.stream_options and request.stream_options.include_usage)


class FakeFrontend:
    """Serves one `FakeEngine` through the serving port; see the module docstring."""

    def __init__(self, engine: FakeEngine, config: FakeFrontendConfig | None = None) -> None:
        self._engine = engine
        self._config = config or FakeFrontendConfig()
        #: Where each answer's outcome comes from (`engine.outcomes.served`).
        self.outcomes: OutcomeTap = engine.outcome_tap

    @property
    def served_model_name(self) -> str:
        return self._config.served_model_name

    @property
    def harmony_messages(self) -> bool:
        """The fake model is no gpt-oss: harmony messages are refused up front."""
        return False

    @property
    def max_model_len(self) -> int:
        """Longest prompt + completion, in the fake's tokens."""
        return self._engine.config.max_prompt_tokens

    def sampling_of(self, request: SampledRequest) -> Sampling:
        config = self._config
        temperature = request.temperature
        return Sampling(
            config.default_temperature if temperature is None else float(temperature),
            config.default_min_p if request.min_p is None else float(request.min_p),
            self._engine.lossless_sampling,
        )

    @staticmethod
    def _tokens(text: str) -> int:
        """The fake's tokens are words (`FakeEngine` counts a prompt the same way)."""
        return len(text.split())

    async def check_model(self, request: SampledRequest) -> None:
        names = (self.served_model_name, *self._config.served_aliases)
        if request.model and request.model not in names:
            raise not_found(request.model, self.served_model_name)

    async def models(self) -> ModelList:
        root = self.served_model_name
        names = (root, *self._config.served_aliases)
        cards = [ModelCard(id=name, root=root, max_model_len=self.max_model_len) for name in names]
        return ModelList(data=cards)

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
        await self.check_model(request)
        prompt = chat_prompt(request)
        asked = request.max_completion_tokens or request.max_tokens
        job = self._job(f"chatcmpl-{gateway_id}", prompt, request, asked, k, gateway_id, cap, step)
        call = forced_tool_call(request, gateway_id)
        if _is_stream_request(request):
            return self._chat_stream(request, job, call)
        run = await self._run(job)
        if call is not None and run.finish != "abort":
            message = ChatMessage(role="assistant", content="", tool_calls=[call])
        else:
            message = ChatMessage(role="assistant", content=run.text)
        choice = ChatCompletionResponseChoice(
            index=0, message=message, finish_reason=self._finish(request, call, run.finish)
        )
        return ChatCompletionResponse(
            id=job.request_id,
            model=self.served_model_name,
            choices=[choice],
            usage=usage(self._tokens(prompt), run.tokens),
            metrics=_metrics(run.outcome),
        )

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
        await self.check_model(request)
        prompt = self._completion_prompt(request)
        # vLLM runs prompt i of a completion as engine request `cmpl-<id>-<i>`.
        job = self._job(
            f"cmpl-{gateway_id}-0", prompt, request, request.max_tokens, k, gateway_id, cap, step
        )
        if _is_stream_request(request):
            return self._completion_stream(request, job)
        run = await self._run(job)
        choice = CompletionResponseChoice(index=0, text=run.text, finish_reason=run.finish)
        return CompletionResponse(
            id=f"cmpl-{gateway_id}",
            model=self.served_model_name,
            choices=[choice],
            usage=usage(self._tokens(prompt), run.tokens),
            metrics=_metrics(run.outcome),
        )

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
        """vLLM's Responses answer (`engine.fake_responses`), under `resp_<gateway id>`."""
        await self.check_model(request)
        request.request_id = f"resp_{gateway_id}"
        prompt = responses_prompt(request)
        asked = request.max_output_tokens
        job = self._job(f"resp_{gateway_id}_0", prompt, request, asked, k, gateway_id, cap, step)
        answer = FakeResponse(request, self.served_model_name, job)
        if request.stream:
            return answer.stream(self._engine.generate(job))
        run = await self._run(job)
        return answer.reply(run.text, run.tokens, run.finish)

    @staticmethod
    def _completion_prompt(request: CompletionRequest) -> str:
        """One prompt: a string, one string in a list, or token ids (as words)."""
        prompt = request.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return " ".join(str(t) for t in prompt)
        raise InvalidRequestError("the fake backend takes exactly one prompt", "prompt")

    def _job(
        self,
        engine_id: str,
        prompt: str,
        request: SampledRequest,
        asked: int | None,
        k: int,
        gateway_id: str,
        cap: int | None,
        step: StepArgs | None,
    ) -> GenerateRequest:
        """The engine request, after vLLM's length checks (`vllm.renderers.params`)."""
        prompt_tokens = self._tokens(prompt)
        context = self.max_model_len
        if prompt_tokens > context:
            raise InvalidRequestError(
                f"This model's maximum context length is {context} tokens. However, your "
                f"prompt contains {prompt_tokens} input tokens. Please reduce the length of "
                "the input prompt.",
                "input_tokens",
            )
        if asked is not None and prompt_tokens + asked > context:
            raise InvalidRequestError(
                f"'max_tokens' is too large: {asked}. This model's maximum context length is "
                f"{context} tokens and your request has {prompt_tokens} input tokens.",
                "max_tokens",
            )
        # vLLM's own check with a drafter (`engine.vllm.depth_zero_params`): k = 0 alone may.
        drafts = k > 0 and self._engine.max_depth > 0
        if drafts and refused_with_drafts(request.logit_bias, self.sampling_of(request).min_p):
            raise InvalidRequestError(VLLM_REFUSAL)
        max_tokens = asked if asked is not None else self._config.default_max_tokens
        max_tokens = min(max_tokens, context - prompt_tokens)
        if max_tokens < 1:
            raise InvalidRequestError("the prompt leaves no room for output tokens", "max_tokens")
        extra: dict[str, object] = {SPEC_DEPTH_ARG: k, GATEWAY_ID_ARG: gateway_id}
        if cap is not None:
            extra[SPEC_CAP_ARG] = cap
        if step is not None:  # the fake engine runs each request at its own k
            extra.update(step.extra_args())
        return GenerateRequest(
            request_id=engine_id,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=self.sampling_of(request).temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            seed=request.seed,
            ignore_eos=request.ignore_eos,
            k=k,
            extra=extra,
        )

    async def _run(self, job: GenerateRequest) -> _Run:
        """The whole engine request (its outcome resolved in the engine's tap on the way)."""
        parts: list[str] = []
        tokens = 0
        finish: str | None = None
        outcome: RequestOutcome | None = None
        async with aclosing(self._engine.generate(job)) as chunks:
            async for chunk in chunks:
                parts.append(chunk.text_delta)
                tokens += len(chunk.token_ids_delta)
                finish = chunk.finish_reason if chunk.finished else finish
                outcome = chunk.outcome or outcome
        return _Run("".join(parts), tokens, finish, outcome)

    @staticmethod
    def _finish(request: ChatCompletionRequest, call: ToolCall | None, finish: str | None) -> str:
        """vLLM's rule: a forced call ends `tool_calls` ("required") or `stop` (named)."""
        if call is None or finish == "abort":
            return finish or "stop"
        return "stop" if named_choice(request) else "tool_calls"

    async def _chat_stream(
        self, request: ChatCompletionRequest, job: GenerateRequest, call: ToolCall | None
    ) -> AsyncIterator[str]:
        created = int(time.time())

        def line(delta: DeltaMessage, finish: str | None = None) -> str:
            choice = ChatCompletionResponseStreamChoice(
                index=0, delta=delta, logprobs=None, finish_reason=finish
            )
            chunk = ChatCompletionStreamResponse(
                id=job.request_id,
                object="chat.completion.chunk",
                created=created,
                model=self.served_model_name,
                choices=[choice],
            )
            return sse(chunk.model_dump_json(exclude_unset=True))

        tokens = 0
        outcome: RequestOutcome | None = None
        async with aclosing(self._engine.generate(job)) as chunks:
            async for chunk in chunks:
                outcome = chunk.outcome or outcome
                if tokens == 0:  # vLLM's first chunk: the role, before any text
                    yield line(DeltaMessage(role="assistant", content=""))
                tokens += len(chunk.token_ids_delta)
                text = "" if call is not None else chunk.text_delta
                if not chunk.finished:
                    yield line(DeltaMessage(content=text))
                    continue
                if call is not None and chunk.finish_reason != "abort":
                    yield line(DeltaMessage(tool_calls=[_tool_delta(call)]))
                finish = self._finish(request, call, chunk.finish_reason)
                yield line(DeltaMessage(content=text), finish)
        if _include_usage(request):
            last = ChatCompletionStreamResponse(
                id=job.request_id,
                object="chat.completion.chunk",
                created=created,
                model=self.served_model_name,
                choices=[],
                usage=usage(self._tokens(job.prompt or ""), tokens),
                metrics=_metrics(outcome),
            )
            yield sse(last.model_dump_json(exclude_unset=True, exclude_none=True))
        yield DONE

    async def _completion_stream(
        self, request: CompletionRequest, job: GenerateRequest
    ) -> AsyncIterator[str]:
        created = int(time.time())
        reply_id = job.request_id.removesuffix("-0")
        tokens = 0
        outcome: RequestOutcome | None = None
        async with aclosing(self._engine.generate(job)) as chunks:
            async for chunk in chunks:
                outcome = chunk.outcome or outcome
                tokens += len(chunk.token_ids_delta)
                finish = chunk.finish_reason if chunk.finished else None
                choice = CompletionResponseStreamChoice(
                    index=0, text=chunk.text_delta, logprobs=None, finish_reason=finish
                )
                reply = CompletionStreamResponse(
                    id=reply_id,
                    object="text_completion",
                    created=created,
                    model=self.served_model_name,
                    choices=[choice],
                )
                yield sse(reply.model_dump_json(exclude_unset=True))
        if _include_usage(request):
            last = CompletionStreamResponse(
                id=reply_id,
                created=created,
                model=self.served_model_name,
                choices=[],
                usage=usage(self._tokens(job.prompt or ""), tokens),
                metrics=_metrics(outcome),
            )
            yield sse(last.model_dump_json(exclude_none=True))
        yield DONE


def _tool_delta(call: ToolCall) -> DeltaToolCall:
    """The whole call in one delta (vLLM streams the arguments in pieces; a client
    joins them either way)."""
    function = DeltaFunctionCall(name=call.function.name, arguments=call.function.arguments)
    return DeltaToolCall(id=call.id, type="function", index=0, function=function)
