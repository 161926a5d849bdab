"""A request's intake: its messages as plain data, the view classification reads, the
token estimate for the length buckets."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.port import RESERVED_XARGS
from engine.protocol import ChatCompletionRequest, CompletionRequest
from gateway import limits
from gateway.control.features import ChatView
from gateway.errors import invalid
from gateway.settings import GatewaySettings


def plain_messages(messages: Iterable[Any], harmony: bool) -> list[dict[str, Any]]:
    """The messages as JSON objects, for the input limits and classification.

    vLLM's request model parses a message with `author` instead of `role` into an
    OpenAI-harmony `Message` object, whichever the model; only a harmony model
    (gpt-oss) can render one, so for any other it is a 400 here, not a crash later.
    """
    plain: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if isinstance(message, dict):
            plain.append(message)
        elif not harmony:
            raise invalid(
                f"messages[{i}] is an OpenAI-harmony message (author/channel), which only "
                "gpt-oss models take: send role and content",
                param="messages",
            )
        else:
            plain.append(message.model_dump(mode="json", exclude_none=True))
    return plain


def chat_view(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    choice: Any,
    format_type: str | None,
) -> ChatView:
    """What classification reads, for chat and for a Responses request as chat alike:
    the messages and tools as JSON, the tool choice's kind (a named choice is a model
    object; classification only needs to know it is named), the response format's type."""
    kind = choice if choice is None or isinstance(choice, str) else "named"
    return ChatView(messages, tools or None, kind, format_type)


def chat_max_tokens(request: ChatCompletionRequest) -> int | None:
    """A chat request's `max_tokens`, read past the field's deprecation descriptor (vLLM
    deprecates it for `max_completion_tokens`): pydantic's descriptor calls `warnings.warn`
    on every read, a DeprecationWarning no one sees, at a cost per request."""
    value: int | None = request.__dict__.get("max_tokens")
    return value


def approx_tokens(chars: int) -> int:
    """~4 characters per token: enough for the log-scale length buckets of classification."""
    return max(1, chars // 4)


def chat_intake(
    request: ChatCompletionRequest, harmony: bool, settings: GatewaySettings
) -> ChatView:
    """A chat request's checks (reserved xargs, one choice, size bounds, the response
    format's schema, the tools' bounds); the view classification reads (its messages as
    plain data)."""
    limits.reject_reserved_xargs(request.vllm_xargs, RESERVED_XARGS)
    messages = plain_messages(request.messages, harmony)
    body = {
        "messages": messages,
        "stop": request.stop,
        "n": request.n,
        "use_beam_search": request.use_beam_search,
    }
    limits.check_chat(body, settings)
    tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
    fmt = request.response_format
    view = chat_view(messages, tools, request.tool_choice, fmt.type if fmt is not None else None)
    if request.response_format is not None:
        limits.check_schema(
            request.response_format.model_dump(exclude_none=True), "response_format", settings
        )
    check_tools(view.tools, settings)
    return view


def check_tools(tools: Sequence[Mapping[str, Any]] | None, settings: GatewaySettings) -> None:
    """At most `max_tools` tools, each schema within the schema bounds."""
    if tools:
        if len(tools) > settings.max_tools:
            raise invalid(f"at most {settings.max_tools} tools", param="tools")
        limits.check_schema(tools, "tools", settings)


def chat_tokens(view: ChatView) -> int:
    """A chat-shaped prompt's approximate tokens: its messages' text and, as the chat
    template renders the tool definitions into the prompt, its tools' schemas (a
    tool-call request's prompt is mostly those: they count in its length bucket and in
    its token reserve)."""
    chars = sum(len(str(m.get("content") or "")) for m in view.messages)
    if view.tools:
        chars += len(json.dumps(view.tools, separators=(",", ":"), default=str))
    return approx_tokens(chars)


def completion_intake(request: CompletionRequest, settings: GatewaySettings) -> str:
    """A completion's checks; its one prompt's text."""
    limits.reject_reserved_xargs(request.vllm_xargs, RESERVED_XARGS)
    limits.check_single({"n": request.n, "use_beam_search": request.use_beam_search})
    prompt = request.prompt
    if isinstance(prompt, list) and len(prompt) != 1:
        raise invalid(
            "exactly one prompt per request: spec-gateway measures and reports "
            "speculation per request; send a batch as separate requests",
            param="prompt",
        )
    text = prompt if isinstance(prompt, str) else prompt[0] if prompt else ""
    if not isinstance(text, str):
        raise invalid("prompt must be a string", param="prompt")
    limits.check_text(text, "prompt")
    limits.check_stop(request.stop, settings)
    return text
