"""Riding the batch's depth, on the real gateway and engine over a socket.

A request whose class chose less than the depth a request in flight chose runs at
that depth (flag `batch-ride`, `Controller.decide`): the drafter drafts it for
every request in the step anyway. Here completions (labels `plain/...`) are pinned
to k = 4 by a targeting rule in `flags.json`, chat starts cold at k = 1 (never
raised during cold start); a chat request sent while a pinned completion streams
is told k = 4 in `x-specgw-k`, alone it keeps its class's k, and with the flag off
it keeps it beside the completion too.
"""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.gateway.conftest import NO_CALIBRATION, start_gateway, stop_gateway
from tests.gateway.flag_files import chat_k, write_flags

#: Starts `spec-gateway serve` on the real engine: the engine tier.
pytestmark = pytest.mark.engine

PINNED = 4
COLD_K = 1


def write_ride_flags(directory: Path, ride: bool) -> None:
    write_flags(
        directory,
        {"exploration-share": 0.0, "batch-ride": ride},
        {"pin-k": ("plain", PINNED)},
    )


def k_beside_a_pinned_stream(client: openai.OpenAI, model: str, text: str) -> tuple[int, int]:
    """(k of a chat request sent while a pinned completion streams, the completion's k)."""
    raw = client.completions.with_raw_response.create(
        model=model,
        prompt="List the numbers from one upwards, in words:",
        max_tokens=400,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    stream = raw.parse()
    chunks = iter(stream)
    next(chunks)  # the completion is in the engine
    k = chat_k(client, model, text)
    finished = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finished[-1] == "length"  # it was still running when the chat request came
    return k, int(raw.headers["x-specgw-k"])


def test_a_shallow_request_rides_at_the_depth_a_request_in_flight_chose(tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    write_ride_flags(flags, ride=True)
    gw = start_gateway(
        tmp_path,
        {
            "SPECGW_FLAGS_DIR": str(flags),
            **NO_CALIBRATION,
            "SPECGW_FLAGS_FILE_POLL_INTERVAL_S": "0.2",
        },
        ["--default-k", str(COLD_K)],
    )
    try:
        client = gw.client()
        model = client.models.list().data[0].id
        alone = chat_k(client, model, "Name a colour.")
        assert alone <= COLD_K
        ridden, pinned = k_beside_a_pinned_stream(client, model, "Name a fruit.")
        assert (ridden, pinned) == (PINNED, PINNED)
        # The ride was the request's, not the class's: alone again, the class's k.
        assert chat_k(client, model, "Name a tree.") <= COLD_K
        write_ride_flags(flags, ride=False)
        deadline = time.monotonic() + 10
        while k_beside_a_pinned_stream(client, model, "Name a river.")[0] == PINNED:
            assert time.monotonic() < deadline, "batch-ride false was not applied"
        assert k_beside_a_pinned_stream(client, model, "Name a bird.")[0] <= COLD_K
    finally:
        stop_gateway(gw)
