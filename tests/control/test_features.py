"""Classification stability: what must not split a class, and what must."""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

import pytest

from gateway.control.classify import class_id_of, label_of
from gateway.control.features import (
    IdentityCache,
    RequestFeatures,
    features_from_chat,
    features_from_completion,
    length_bucket,
    normalise_text,
    sampling_bucket,
    unserved_by_drafts,
)


def chat(system: str | None, user: str = "hi", **kw: Any) -> RequestFeatures:
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    messages.extend(kw.pop("history", []))
    return features_from_chat(
        messages,
        kw.get("tools"),
        kw.get("tool_choice"),
        kw.get("response_format"),
        kw.get("prompt_tokens", 300),
        sampling=kw.get("sampling", ""),
    )


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}

SAME = [
    (
        "date",
        "You are a helpful assistant. Today is 2026-11-22.",
        "You are a helpful assistant. Today is 2027-01-03.",
    ),
    (
        "long date and weekday",
        "Current date: Sunday, November 22, 2026 at 10:15 am.",
        "Current date: Monday, March 3, 2025 at 9:05 pm.",
    ),
    ("user name", "You are assisting Alice Smith.", "You are assisting Bob Jones."),
    ("email", "Contact: alice@example.com for help.", "Contact: bob.j@corp.io for help."),
    (
        "uuid and number",
        "Session 123e4567-e89b-12d3-a456-426614174000, quota 500 tokens.",
        "Session 9f1c2d3e-0000-4abc-8def-0123456789ab, quota 1200 tokens.",
    ),
    ("whitespace", "Be   concise.\n\nAnswer in English.", "Be concise. Answer in English."),
]


@pytest.mark.parametrize(("name", "a", "b"), SAME, ids=[case[0] for case in SAME])
def test_volatile_system_prompt_parts_do_not_split_a_class(name: str, a: str, b: str) -> None:
    assert class_id_of(chat(a)) == class_id_of(chat(b))


DIFFERENT = [
    ("tools vs none", chat("S", tools=[TOOL]), chat("S")),
    (
        "tool_choice required",
        chat("S", tools=[TOOL], tool_choice="required"),
        chat("S", tools=[TOOL]),
    ),
    ("json response", chat("S", response_format={"type": "json_object"}), chat("S")),
    ("other system prompt", chat("You write poems."), chat("You write SQL.")),
    ("no system prompt", chat(None), chat("You write SQL.")),
    ("length bucket", chat("S", prompt_tokens=100), chat("S", prompt_tokens=5000)),
    (
        "tool results in history",
        chat("S", history=[{"role": "tool", "content": "{}", "tool_call_id": "1"}]),
        chat("S"),
    ),
    ("sampled vs greedy", chat("S", sampling="t1"), chat("S")),
    ("sampled hotter", chat("S", sampling="t1"), chat("S", sampling="t0.5")),
]


@pytest.mark.parametrize(("name", "a", "b"), DIFFERENT, ids=[case[0] for case in DIFFERENT])
def test_what_changes_acceptance_does_split(
    name: str, a: RequestFeatures, b: RequestFeatures
) -> None:
    assert class_id_of(a) != class_id_of(b)


COMPLETIONS = [
    ("<|im_start|>system\nYou are X.<|im_end|>\n<|im_start|>user\nhi<|im_end|>", "chatml"),
    ("[INST] <<SYS>>\nYou are X.\n<</SYS>>\n\nhi [/INST]", "llama2"),
    ("Below is an instruction.\n\n### Instruction:\nhi\n\n### Response:\n", "alpaca"),
    ("def fibonacci(n):\n", "code"),
    ("Once upon a time", "plain"),
]


@pytest.mark.parametrize(("prompt", "template"), COMPLETIONS)
def test_raw_prompt_templates_are_fingerprinted(prompt: str, template: str) -> None:
    features = features_from_completion(prompt, 40)
    assert features.template == template
    assert label_of(features).startswith(template)


