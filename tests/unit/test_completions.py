"""`/v1/completions` and `/v1/models` through the official client, in process."""

from __future__ import annotations

import openai
import pytest

from tests.spec_report import check_report, vllm_block
from tests.unit.conftest import MODEL, InProcessGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROMPT = "def parse_args(argv):\n"


def expected_text(gw: InProcessGateway, prompt: str, tokens: int) -> str:
    return "".join(f" t{gw.engine.token_at(prompt, i)}" for i in range(tokens))


async def test_models_lists_the_served_model(gateway: InProcessGateway) -> None:
    models = await gateway.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model"


async def test_completion_reply(gateway: InProcessGateway) -> None:
    raw = await gateway.client().completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0
    )
    completion = raw.parse()
    assert completion.id.startswith("cmpl-")
    assert completion.choices[0].text == expected_text(gateway, PROMPT, 16)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(PROMPT.split())
    assert completion.usage.completion_tokens == 16
    check_report(
        completion.model_extra, int(raw.headers["x-specgw-k"]), raw.headers["x-specgw-class"]
    )


async def test_completion_stream(gateway: InProcessGateway) -> None:
    stream = await gateway.client().completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected_text(gateway, PROMPT, 12)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    vllm_block(chunks[-1].model_extra or {})
    assert "speculation" in (chunks[-1].model_extra or {})


async def test_a_one_item_prompt_list_is_one_prompt(gateway: InProcessGateway) -> None:
    completion = await gateway.client().completions.create(
        model=MODEL, prompt=[PROMPT], max_tokens=3, temperature=0
    )
    assert completion.choices[0].text == expected_text(gateway, PROMPT, 3)


async def test_several_prompts_in_one_request_are_refused(gateway: InProcessGateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.client().completions.create(model=MODEL, prompt=["one", "two"], max_tokens=3)
    assert caught.value.body["param"] == "prompt"


async def test_code_and_prose_prompts_are_classified_apart(gateway: InProcessGateway) -> None:
    client = gateway.client()
    code = await client.completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0
    )
    prose = await client.completions.with_raw_response.create(
        model=MODEL, prompt="Once upon a time, in a valley", max_tokens=2, temperature=0
    )
    assert code.headers["x-specgw-class"] != prose.headers["x-specgw-class"]
