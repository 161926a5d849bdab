"""Each admitted request is one `Exchange`, ended once, however it ends.

A whole answer, a stream read to its end, a request the engine refuses, a stream its
client leaves after one chunk and a stream never read (its response finalized twice):
each is reported once, and none leaves anything behind: no outcome pending in the
engine's tap, no admission slot, no exchange in flight.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from engine.protocol import ChatCompletionRequest
from gateway.replies import StreamReply
from tests.unit.conftest import MESSAGES, MODEL, InProcessGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _requests_reported(gateway: InProcessGateway) -> float:
    text = gateway.runtime.render_metrics()[0].decode()
    lines = [line for line in text.splitlines() if line.startswith("specgw_requests_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


async def test_every_way_a_request_ends_leaves_nothing_behind(gateway: InProcessGateway) -> None:
    runtime = gateway.runtime
    client = gateway.client(max_retries=0)
    whole = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert whole.choices[0].finish_reason == "length"
    read = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, stream=True
    )
    assert [chunk async for chunk in read][-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # the engine's refusal
        await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10**6)
    async with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=200, stream=True
    ) as left:
        async for _ in left.iter_lines():
            break
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True}
    unread = await runtime.service.chat(ChatCompletionRequest.model_validate(body))
    assert isinstance(unread, StreamReply)
    await unread.finalize()
    await unread.finalize()
    await asyncio.sleep(0)  # a cancelled outcome's callback drops its entry
    assert len(runtime.engine.outcome_tap) == 0
    assert runtime.admission.running == 0
    assert runtime.service.in_flight == 0
    assert _requests_reported(gateway) == 5
