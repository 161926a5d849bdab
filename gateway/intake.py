"""A request's intake: its messages as plain data, the view classification reads, the
token estimate for the length buckets."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.port import RESERVED_XARGS
from engine.protocol import ChatCompletionRequest, CompletionRequest
from gateway import limits
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


def chat_view(request: ChatCompletionRequest, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Plain-data view of what classification looks at."""
    tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
    fmt = request.response_format
    choice = request.tool_choice
    return {
        "messages": messages,
        "tools": tools,
        # A named choice is a model object; classification only needs to know it is named.
        "tool_choice": choice if choice is None or isinstance(choice, str) else {"named": True},
        "response_format": {"type": fmt.type} if fmt is not None else None,
    }


def approx_tokens(chars: int) -> int:
    """~4 characters per token: enough for the log-scale length buckets of classification."""
    return max(1, chars // 4)


def chat_intake(
    request: ChatCompletionRequest, harmony: bool, settings: GatewaySettings
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A chat request's checks (reserved xargs, one choice, size bounds, the response
    format's schema); its messages as plain data and the view classification reads."""
    limits.reject_reserved_xargs(request.vllm_xargs, RESERVED_XARGS)
    messages = plain_messages(request.messages, harmony)
    body = {
        "messages": messages,
        "stop": request.stop,
        "n": request.n,
        "use_beam_search": request.use_beam_search,
    }
    limits.check_chat(body, settings)
    view = chat_view(request, messages)
    if request.response_format is not None:
        limits.check_schema(
            request.response_format.model_dump(exclude_none=True), "response_format", settings
        )
    return messages, view


def check_tools(tools: list[dict[str, Any]] | None, settings: GatewaySettings) -> None:
    """At most `max_tools` tools, each schema within the schema bounds."""
    if tools:
        if len(tools) > settings.max_tools:
            raise invalid(f"at most {settings.max_tools} tools", param="tools")
        limits.check_schema(tools, "tools", settings)


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
