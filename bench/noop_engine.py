"""The gateway on a no-op engine: everything real except the engine step.

`NoopLLM` stands in for vLLM's `AsyncLLM` behind the gateway: every attribute
(model config, renderer, tokenizer, input processing) is the real engine's, so
vLLM's OpenAI serving layer does its full work (chat template, tokenisation,
tool parsing, SSE rendering) and the outcome tap, planner and admission run as
in production; only `generate` answers at once with `max_tokens` copies of one
token instead of running the model. What is left to time is the gateway's own
cost, which is what its ceiling in requests/s per core measures.

Run as a process: `python -m bench.noop_engine --port P --direct-out FILE`; before
serving it times the same requests in-process, twice: straight into the (no-op)
engine client (token ids in, the added-latency baseline), and through vLLM's
OpenAI serving layer on that client (request JSON in, SSE lines out: what
`vllm serve` does for the request minus HTTP), and writes both to FILE as
`{"engine": [...], "serving": [...]}` seconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from engine.interface import GATEWAY_ID_ARG, SPEC_DEPTH_ARG

#: The request the overhead benchmark sends (chat, streamed, 16 tokens).
OVERHEAD_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain sorting a list of tuples in Python."},
]
OVERHEAD_MAX_TOKENS = 16


def overhead_body(model: str) -> dict[str, Any]:
    """The overhead benchmark's request body, as every client and path sends it."""
    return {
        "model": model,
        "messages": OVERHEAD_MESSAGES,
        "max_tokens": OVERHEAD_MAX_TOKENS,
        "stream": True,
    }


OnReady = Callable[[Any, Any], Awaitable[None]]


class NoopLLM:
    """A real AsyncLLM whose `generate` skips the model and answers at once."""

    def __init__(self, llm: Any, token_id: int, piece: str) -> None:
        self._llm = llm
        self._token_id = token_id
        self._piece = piece

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **_: Any
    ) -> AsyncIterator[Any]:
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import RequestOutputKind

        n = int(sampling_params.max_tokens or OVERHEAD_MAX_TOKENS)
        kind = sampling_params.output_kind
        prompt_ids = _prompt_ids(prompt)
        for i in range(n):
            last = i == n - 1
            if kind == RequestOutputKind.FINAL_ONLY and not last:
                continue
            count = 1 if kind == RequestOutputKind.DELTA else i + 1
            out = CompletionOutput(
                index=0,
                text=self._piece * count,
                token_ids=[self._token_id] * count,
                cumulative_logprob=None,
                logprobs=None,
                finish_reason="length" if last else None,
            )
            yield RequestOutput(request_id, None, prompt_ids, None, [out], last)
            await asyncio.sleep(0)


def _prompt_ids(prompt: Any) -> list[int]:
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
    ids = ids if ids is not None else getattr(prompt, "prompt_token_ids", None)
    return list(ids or [])


@asynccontextmanager
async def noop_engine(engine_settings: Any, on_ready: OnReady | None) -> AsyncIterator[Any]:
    """A started `VLLMEngine` whose `serving_client` is the outcome tap on `NoopLLM`."""
    from engine.vllm.engine import OutcomeTapClient, VLLMEngine

    async with VLLMEngine.started(engine_settings) as engine:
        tokenizer = engine.llm.get_tokenizer()
        if asyncio.iscoroutine(tokenizer):
            tokenizer = await tokenizer
        token_id = int(tokenizer.encode(" the", add_special_tokens=False)[0])
        noop_llm = NoopLLM(engine.llm, token_id, tokenizer.decode([token_id]))
        engine.serving_client = OutcomeTapClient(noop_llm, engine)  # type: ignore[arg-type]
        if on_ready is not None:
            await on_ready(engine.serving_client, tokenizer)
        yield engine


def noop_runtime_factory(
    engine_settings: Any, on_ready: OnReady | None = None
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """`gateway.runtime.runtime_factory` on `noop_engine`.

    The control plane (flags, controller, metrics, admission) is the production one,
    built by the same function the real factory calls.
    """
    from engine.backend import PortConfig
    from engine.vllm.backend import BACKEND
    from gateway.control.settings import ControllerSettings
    from gateway.runtime import _control_plane
    from gateway.supervisor import EngineSlot

    @asynccontextmanager
    async def factory(settings: Any) -> AsyncIterator[Any]:
        target, _ = engine_settings.resolved_models()
        slot = EngineSlot(
            lambda: noop_engine(engine_settings, on_ready),
            lambda engine: BACKEND.serving_port(
                engine, PortConfig(model=str(target), served_model_name=settings.served_names[0])
            ),
        )
        async with AsyncExitStack() as stack:
            await slot.start()
            stack.push_async_callback(slot.close)
            runtime = await _control_plane(stack, settings, ControllerSettings(), slot)
            try:
                yield runtime
            finally:
                await runtime.begin_drain()

    return factory


async def time_direct(noop: Any, tokenizer: Any, n: int) -> list[float]:
    """Seconds per request straight into the engine client, same prompt and length."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    text = tokenizer.apply_chat_template(
        OVERHEAD_MESSAGES, tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    out: list[float] = []
    for i in range(n):
        params = SamplingParams(
            max_tokens=OVERHEAD_MAX_TOKENS,
            output_kind=RequestOutputKind.DELTA,
            extra_args={SPEC_DEPTH_ARG: 0, GATEWAY_ID_ARG: f"direct-{i}"},
        )
        t0 = time.perf_counter()
        async for _ in noop.generate({"prompt_token_ids": ids}, params, f"direct-{i}"):
            pass
        out.append(time.perf_counter() - t0)
    return out


async def time_serving(noop: Any, model: str, served_name: str, n: int) -> list[float]:
    """Seconds per request through vLLM's OpenAI chat serving, in-process, to `[DONE]`.

    The request is parsed from the same JSON body the HTTP client sends; every
    SSE line is produced and read, as the gateway's relay does.
    """
    from engine.protocol import ChatCompletionRequest
    from engine.vllm.openai_frontend import FrontendConfig, OpenAIFrontend

    config = FrontendConfig(model, served_name)
    frontend = await OpenAIFrontend.create(noop, config, outcomes=noop.outcome_tap)
    body = json.dumps(overhead_body(served_name))
    out: list[float] = []
    for i in range(n + 20):  # the first 20: warm-up (first renders, caches)
        t0 = time.perf_counter()
        request = ChatCompletionRequest.model_validate_json(body)
        stream = (await frontend.chat(request, k=0, gateway_id=f"serving-{i}")).reply
        if not hasattr(stream, "__aiter__"):
            raise RuntimeError(f"serving layer answered without a stream: {stream!r}")
        async for _ in stream:
            pass
        if i >= 20:
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    import uvicorn

    from engine.settings import EngineSettings
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--direct-out", type=Path, required=True)
    parser.add_argument("--direct-n", type=int, default=500)
    args = parser.parse_args()

    settings = GatewaySettings(host="127.0.0.1", port=args.port, log_level="warning")

    async def on_ready(noop: Any, tokenizer: Any) -> None:
        engine = await time_direct(noop, tokenizer, args.direct_n)
        serving = await time_serving(noop, str(args.model), settings.served_names[0], args.direct_n)
        args.direct_out.write_text(json.dumps({"engine": engine, "serving": serving}))

    engine_settings = EngineSettings(model=args.model, max_depth=0)
    app = create_app(settings, noop_runtime_factory(engine_settings, on_ready))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
