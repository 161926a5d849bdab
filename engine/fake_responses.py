"""The fake backend's Responses API answer, in vLLM's own models and events.

The prompt is the fake's chat template (`role: text` lines) over the request as
vLLM reads it (`engine.responses_wire.as_chat`). The answer is text, or, where the
request forces a call (`tool_choice` "required": the first function tool; a named
function: that one), one `function_call` item whose arguments are a placeholder of
the function's schema (`fake_wire.placeholder`), as the chat side forces them.
Events come from vLLM's `SimpleStreamingEventProcessor`, the one its non-harmony
Responses stream uses, numbered and framed as vLLM does; the stream ends with
`response.completed` carrying the whole answer, as vLLM's does.

Status follows vLLM's non-harmony rule: `incomplete` when the output stopped at
`max_output_tokens` (finish "length"), else `completed`; a forced call counts as
finished (the fake model has no end-of-sequence token to stop on after it). As in
vLLM, an aborted request still ends in `response.completed`: telling it apart is the
gateway's job (from the request's outcome).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseStatus,
)

from engine.fake_wire import placeholder
from engine.interface import GenerateRequest, GenerationChunk
from engine.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    InputTokensDetails,
    OutputTokensDetails,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseInProgressEvent,
    ResponsesRequest,
    ResponsesResponse,
    ResponseUsage,
    SimpleStreamingEventProcessor,
)
from engine.responses_wire import as_chat, event_sse


def responses_prompt(request: ResponsesRequest) -> str:
    """The fake's chat template over the request's chat messages and tool names."""
    messages, tools = as_chat(request)
    lines = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        calls = message.get("tool_calls") or []
        text = content or " ".join(
            f"{c['function']['name']}{c['function']['arguments']}" for c in calls
        )
        lines.append(f"{message.get('role', 'user')}: {text or ''}")
    if tools:
        lines.append("tools: " + " ".join(t["function"]["name"] for t in tools))
    lines.append("assistant:")
    return "\n".join(lines)


def forced_call(request: ResponsesRequest) -> tuple[str, str] | None:
    """(name, JSON arguments) of the call the request forces, else None."""
    functions = [t for t in request.tools if t.type == "function"]
    choice = request.tool_choice
    if not functions or choice in ("none", "auto"):
        return None
    named = getattr(choice, "name", None)
    chosen = next((f for f in functions if f.name == named), functions[0])
    return chosen.name, json.dumps(placeholder(chosen.parameters or {"type": "object"}))


class FakeResponse:
    """One answer to a Responses request: its reply, or its event stream."""

    def __init__(self, request: ResponsesRequest, model: str, job: GenerateRequest) -> None:
        self._request = request
        self._model = model
        self._job = job
        self._call = forced_call(request)
        self._created = int(time.time())
        self._prompt_tokens = len((job.prompt or "").split())

    def reply(self, text: str, tokens: int, finish: str | None) -> ResponsesResponse:
        """The whole answer (`responses_full_generator`'s shape)."""
        gid = self._request.request_id.removeprefix("resp_")
        output: list[ResponseOutputItem]
        if self._call is not None and finish != "abort":
            name, arguments = self._call
            output = [
                ResponseFunctionToolCall(
                    id=f"fc_{gid}",
                    call_id=f"call_{gid}",
                    type="function_call",
                    status="completed",
                    name=name,
                    arguments=arguments,
                )
            ]
        else:
            content = [ResponseOutputText(type="output_text", text=text, annotations=[])]
            output = [
                ResponseOutputMessage(
                    id=f"msg_{gid}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=content if text else [],
                )
            ]
        return self._response(output, tokens, self._status(finish))

    def _status(self, finish: str | None) -> ResponseStatus:
        return "incomplete" if finish == "length" and self._call is None else "completed"

    def _response(
        self, output: list[ResponseOutputItem], tokens: int, status: ResponseStatus
    ) -> ResponsesResponse:
        sampling = self._request.to_sampling_params(
            self._job.max_tokens, {"temperature": self._job.temperature}
        )
        usage = ResponseUsage(
            input_tokens=self._prompt_tokens,
            output_tokens=tokens,
            total_tokens=self._prompt_tokens + tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(),
        )
        return ResponsesResponse.from_request(
            self._request,
            sampling,
            model_name=self._model,
            created_time=self._created,
            output=output,
            status=status,
            usage=usage if status != "in_progress" else None,
        )

    async def stream(self, chunks: AsyncGenerator[GenerationChunk, None]) -> AsyncIterator[str]:
        """The events of `responses_stream_generator`, numbered from 0."""
        processor = SimpleStreamingEventProcessor(tools=self._request.tools)
        number = 0

        def numbered(event: Any) -> str:
            nonlocal number
            event.sequence_number = number
            number += 1
            return event_sse(event)

        opening = self._response([], 0, "in_progress")
        yield numbered(
            ResponseCreatedEvent(type="response.created", sequence_number=-1, response=opening)
        )
        yield numbered(
            ResponseInProgressEvent(
                type="response.in_progress", sequence_number=-1, response=opening
            )
        )
        tokens, finish = 0, None
        async with aclosing(chunks) as source:
            async for chunk in source:
                tokens += len(chunk.token_ids_delta)
                finish = chunk.finish_reason if chunk.finished else None
                for delta in self._deltas(chunk):
                    for event in _events(processor, delta):
                        yield numbered(event)
        for event in processor.close_current():
            yield numbered(event)
        final = self._response(processor.output_items, tokens, self._status(finish))
        yield numbered(
            ResponseCompletedEvent(type="response.completed", sequence_number=-1, response=final)
        )

    def _deltas(self, chunk: GenerationChunk) -> list[DeltaMessage]:
        """What the parser would make of a chunk: its text, or, at the end, the call."""
        if self._call is None:
            return [DeltaMessage(content=chunk.text_delta)] if chunk.text_delta else []
        if not chunk.finished or chunk.finish_reason == "abort":
            return []
        name, arguments = self._call
        gid = self._request.request_id.removeprefix("resp_")
        function = DeltaFunctionCall(name=name, arguments=arguments)
        call = DeltaToolCall(id=f"call_{gid}", type="function", index=0, function=function)
        return [DeltaMessage(tool_calls=[call])]


def _events(processor: SimpleStreamingEventProcessor, delta: DeltaMessage) -> list[Any]:
    """vLLM's state machine on one delta (`_process_simple_streaming_events`)."""
    target, call = processor.resolve_target_state(delta)
    events: list[Any] = []
    if processor.needs_transition(target, call):
        events += processor.close_current()
        events += processor.open(target, call)
    events += processor.emit_delta(delta, None)  # type: ignore[arg-type]  # no logprobs
    return events
