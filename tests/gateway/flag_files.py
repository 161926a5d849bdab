"""flags.json for a real gateway under test: the code's defaults with a few changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai

from gateway.flags.document import flags_document


def write_flags(
    directory: Path,
    defaults: dict[str, Any],
    targeted: dict[str, tuple[str, Any]] | None = None,
) -> None:
    """Write `flags.json` atomically (the gateway polls it): `defaults` set flags' default
    values, `targeted` gives a flag another value for labels with a prefix (flag ->
    (label prefix, value))."""
    doc = flags_document()
    flags: dict[str, Any] = doc["flags"]
    for flag, (prefix, value) in (targeted or {}).items():
        flags[flag]["variants"]["targeted"] = value
        flags[flag]["targeting"] = {
            "if": [{"starts_with": [{"var": "label"}, prefix]}, "targeted", "default"]
        }
    for flag, value in defaults.items():
        flags[flag]["variants"]["default"] = value
    tmp = directory / "flags.json.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(directory / "flags.json")


def chat_k(client: openai.OpenAI, model: str, text: str, max_tokens: int = 4) -> int:
    """The k the gateway ran a short greedy chat request at (`x-specgw-k`)."""
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        temperature=0,
    )
    raw.parse()
    return int(raw.headers["x-specgw-k"])
