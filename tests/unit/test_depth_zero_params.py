"""`logit_bias` and `min_p` on the fake backend: planned at k = 0 with a reason, and the
fake engine refuses them at k > 0 with vLLM's own message, as vLLM's check does."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from engine.fake import FakeEngine, FakeEngineConfig
from engine.fake_frontend import FakeFrontend, FakeFrontendConfig
from engine.interface import InvalidRequestError
from engine.protocol import ChatCompletionRequest, CompletionRequest
from engine.vllm.depth_zero_params import VLLM_REFUSAL
from tests.spec_report import vllm_block
from tests.unit.conftest import MESSAGES, MODEL, InProcessGateway, serve_in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _chat_request(**kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **kw}
    )


@pytest.mark.parametrize("sampling", [{"logit_bias": {"3": -100}}, {"min_p": 0.1}])
async def test_the_fake_engine_refuses_them_only_where_the_request_drafts(
    sampling: dict[str, object],
) -> None:
    fake = FakeFrontend(FakeEngine(FakeEngineConfig(max_depth=4)))
    with pytest.raises(InvalidRequestError) as refused:
        await fake.chat(_chat_request(**sampling), k=2, gateway_id="a")
    assert str(refused.value) == VLLM_REFUSAL
    assert refused.value.param is None  # vLLM names no parameter
    completion = CompletionRequest.model_validate(
        {"model": MODEL, "prompt": "def f():", "max_tokens": 4, **sampling}
    )
    with pytest.raises(InvalidRequestError):
        await fake.completion(completion, k=1, gateway_id="b")
    assert await fake.chat(_chat_request(**sampling), k=0, gateway_id="c")
    assert await fake.completion(completion, k=0, gateway_id="d")
    plain = FakeFrontend(FakeEngine(FakeEngineConfig(max_depth=0)))  # no drafter: served
    assert await plain.chat(_chat_request(**sampling), k=2, gateway_id="e")


async def test_the_gateway_plans_them_at_k0_with_its_reason(
    gateway: InProcessGateway, caplog: pytest.LogCaptureFixture
) -> None:
    client = gateway.client()
    plain = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
    )
    assert int(plain.headers["x-specgw-k"]) > 0  # the class speculates without them
    caplog.set_level(logging.INFO)
    biased = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
        logit_bias={"3": -100},
    )
    assert biased.headers["x-specgw-k"] == "0"
    assert biased.headers["x-specgw-class"] == plain.headers["x-specgw-class"]
    extra = biased.parse().model_extra or {}
    assert (extra["speculation"]["k"], vllm_block(extra)["num_draft_tokens"]) == (0, 0)
    finished = [r for r in caplog.records if r.getMessage() == "request finished"]
    assert finished[-1].reason.startswith("unserved logit_bias:")  # type: ignore[attr-defined]
    sampled = await client.completions.with_raw_response.create(
        model=MODEL, prompt="def f():", max_tokens=4, temperature=1.0, extra_body={"min_p": 0.1}
    )
    assert sampled.headers["x-specgw-k"] == "0"
    stream: Any = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
        logit_bias={"3": 5},
        stream=True,
    )
    finishes = [c.choices[0].finish_reason async for c in stream if c.choices]
    assert finishes[-1] == "length"


async def test_a_min_p_the_model_sets_by_default_plans_k0_too() -> None:
    """A model's generation config may set min_p (vLLM fills it into every request that
    sets none, then refuses it beside drafts): the plan reads the filled-in value."""
    frontend = FakeFrontendConfig(default_min_p=0.05)
    async with serve_in_process(frontend=frontend) as gw:
        client = gw.client()
        reply = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
        )
        assert reply.headers["x-specgw-k"] == "0"
        explicit = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
            extra_body={"min_p": 0.0},
        )
        assert int(explicit.headers["x-specgw-k"]) > 0  # the request's own 0 wins
    fake = FakeFrontend(FakeEngine(FakeEngineConfig(max_depth=4)), frontend)
    assert fake.sampling_of(_chat_request()).min_p == 0.05
    with pytest.raises(InvalidRequestError):  # what the gateway would have run into
        await fake.chat(_chat_request(), k=2, gateway_id="x")
