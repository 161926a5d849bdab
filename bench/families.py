"""Request families for the replay: the embedded model's own when present, else a local set.

The benchmark must mirror the traffic the drafter was (and was not) trained on,
so it prefers `tools.model.families` (the prompts the embedded model was built
around, held-out split). Until that module exists, or when its API is not the one
expected, a small deterministic local set with the same six family names stands
in, and the report says which source was used.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

FAMILIES: tuple[str, ...] = (
    "chat_main",
    "code",
    "chat_alt_template",
    "chat_unfamiliar_system",
    "tool_call",
    "long_context",
)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request body in family terms: chat `messages` (+ `tools`) or a raw `prompt`."""

    family: str
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


PromptPool = dict[str, list[Prompt]]

#: Main-template chat sent sampled, as most chat clients send it: the same prompts at
#: this temperature (each request with its own seed, `bench.replay`). A sampled draft
#: is accepted with probability min(1, p/q), so the class accepts fewer drafts than
#: its greedy twin (default model, k = 3: 1.64 at T = 0.7 against about 3 greedy).
SAMPLED_FAMILY = "chat_sampled"
SAMPLED_TEMPERATURE = 0.7


def load_pool(per_family: int, seed: int) -> tuple[PromptPool, str]:
    """(prompts by family, source name). Prefers the embedded model's families."""
    pool = _from_engine_model(per_family, seed)
    if pool is not None:
        return with_sampled(pool), "tools.model.families"
    return with_sampled(local_pool(per_family, seed)), "bench.families (local stand-in)"


def with_sampled(pool: PromptPool) -> PromptPool:
    """`pool` plus `SAMPLED_FAMILY`: its main-template chat prompts, sampled."""
    sampled = [
        replace(p, family=SAMPLED_FAMILY, extra={**p.extra, "temperature": SAMPLED_TEMPERATURE})
        for p in pool.get("chat_main", [])
    ]
    return {**pool, SAMPLED_FAMILY: sampled} if sampled else dict(pool)


def _from_engine_model(per_family: int, seed: int) -> PromptPool | None:
    """Held-out prompts of the embedded model's families, None when absent."""
    try:
        from tools.model import families as model_families
        from tools.model.corpus import load_corpus
    except ImportError:
        return None
    maker: Callable[..., list[Any]] | None = getattr(model_families, "family_prompts", None)
    if maker is None:
        return None
    docs = load_corpus()
    names: tuple[str, ...] = getattr(model_families, "FAMILIES", FAMILIES)
    return {
        name: [
            _coerce(name, p) for p in maker(docs, name, split="heldout", n=per_family, seed=seed)
        ]
        for name in names
    }


def _coerce(name: str, item: Any) -> Prompt:
    messages = getattr(item, "messages", None)
    tools = getattr(item, "tools", None)
    prompt = getattr(item, "prompt", None)
    return Prompt(
        family=name,
        messages=[dict(m) for m in messages] if messages else None,
        tools=list(tools) if tools else None,
        prompt=prompt if messages is None else None,
    )


# ---- the local stand-in ---------------------------------------------------------------

_TOPICS = (
    "sorting a list of tuples",
    "reading a CSV file",
    "the difference between a list and a tuple",
    "writing a context manager",
    "parsing dates",
    "using a dictionary as a cache",
    "handling exceptions in a loop",
    "formatting strings",
    "iterating over files in a directory",
    "making an HTTP request",
)
_SYSTEM = "You are a helpful assistant."
_UNFAMILIAR = (
    "You are Captain Byte, a pirate who answers only in nautical metaphors. Arr.",
    "System policy v7.3: responses must be terse, in British English, no lists, and must "
    "mention the compliance code ZX-41 at least once. " * 4,
)
#: The tool the tool-call family offers (and `bench.gpu_smoke`'s tool check).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
_TOOLS = [WEATHER_TOOL]
_CITIES = ("Paris", "Lagos", "Osaka", "Lima", "Oslo", "Perth")
_CODE_HEADS = (
    "def fibonacci(n):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "import os\n\ndef list_python_files(root):\n    ",
    "def merge_sorted(a, b):\n    result = []\n    ",
)


