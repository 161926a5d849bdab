"""Lowering a deep batch for the batch's sake, on the real gateway and engine.

A request entering a batch deeper than it runs weighs the whole batch: where the
batch yields more tokens per unit of step cost at a lower depth, it lowers the
requests in flight to it (flag `batch-lower`, `Controller.decide`; the engine's
cap, `engine.vllm.scheduler`). Here completions (labels `plain/...`) are held at k = 4
by a `k-min` targeting rule (the controller's choice within bounds, not a pin),
chat at k = 0 by `k-max`; the start-up calibration prices the CPU's steps (a
draft costs a large share of a step). Chat requests sent while a completion
streams at k = 4 bring its drafts down to none, which the completion's own
`speculation` usage object shows (drafted tokens per output token: about 4 / 3 at
k = 4 with about 3 tokens a step, a handful in all once capped a few steps in);
with the flag off it drafts to its end.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.gateway.conftest import start_gateway, stop_gateway
from tests.gateway.flag_files import chat_k, write_flags

#: Starts `spec-gateway serve` on the real engine: the engine tier.
pytestmark = pytest.mark.engine

DEEP = 4
CHATS = 3


def write_lower_flags(directory: Path, lower: bool) -> None:
    write_flags(
        directory,
        {"exploration-share": 0.0, "batch-lower": lower},
        {"k-min": ("plain", DEEP), "k-max": ("chat", 0)},
    )


def drafts_per_token_beside_chats(client: openai.OpenAI, model: str) -> tuple[int, float]:
    """(the completion's k, its drafted tokens per output token) with CHATS chat
    requests sent after its first chunk."""
    raw = client.completions.with_raw_response.create(
        model=model,
        prompt="List the numbers from one upwards, in words:",
        max_tokens=160,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    stream = raw.parse()
    chunks = iter(stream)
    next(chunks)  # the completion is in the engine, drafting at k = 4
    with ThreadPoolExecutor(CHATS) as pool:
        ks = list(
            pool.map(
                lambda i: chat_k(client, model, f"Name a colour, number {i}.", 8), range(CHATS)
            )
        )
    assert ks == [0] * CHATS  # chat's k-max
    rest = list(chunks)
    assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
    final = rest[-1]
    spec = (final.model_extra or {}).get("speculation")
    assert isinstance(spec, dict), final
    assert final.usage is not None
    return int(raw.headers["x-specgw-k"]), spec["draft_tokens"] / final.usage.completion_tokens


def test_chat_at_k0_lowers_a_completion_streaming_at_k4(tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    write_lower_flags(flags, lower=True)
    gw = start_gateway(
        tmp_path,
        {
            "SPECGW_FLAGS_DIR": str(flags),
            "SPECGW_CONTROL_CALIBRATE_BATCHES": "[1, 2, 4]",
            "SPECGW_FILE_POLL_INTERVAL_S": "0.2",
        },
    )
    try:
        client = gw.client()
        model = client.models.list().data[0].id
        k, lowered = drafts_per_token_beside_chats(client, model)
        assert k == DEEP
        assert lowered < 0.25  # capped to 0 a few steps in
        write_lower_flags(flags, lower=False)
        deadline = time.monotonic() + 10
        while True:
            k, kept = drafts_per_token_beside_chats(client, model)
            if kept > 0.5 or time.monotonic() > deadline:
                break
        assert k == DEEP
        assert kept > 0.5, "batch-lower false was not applied"
    finally:
        stop_gateway(gw)
