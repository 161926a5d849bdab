"""The Responses API on the wire: vLLM's event framing, shared by both serving ports
and the gateway (which frames its own in-stream errors the same way).

A `/v1/responses` stream is a sequence of typed events, each framed as vLLM's
`create_responses` route frames it (`vllm/entrypoints/openai/responses/api_router.py`):
`event: <type>\\ndata: <event JSON, by alias>\\n\\n`. It opens with
`response.created` and `response.in_progress` and ends with `response.completed`
(whose `response` is the whole answer; vLLM sends it also when the answer is
`incomplete`). There is no `[DONE]` line. A failure inside the stream is one
`error` event in OpenAI's shape (`ResponseErrorEvent`: type, code, message, param,
sequence_number); `code` is `invalid_request_error` for a client's fault, else
`server_error`. A backend raises its failures (`engine.port`); the gateway writes
that event.

`as_chat` reads a request as vLLM's renderer does (`construct_input_messages`,
`construct_tool_dicts`): instructions as the system message, then the input items
as chat messages (a `function_call` an assistant tool call, its output a `tool`
message), and the function tools in chat's shape. The fake backend renders that;
the gateway checks and classifies it as a chat request.
"""

from __future__ import annotations

import json
from typing import Any

from engine.interface import InvalidRequestError
from engine.protocol import (
    ClientError,
    ResponsesRequest,
    construct_input_messages,
    construct_tool_dicts,
)

#: The event that ends a finished answer.
COMPLETED = "response.completed"
#: `code` of an in-stream error the client caused; any other code is the server's.
CLIENT_FAULT = "invalid_request_error"
SERVER_FAULT = "server_error"


def as_chat(request: ResponsesRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(chat messages, chat-shaped function tools) of a Responses request; an input item
    vLLM cannot render (an `item_reference`, encrypted reasoning) is a client error."""
    try:
        messages = construct_input_messages(
            request_instructions=request.instructions, request_input=request.input
        )
    except ClientError as exc:
        raise InvalidRequestError(str(exc.args[0]) if exc.args else str(exc), "input") from exc
    tools = construct_tool_dicts(request.tools, request.tool_choice) or []
    return [dict(m) for m in messages], tools


def event_sse(event: Any) -> str:
    """One event (an OpenAI/vLLM event model) framed as vLLM frames it."""
    kind = getattr(event, "type", "unknown")
    return f"event: {kind}\ndata: {event.model_dump_json(indent=None, by_alias=True)}\n\n"


def error_sse(message: str, *, code: str, sequence_number: int, param: str | None = None) -> str:
    """An in-stream error event in OpenAI's `ResponseErrorEvent` shape."""
    body = {
        "type": "error",
        "code": code,
        "message": message,
        "param": param,
        "sequence_number": sequence_number,
    }
    return f"event: error\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"
