"""Lowering a deep batch for the batch's sake, on the real gateway and engine.

A request entering a batch deeper than it runs weighs the whole batch: where the
batch yields more tokens per unit of step cost at a lower depth, it lowers the
requests in flight to it (flag `batch-lower`, `Controller.decide`; the engine's
cap, `engine.vllm.scheduler`). Here completions (labels `plain/...`) are held at k = 4
by a `k-min` targeting rule (the controller's choice within bounds, not a pin),
chat at k = 0 by `k-max`; the step costs are fixed where a draft is dear (`PRICED`).
Chat requests sent while a completion streams at k = 4 lower it; which depth they
lower it to is the controller's call on those costs, so the test reads the caps from
the requests' logged reasons and checks that the engine held the completion to the
deepest of them a few steps in: vLLM's `metrics.speculative_decoding` on its usage
chunk counts its drafts and verify steps, and at most a handful of steps may run
deeper than the cap (those before the chats entered). With the flag off no chat lowers
it and every verify step after the first drafts 4.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from tests.gateway.conftest import (
    NO_CALIBRATION,
    GatewayProcess,
    start_gateway,
    stop_gateway,
    wait_for,
)
from tests.gateway.flag_files import chat_k, write_flags
from tests.spec_report import vllm_block

#: Starts `spec-gateway serve` on the real engine: the engine tier.
pytestmark = pytest.mark.engine

DEEP = 4
CHATS = 3
#: Long enough that the chats reach the engine early in the completion's life: at k = 4
#: it emits about six tokens a verify step, so some 80 steps.
TOKENS = 480
#: Steps the completion may verify above the cap: those before the chats' plans
#: reach the engine (three HTTP requests served while it decodes; on a busy host that
#: took the whole of a 26-step completion), well under half of its steps.
EARLY_STEPS = 30
#: Step costs fixed, not calibrated: the chats' lowering clears the hysteresis by a few
#: per cent on this CPU's calibrated costs, and a calibration timed in a busy second
#: priced drafts cheaply enough that they kept the batch at k = 4. What is tested here
#: is that the decision the costs call for reaches the engine and holds the batch; the
#: economics of the call are the controller tests' (`tests/control/test_controller.py`).
#: A prior of half a step per draft, weighted far above the live steps (a per-depth
#: memory of 1 / `cost_step_forgetting` steps), keeps the call clear.
PRICED = {
    **NO_CALIBRATION,
    "SPECGW_CONTROL_PRIOR_K_COST": "0.5",
    "SPECGW_CONTROL_COST_PRIOR_WEIGHT": "1e6",
}
LOWERS = re.compile(r"lowers the batch from k=(\d+) to k=(\d+)")
#: The gateway's log line once a change to the flag file is in its flag view.
FLAG_READ = "flags changed (FlagdProvider): ['batch-lower']"


def write_lower_flags(directory: Path, lower: bool) -> None:
    write_flags(
        directory,
        {"exploration-share": 0.0, "batch-lower": lower},
        {"k-min": ("plain", DEEP), "k-max": ("chat", 0)},
    )


@dataclass(frozen=True)
class Run:
    k: int
    tokens: int
    drafts: int
    verify_steps: int
    #: The caps the chats' decisions set on the batch, from their logged reasons.
    caps: tuple[int, ...]

    def steps_above(self, cap: int) -> float:
        """Verify steps the completion ran deeper than `cap`: drafts beyond `cap` a
        step, each at most DEEP - cap of them."""
        return (self.drafts - cap * self.verify_steps) / (DEEP - cap)


def completion_beside_chats(gw: GatewayProcess, client: openai.OpenAI, model: str) -> Run:
    """A greedy completion streaming at k = 4 with CHATS chat requests sent after its
    first chunk."""
    logged = len(gw.log_path.read_text())
    raw = client.completions.with_raw_response.create(
        model=model,
        prompt="List the numbers from one upwards, in words:",
        max_tokens=TOKENS,
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
    spec = vllm_block(final.model_extra or {})
    assert final.usage is not None
    assert final.usage.completion_tokens == TOKENS
    caps = tuple(int(to) for _, to in LOWERS.findall(gw.log_path.read_text()[logged:]))
    return Run(
        k=int(raw.headers["x-specgw-k"]),
        tokens=final.usage.completion_tokens,
        drafts=int(spec["num_draft_tokens"]),
        verify_steps=int(spec["num_spec_steps"]),
        caps=caps,
    )


def test_chat_at_k0_lowers_a_completion_streaming_at_k4(tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    write_lower_flags(flags, lower=True)
    gw = start_gateway(
        tmp_path,
        {
            "SPECGW_FLAGS_DIR": str(flags),
            **PRICED,
            "SPECGW_FLAGS_FILE_POLL_INTERVAL_S": "0.2",
        },
    )
    try:
        client = gw.client()
        model = client.models.list().data[0].id
        lowered = completion_beside_chats(gw, client, model)
        assert lowered.k == DEEP
        assert lowered.caps, "no chat lowered the batch"
        cap = min(lowered.caps)
        assert cap < DEEP
        # Held to the cap a few steps in: at cap 0 that is under 0.25 drafts a token.
        assert lowered.steps_above(cap) <= EARLY_STEPS, (cap, lowered)
        assert lowered.verify_steps > EARLY_STEPS or cap == 0, lowered

        # The flag file is polled: the next requests wait for the gateway to have read it
        # (a completion sent at once raced the poll and its chats still lowered it).
        logged = len(gw.log_path.read_text())
        write_lower_flags(flags, lower=False)
        wait_for(lambda: FLAG_READ in gw.log_path.read_text()[logged:], 10)
        kept = completion_beside_chats(gw, client, model)
        assert kept.k == DEEP
        assert kept.caps == (), "batch-lower false was not applied"
        # Every verify step but the first drafted 4 (the prefill step drafts one:
        # `specgw_first_step_depth`): none held below the completion's k.
        assert kept.drafts == DEEP * (kept.verify_steps - 1) + 1, kept
        assert kept.verify_steps > EARLY_STEPS, kept
    finally:
        stop_gateway(gw)
