"""A Responses API request as the gateway's chat path reads it, and what it refuses.

The gateway keeps no state between requests, and neither does vLLM by default
(`VLLM_ENABLE_RESPONSES_API_STORE` off): `store: true` is accepted and nothing is
stored, as `vllm serve` answers it. What needs a stored response or conversation
(`previous_response_id`, `background`, `conversation`, an `item_reference` input
item) is a 400 that says so; so are the features the served model does not have:
reasoning (no reasoning parser is configured), and tools other than functions
(vLLM runs built-in tools such as `web_search` only with a tool server, and would
otherwise offer the model nothing while answering 200).

For limits and classification the request is a chat request: instructions as the
system message, then the input items as chat messages, and its function tools in
chat's shape (`engine.responses_wire.as_chat`, vLLM's own reading), so a Responses
request and the chat request it renders to land in the same class.
"""

from __future__ import annotations

from typing import Any

from engine.interface import InvalidRequestError
from engine.port import RESERVED_XARGS
from engine.protocol import ResponsesRequest
from engine.responses_wire import as_chat
from gateway import limits
from gateway.control.features import ChatView
from gateway.errors import invalid
from gateway.intake import chat_view, check_tools
from gateway.settings import GatewaySettings

#: Why state-bound features are refused.
NO_STORE = (
    "spec-gateway keeps no responses (store is not supported; `store: true` is accepted "
    "and nothing is stored): send the whole conversation as `input` items"
)


def refuse_unserved(request: ResponsesRequest) -> None:
    """A 400 for a feature that needs stored state or that the served model lacks."""
    if request.previous_response_id is not None:
        raise invalid(f"previous_response_id is not supported: {NO_STORE}", "previous_response_id")
    if request.background:
        raise invalid(f"background mode is not supported: {NO_STORE}", "background")
    if (request.model_extra or {}).get("conversation") is not None:
        raise invalid(f"conversation is not supported: {NO_STORE}", "conversation")
    reasoning = request.reasoning
    if reasoning is not None and (
        reasoning.effort not in (None, "none") or reasoning.summary or reasoning.generate_summary
    ):
        raise invalid(
            "reasoning is not supported: the model is served without a reasoning parser",
            "reasoning",
        )
    for i, tool in enumerate(request.tools):
        if tool.type != "function":
            raise invalid(
                f"tools[{i}] is a `{tool.type}` tool: only `function` tools are supported "
                "(built-in tools need a tool server, which spec-gateway does not run)",
                f"tools[{i}]",
            )
    choice = request.tool_choice
    if not isinstance(choice, str) and choice.type != "function":
        raise invalid(
            f"tool_choice `{choice.type}` is not supported: use none, auto, required or a function",
            "tool_choice",
        )


def chat_reading(request: ResponsesRequest) -> tuple[list[dict[str, Any]], ChatView]:
    """(chat messages, the classification view `ControlPlane.plan_chat` reads)."""
    if isinstance(request.input, list) and not request.input:
        raise invalid("input must not be empty", "input")
    try:
        messages, tools = as_chat(request)
    except InvalidRequestError as exc:
        raise invalid(str(exc), exc.param) from None
    text_format = request.text.format if request.text is not None else None
    format_type = text_format.type if text_format is not None else None
    return messages, chat_view(messages, tools, request.tool_choice, format_type)


def text_format_schema(request: ResponsesRequest) -> dict[str, Any] | None:
    """`text.format` as JSON, for the schema limits (None when unset)."""
    if request.text is None or request.text.format is None:
        return None
    schema: dict[str, Any] = request.text.format.model_dump(by_alias=True, exclude_none=True)
    return schema


def responses_intake(request: ResponsesRequest, settings: GatewaySettings) -> ChatView:
    """A Responses request's checks (reserved xargs, what it refuses, the chat limits on
    what it renders to, the text format's schema, the tools' bounds); the view
    classification reads, as `gateway.intake.chat_intake` gives it for chat."""
    limits.reject_reserved_xargs(request.vllm_xargs, RESERVED_XARGS)
    refuse_unserved(request)
    # Never kept: vLLM's opt-in store holds every response in memory for good.
    request.store = False
    messages, view = chat_reading(request)
    limits.check_chat({"messages": messages, "stop": request.stop}, settings)
    text_format = text_format_schema(request)
    if text_format is not None:
        limits.check_schema(text_format, "text.format", settings)
    check_tools(view.tools, settings)
    return view
