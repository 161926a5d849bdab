"""`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/models`: OpenAI's API,
vLLM's models."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from engine.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
    ResponsesRequest,
    ResponsesResponse,
)
from gateway.api.deps import require_user, service, tenant
from gateway.api.responses import SSEResponse, error_docs, reply_response, unless_disconnected
from gateway.errors import GatewayError
from gateway.phase import not_ready
from gateway.replies import JsonReply, StreamReply
from gateway.service import InferenceService
from gateway.tenants import Tenant

ERRORS = error_docs(400, 401, 403, 404, 413, 429, 503)


def _ok(model: type) -> dict[int | str, dict[str, Any]]:
    """200 is JSON (`model` plus the `speculation` object) or an SSE stream."""
    return {200: {"model": model, "content": {"text/event-stream": {}}}}


async def _answer(
    request: Request, call: Awaitable[JsonReply | StreamReply]
) -> JSONResponse | SSEResponse:
    """A parsed request's answer: within the request timeout, cancelled if the client leaves."""
    request.state.route_entered = True  # parsing is over: later errors are the gateway's
    timeout = request.app.state.settings.request_timeout_s
    return reply_response(await unless_disconnected(request, call, timeout))


router = APIRouter(prefix="/v1", dependencies=[Depends(require_user)])
Service = Annotated[InferenceService, Depends(service)]
Who = Annotated[Tenant, Depends(tenant)]


@router.post(
    "/chat/completions",
    response_model=None,
    responses={**_ok(ChatCompletionResponse), **ERRORS},
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, svc: Service, who: Who
) -> JSONResponse | SSEResponse:
    return await _answer(request, svc.chat(body, who))


@router.post("/completions", response_model=None, responses={**_ok(CompletionResponse), **ERRORS})
async def completions(
    body: CompletionRequest, request: Request, svc: Service, who: Who
) -> JSONResponse | SSEResponse:
    return await _answer(request, svc.completion(body, who))


@router.post("/responses", response_model=None, responses={**_ok(ResponsesResponse), **ERRORS})
async def responses(
    body: ResponsesRequest, request: Request, svc: Service, who: Who
) -> JSONResponse | SSEResponse:
    """OpenAI's Responses API through vLLM's; stateless (`gateway.responses_request`)."""
    return await _answer(request, svc.responses(body, who))


@router.get("/models", response_model=None, responses={200: {"model": ModelList}, **ERRORS})
async def models(request: Request) -> JSONResponse:
    runtime = request.app.state.runtime
    if runtime is None:  # still loading: no serving layer to list
        raise not_ready(request.app.state.phases)
    listed = await runtime.frontend.models()
    return JSONResponse(listed.model_dump(exclude_none=True))


__all__ = ["GatewayError", "StreamReply", "router"]
