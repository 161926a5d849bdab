"""One speculation report per answer, at the server's level or lower where a request asks:
vLLM's `metrics.speculative_decoding` beside the gateway's `speculation` object, through
the official client on the whole gateway in process (fake backend)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from engine.fake import FakeEngineConfig
from engine.interface import RequestOutcome, SpeculationOutcome
from gateway.control.plane import Plan
from gateway.speculation_report import SpeculationReport, requested_level
from tests.spec_report import check_report, no_report, vllm_block
from tests.unit.conftest import MESSAGES, MODEL, InProcessGateway, gateway_settings
from tests.unit.conftest import serve_in_process as serve

pytestmark = pytest.mark.asyncio(loop_scope="session")

STREAM = {"stream": True, "stream_options": {"include_usage": True}}


async def _chat(gw: InProcessGateway, *, stream: bool = False, **extra: Any) -> tuple[Any, Any]:
    """(the reply or the stream's usage chunk, the raw response's headers)."""
    fields: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24}
    fields["temperature"] = 0
    if stream:
        fields.update(STREAM)
    raw = await gw.client().chat.completions.with_raw_response.create(
        **fields, extra_body=extra or None
    )
    if not stream:
        return raw.parse(), raw.headers
    chunks = [chunk async for chunk in raw.parse()]
    assert chunks[-1].choices == []
    return chunks[-1], raw.headers


def _k_label(headers: Any) -> tuple[int, str]:
    return int(headers["x-specgw-k"]), headers["x-specgw-class"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_summary_by_default_detailed_where_the_server_says(stream: bool) -> None:
    async with serve() as gw:
        answer, headers = await _chat(gw, stream=stream)
        block = check_report(answer.model_extra, *_k_label(headers))
        assert block["num_spec_steps"] > 0  # the fake drafts at this k: counts, not zeros
        asked, headers = await _chat(gw, stream=stream, speculation_report="detailed")
        check_report(asked.model_extra, *_k_label(headers))  # a request cannot raise it
    async with serve(gateway_settings(speculation_report="detailed")) as gw:
        answer, headers = await _chat(gw, stream=stream)
        check_report(answer.model_extra, *_k_label(headers), detailed=True)
        lowered, headers = await _chat(gw, stream=stream, speculation_report="summary")
        check_report(lowered.model_extra, *_k_label(headers))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_request_or_the_server_turns_the_report_off(stream: bool) -> None:
    async with serve() as gw:
        answer, headers = await _chat(gw, stream=stream, speculation_report="none")
        no_report(answer.model_extra)
        assert headers["x-specgw-k"].isdigit()  # the headers still say what was decided
    async with serve(gateway_settings(speculation_report="none")) as gw:
        answer, _ = await _chat(gw, stream=stream)
        no_report(answer.model_extra)
        answer, _ = await _chat(gw, stream=stream, speculation_report="detailed")
        no_report(answer.model_extra)


async def test_completions_and_responses_carry_the_same_report(gateway: InProcessGateway) -> None:
    client = gateway.client()
    raw = await client.completions.with_raw_response.create(
        model=MODEL, prompt="def f(x):", max_tokens=12, temperature=0
    )
    check_report(raw.parse().model_extra, *_k_label(raw.headers))
    answer = await client.responses.with_raw_response.create(
        model=MODEL, input="Name a river.", max_output_tokens=12, temperature=0
    )
    check_report(answer.parse().model_extra, *_k_label(answer.headers))
    off = await client.responses.create(
        model=MODEL,
        input="Name a river.",
        max_output_tokens=12,
        extra_body={"speculation_report": "none"},
    )
    no_report(off.model_extra)


async def test_an_unknown_level_is_a_400_naming_the_field(gateway: InProcessGateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.client().chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body={"speculation_report": "all"},
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "speculation_report"
    assert "none, summary, detailed" in error["message"]


PLAN = Plan(class_id="c1", label="chat/short", k=3, reason="warm start: shared state")
VLLM_BLOCK = {
    "mean_acceptance_length": 2.0,
    "draft_acceptance_rate": 0.5,
    "acceptance_histogram": [1, 0, 1, 0],
    "num_spec_steps": 2,
    "num_accepted_draft_tokens": 2,
    "num_draft_tokens": 4,
    "num_spec_tokens": 3,
    "per_step_accepted": [0, 2],
    "per_step_drafted": [2, 2],
}


@pytest.mark.parametrize(
    ("level", "block_keys", "speculation"),
    [
        ("detailed", set(VLLM_BLOCK), True),
        ("summary", set(VLLM_BLOCK) - {"per_step_accepted", "per_step_drafted"}, True),
        ("none", None, False),
    ],
)
async def test_the_report_keeps_vllms_block_and_its_other_metrics(
    level: Any, block_keys: set[str] | None, speculation: bool
) -> None:
    """vLLM's block is kept as it came (never rebuilt from the outcome where vLLM wrote
    one), its timing metrics stay whatever the level."""
    metrics = {"time_to_first_token_ms": 5.0, "speculative_decoding": VLLM_BLOCK}
    body: dict[str, Any] = {"id": "x", "metrics": metrics}
    other = SpeculationOutcome(k=3, verify_steps=9, acceptance_histogram=(9, 0, 0, 0))
    outcome = RequestOutcome("r", 1, 1, "stop", other)
    out = SpeculationReport(level, PLAN).write(body, outcome)
    assert out["metrics"]["time_to_first_token_ms"] == 5.0
    block = out["metrics"].get("speculative_decoding")
    assert (set(block) if block else None) == block_keys
    if block:
        assert block["num_spec_steps"] == 2  # vLLM's, not the outcome's
    assert ("speculation" in out) is speculation
    if speculation:
        assert out["speculation"] == {
            "class": "chat/short",
            "class_id": "c1",
            "k": 3,
            "reason": "warm start: shared state",
        }
    assert VLLM_BLOCK["per_step_accepted"] == [0, 2]  # the caller's block is not edited


def test_levels_lower_never_raise() -> None:
    class Body:
        def __init__(self, **extra: Any) -> None:
            self.model_extra = extra

    assert requested_level(Body(), "detailed") == "detailed"
    assert requested_level(Body(speculation_report="summary"), "detailed") == "summary"
    assert requested_level(Body(speculation_report="detailed"), "summary") == "summary"
    assert requested_level(Body(speculation_report="none"), "summary") == "none"
    assert requested_level(Body(speculation_report="summary"), "none") == "none"


async def test_no_drafter_no_vllm_block(gateway: InProcessGateway) -> None:
    """An engine without a drafter writes no block (vLLM's rule); the decision stays."""
    async with serve(engine=FakeEngineConfig(max_depth=0)) as gw:
        answer, headers = await _chat(gw)
        extra = answer.model_extra or {}
        assert extra["speculation"]["k"] == int(headers["x-specgw-k"]) == 0
        assert "metrics" not in extra
    vllm_block((await _chat(gateway))[0].model_extra)
