"""The HTTP floor: a bare Starlette app on uvicorn that streams the same SSE shape.

It answers `POST /v1/chat/completions` with 16 fixed chunks and `[DONE]`, doing
no parsing, auth or templating. Timing it with the same client as the gateway
separates what the transport (uvicorn, HTTP/1.1, the client) costs from what
the gateway's own work adds: `python -m bench.sse_floor --port P`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.noop_engine import OVERHEAD_MAX_TOKENS

_CHUNK = "data: " + json.dumps(
    {
        "id": "floor",
        "object": "chat.completion.chunk",
        "model": "floor",
        "choices": [{"index": 0, "delta": {"content": " the"}, "finish_reason": None}],
    }
)


async def _chat(request: Request) -> Response:
    await request.body()

    async def events() -> AsyncIterator[str]:
        for _ in range(OVERHEAD_MAX_TOKENS):
            yield _CHUNK + "\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _ready(_: Request) -> Response:
    return JSONResponse({"ready": True})


async def _models(_: Request) -> Response:
    return JSONResponse({"data": [{"id": "floor"}]})


def build_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/chat/completions", _chat, methods=["POST"]),
            Route("/ready", _ready),
            Route("/v1/models", _models),
        ]
    )


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