def test_raw_system_prompt_identity_ignores_dates() -> None:
    a = features_from_completion(
        "<|im_start|>system\nToday is 2026-11-22.<|im_end|>\n<|im_start|>user\nhi<|im_end|>", 40
    )
    b = features_from_completion(
        "<|im_start|>system\nToday is 2026-12-01.<|im_end|>\n<|im_start|>user\nyo<|im_end|>", 40
    )
    c = features_from_completion(
        "<|im_start|>system\nYou are a pirate.<|im_end|>\n<|im_start|>user\nhi<|im_end|>", 40
    )
    assert a == b
    assert a.system_id
    assert a.system_id != c.system_id


def test_multi_turn_is_bucketed_not_counted() -> None:
    turn = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    four = chat("S", history=turn * 5)
    five = chat("S", history=turn * 6)
    assert four.turns == five.turns == 4
    assert chat("S").turns == 1


@pytest.mark.parametrize(
    ("tokens", "bucket"), [(0, 64), (64, 64), (65, 128), (300, 512), (10**6, 32768)]
)
def test_length_buckets(tokens: int, bucket: int) -> None:
    assert length_bucket(tokens) == bucket


def test_label_is_short_and_readable() -> None:
    features = chat("S", tools=[TOOL], response_format={"type": "json_object"}, prompt_tokens=400)
    label = label_of(features)
    assert label == f"chat/sys:{features.system_id[:4]}/tools/json_object/len:512"


@pytest.mark.parametrize(
    ("temperature", "bucket"),
    [(0.0, ""), (9e-6, ""), (0.2, "t0.5"), (0.5, "t0.5"), (0.7, "t1"), (1.0, "t1"), (1.5, "t2")],
)
def test_sampling_buckets(temperature: float, bucket: str) -> None:
    assert sampling_bucket(temperature) == bucket


@pytest.mark.parametrize(
    ("logit_bias", "min_p", "named"),
    [
        (None, None, ""),
        ({}, 0.0, ""),
        (None, 9e-6, ""),  # below vLLM's bound: unset
        ({"42": -100.0}, None, "logit_bias"),
        (None, 0.1, "min_p"),
        ({"7": 5.0}, 0.05, "logit_bias and min_p"),
    ],
)
def test_logit_bias_and_min_p_are_unserved_by_drafts(
    logit_bias: dict[str, float] | None, min_p: float | None, named: str
) -> None:
    reason = unserved_by_drafts(logit_bias, min_p)
    assert reason == (
        f"unserved {named}: served only to a request that never drafts" if named else ""
    )


def test_a_sampled_class_is_labelled_with_its_bucket_and_a_greedy_one_keeps_its_id() -> None:
    """Greedy requests hash what they hashed before sampled ones were classed apart."""
    assert label_of(chat("S", prompt_tokens=40, sampling="t1")).endswith("/len:64/t1")
    assert class_id_of(RequestFeatures("chat", sampling="")) == "53d1cebfaf59dc7f"
    sampled = features_from_completion("def f():\n", 40, sampling="t0.5")
    assert sampled.canonical().endswith("|64|t0.5")
    assert label_of(sampled) == "code/len:64/t0.5"


def test_class_id_is_a_stable_hash_not_a_counter() -> None:
    """Same id in every process and release: Redis keys and flag targets depend on it."""
    canonical = b"v1|chat||1|0|0|||64"
    assert class_id_of(RequestFeatures("chat")) == blake2b(canonical, digest_size=8).hexdigest()
    assert class_id_of(RequestFeatures("chat")) == "53d1cebfaf59dc7f"
    assert normalise_text("Hi Alice, it is 10:30 on 2026-11-22") == "hi <name>, it is <t> on <d>"


def test_identity_cache_gives_the_same_identity() -> None:
    cache = IdentityCache(size=2)
    system = "You are helpful. Today is 2026-11-22."
    cached = chat(system)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
    for _ in range(3):
        assert features_from_chat(messages, None, None, None, 300, cache) == cached
    for text in ("a", "b", "c"):  # overflow clears, never grows past the bound
        cache(text)
    assert len(cache._ids) <= 2