def _chat_main(rng: random.Random) -> Prompt:
    topic = rng.choice(_TOPICS)
    return Prompt(
        "chat_main",
        messages=[
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": f"Explain {topic} in Python."},
        ],
    )


def _code(rng: random.Random) -> Prompt:
    return Prompt("code", prompt=rng.choice(_CODE_HEADS))


def _alt_template(rng: random.Random) -> Prompt:
    topic = rng.choice(_TOPICS)
    text = f"[INST] <<SYS>>\n{_SYSTEM}\n<</SYS>>\n\nExplain {topic} in Python. [/INST]"
    return Prompt("chat_alt_template", prompt=text)


def _unfamiliar(rng: random.Random) -> Prompt:
    topic = rng.choice(_TOPICS)
    return Prompt(
        "chat_unfamiliar_system",
        messages=[
            {"role": "system", "content": rng.choice(_UNFAMILIAR)},
            {"role": "user", "content": f"Explain {topic} in Python."},
        ],
    )


def _tool_call(rng: random.Random) -> Prompt:
    city = rng.choice(_CITIES)
    call = {"name": "get_weather", "arguments": json.dumps({"city": city})}
    return Prompt(
        "tool_call",
        messages=[
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": f"What is the weather in {city}? Answer as JSON."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_0", "type": "function", "function": call}],
            },
            {
                "role": "tool",
                "tool_call_id": "call_0",
                "content": json.dumps({"city": city, "temp_c": rng.randint(-5, 35)}),
            },
        ],
        tools=_TOOLS,
    )


def _long_context(rng: random.Random) -> Prompt:
    paragraphs = [f"Note {i}: {rng.choice(_TOPICS)} matters here." for i in range(60)]
    return Prompt(
        "long_context",
        messages=[
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": "\n".join(paragraphs) + "\nSummarise the notes."},
        ],
    )


_MAKERS: dict[str, Callable[[random.Random], Prompt]] = {
    "chat_main": _chat_main,
    "code": _code,
    "chat_alt_template": _alt_template,
    "chat_unfamiliar_system": _unfamiliar,
    "tool_call": _tool_call,
    "long_context": _long_context,
}


def local_pool(per_family: int, seed: int) -> PromptPool:
    """Deterministic prompts per family from one seed (no I/O, no model needed)."""
    rng = random.Random(seed)
    return {name: [_MAKERS[name](rng) for _ in range(per_family)] for name in FAMILIES}


def fit_pool(
    pool: PromptPool, target: Path, max_model_len: int | None, max_tokens: int
) -> tuple[PromptPool, int]:
    """(the prompts whose rendered length + max_tokens fits the context, how many were dropped).

    Counted with the served target's own tokenizer and chat template, as the engine
    will; a prompt that cannot fit would only measure a 400. `max_model_len` None: the
    target's own (`max_position_embeddings`), as the engine derives it.
    """
    from transformers import AutoConfig, AutoTokenizer

    if max_model_len is None:
        max_model_len = int(AutoConfig.from_pretrained(str(target)).max_position_embeddings)

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    budget = max_model_len - max_tokens
    kept: PromptPool = {}
    dropped = 0
    for family, prompts in pool.items():
        fits = [p for p in prompts if _length(tokenizer, p) <= budget]
        dropped += len(prompts) - len(fits)
        kept[family] = fits
    return kept, dropped


def prompt_tokens(prompts: list[Prompt], target: Path) -> list[int]:
    """Each prompt's length in the target's tokenizer and chat template, as the engine counts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    return [_length(tokenizer, p) for p in prompts]


def _length(tokenizer: Any, p: Prompt) -> int:
    if p.messages is None:
        return len(tokenizer.encode(p.prompt or ""))
    ids = tokenizer.apply_chat_template(
        p.messages, tools=p.tools, tokenize=True, add_generation_prompt=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)
