"""`logit_bias` and `min_p` on the speculative gateway: served at k = 0, token for token
what an engine without a drafter gives (`engine.vllm.depth_zero_params`).

Two real gateway processes, one after the other (never two engines at once), driven
with the official `openai` client over a socket: first the reference, an engine without
a drafter (`--max-depth 0`); then the speculative gateway with every class pinned to
k = K by the `pin-k` flag, which must not lift these requests above 0. Each request runs
beside a long unbiased request, so on the speculative engine it shares steps with a
drafting one (the rejection sampler's bonus-row path); on both engines float32, so the
different batch shapes cannot flip a greedy token.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gateway.conftest import NO_CALIBRATION, GatewayProcess, start_gateway, stop_gateway
from tests.gateway.flag_files import write_flags
from tests.spec_report import vllm_block

pytestmark = pytest.mark.engine

MODEL = "specgw-default"
K = 3
MESSAGES = [
    {"role": "system", "content": "You are a helpful Python assistant."},
    {"role": "user", "content": "What does the json module do?"},
]
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
COMPANION = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
ENGINE = ["--engine.dtype", "float32", "--engine.max-num-seqs", "8"]
SEEDS = (11, 12, 13)


@dataclass(frozen=True)
class Reply:
    token_ids: tuple[int, ...]
    text: str
    k: int
    speculation: dict[str, Any]
    #: None where the engine wrote no speculation block (the reference has no drafter).
    drafts: int | None


def _chat(client: openai.OpenAI, **kw: Any) -> Reply:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=kw.pop("messages", MESSAGES),
        max_tokens=kw.pop("max_tokens", 12),
        extra_body={"return_token_ids": True, **kw.pop("extra_body", {})},
        **kw,
    )
    reply = raw.parse()
    extra = reply.choices[0].model_extra or {}
    return Reply(
        tuple(extra["token_ids"]),
        reply.choices[0].message.content or "",
        int(raw.headers["x-specgw-k"]),
        (reply.model_extra or {})["speculation"],
        _drafts(reply.model_extra or {}),
    )


def _drafts(body: dict[str, Any]) -> int | None:
    """The answer's draft tokens from vLLM's block; None without one: the reference engine
    has no drafter, so vLLM keeps no per-request speculation metrics and writes no block."""
    return int(vllm_block(body)["num_draft_tokens"]) if "metrics" in body else None


def _completion(client: openai.OpenAI, **kw: Any) -> Reply:
    raw = client.completions.with_raw_response.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=12,
        extra_body={"return_token_ids": True, **kw.pop("extra_body", {})},
        **kw,
    )
    reply = raw.parse()
    extra = reply.choices[0].model_extra or {}
    return Reply(
        tuple(extra["token_ids"]),
        reply.choices[0].text,
        int(raw.headers["x-specgw-k"]),
        (reply.model_extra or {})["speculation"],
        _drafts(reply.model_extra or {}),
    )


def _stream_text(client: openai.OpenAI, **kw: Any) -> tuple[str, str | None]:
    stream: Any = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        **kw,
    )
    parts: list[str] = []
    finish: str | None = None
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(parts), finish


def _beside_a_drafter(client: openai.OpenAI, call: Callable[[], Any]) -> Any:
    """`call` while a long unbiased request runs (on the speculative gateway: drafting)."""
    with ThreadPoolExecutor(2) as pool:
        companion = pool.submit(_chat, client, messages=COMPANION, max_tokens=96, temperature=0)
        result = call()
        companion.result()
    return result


def _requests(first: int, completion_first: int) -> dict[str, Callable[[openai.OpenAI], Any]]:
    """The biased requests, by name: `first` and `completion_first` are the unbiased
    greedy first tokens of the chat and the completion; a +100 bias on `first + 7` makes
    it the greedy choice."""
    banned = {str(first): -100.0}
    runs: dict[str, Callable[[openai.OpenAI], Any]] = {
        "chat banned": lambda c: _chat(c, temperature=0, logit_bias=banned),
        "chat forced": lambda c: _chat(c, temperature=0, logit_bias={str(first + 7): 100.0}),
        "completion banned": lambda c: _completion(
            c, temperature=0, logit_bias={str(completion_first): -100.0}
        ),
        "stream banned": lambda c: _stream_text(c, temperature=0, logit_bias=banned),
    }
    for seed in SEEDS:
        min_p = {"min_p": 0.2}
        runs[f"min_p {seed}"] = partial(_chat, temperature=1.5, seed=seed, extra_body=min_p)
        runs[f"min_p + bias {seed}"] = partial(
            _chat, temperature=1.0, seed=seed, logit_bias=banned, extra_body={"min_p": 0.05}
        )
    return runs


@dataclass
class Run:
    unbiased: Reply
    completion_unbiased: Reply
    hot_without_min_p: dict[int, Reply]
    biased: dict[str, Any]


def _run(gw: GatewayProcess, reference: Run | None = None) -> Run:
    """Every request on one gateway; the biases from `reference`'s unbiased answers
    (None: this gateway's own)."""
    client = gw.client(timeout=300)
    unbiased = _chat(client, temperature=0)
    completion = _completion(client, temperature=0)
    firsts = reference or Run(unbiased, completion, {}, {})
    requests = _requests(firsts.unbiased.token_ids[0], firsts.completion_unbiased.token_ids[0])
    biased = {
        name: _beside_a_drafter(client, partial(run, client)) for name, run in requests.items()
    }
    hot = {s: _chat(client, temperature=1.5, seed=s) for s in SEEDS}
    return Run(unbiased, completion, hot, biased)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("gw-no-drafter")
    gw = start_gateway(tmp, extra_args=["--max-depth", "0", *ENGINE])
    try:
        return _run(gw)
    finally:
        stop_gateway(gw)


@pytest.fixture(scope="module")
def speculative(tmp_path_factory: pytest.TempPathFactory, reference: Run) -> Run:
    tmp: Path = tmp_path_factory.mktemp("gw-pinned")
    flags = tmp / "flags"
    flags.mkdir()
    write_flags(flags, {"pin-k": K})
    env = {"SPECGW_FLAGS_DIR": str(flags), **NO_CALIBRATION}  # pinned: costs do not matter
    gw = start_gateway(tmp, env, ["--max-depth", str(K), *ENGINE])
    try:
        return _run(gw, reference)
    finally:
        stop_gateway(gw)


def test_the_reference_engine_applies_both_parameters(reference: Run) -> None:
    """The comparison below can fail: the bias changes the greedy output, and min_p a
    hot seeded sample, on the engine without a drafter."""
    first = reference.unbiased.token_ids[0]
    banned = reference.biased["chat banned"]
    assert banned.token_ids[0] != first
    assert first not in banned.token_ids
    assert set(reference.biased["chat forced"].token_ids) == {first + 7}
    assert reference.biased["completion banned"].token_ids != (
        reference.completion_unbiased.token_ids
    )
    hot = [reference.hot_without_min_p[s].token_ids for s in SEEDS]
    assert hot != [reference.biased[f"min_p {s}"].token_ids for s in SEEDS]


def test_biased_requests_are_token_identical_at_k0(reference: Run, speculative: Run) -> None:
    assert speculative.unbiased.k == K  # the pin holds for a request without them
    for name, expected in reference.biased.items():
        got = speculative.biased[name]
        if isinstance(got, Reply):
            assert got.token_ids == expected.token_ids, name
            assert (got.k, got.speculation["k"], got.drafts) == (0, 0, 0)
        else:  # a stream: its text and finish, as the engine without a drafter gives
            assert got == expected, name


def test_a_biased_stream_is_the_non_streamed_answer(speculative: Run) -> None:
    text, finish = speculative.biased["stream banned"]
    assert finish == "length"
    assert text == speculative.biased["chat banned"].text
