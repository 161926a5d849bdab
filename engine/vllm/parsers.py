"""The tool-call and reasoning parsers vLLM's serving layer runs, chosen from the model.

A tool parser reads the text a model emits for a call, and each family emits its own:
Llama 3.x JSON after `<|python_tag|>` or bare (`llama3_json`), Hermes / Qwen
`<tool_call>` tags (`hermes`), Mistral `[TOOL_CALLS]`, and so on. The wrong parser
fails silently: `tool_choice=auto` returns the call as plain `content`. So `auto`
reads what the model's own chat template teaches it to emit (the markers below, then
`model_type`), and a template that renders tools in a format not listed here is
refused at start with a request to name the parser, rather than guessed. A template
that never renders tools gets no parser: vLLM then answers `tool_choice=auto` with a
400 instead of returning a call as text.

Reasoning parsers split `<think>` sections into `reasoning_content`; one is chosen
only for a family known to think (`model_type`), and a template that opens `<think>`
in another family asks for the setting too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.settings import EngineSettings
from engine.vllm.model_source import ModelSource, ModelSourceError, hub_token, model_source

AUTO = "auto"

#: Chat-template markers -> the vLLM tool parser that reads what they teach, first match
#: wins (Llama 4's `<|python_start|>` before Llama 3's `<|python_tag|>`).
TOOL_MARKERS: tuple[tuple[str, str], ...] = (
    ("<|python_start|>", "llama4_pythonic"),
    ("<|python_tag|>", "llama3_json"),
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<｜tool▁calls▁begin｜>", "deepseek_v3"),
    ("<|tool_call|>", "granite"),
)
#: `model_type` -> tool parser, for families whose template carries no marker above.
TOOL_BY_MODEL_TYPE: dict[str, str] = {"gpt_oss": "openai"}
#: `model_type` -> reasoning parser, for families that think.
REASONING_BY_MODEL_TYPE: dict[str, str] = {
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "deepseek_v3": "deepseek_r1",
    "gpt_oss": "openai_gptoss",
}


class ParserChoiceError(ValueError):
    """No parser can be chosen for the model without guessing; the message is one line."""


@dataclass(frozen=True, slots=True)
class Parsers:
    """What vLLM's serving layer is started with (None: that parser off)."""

    tool_call: str | None
    reasoning: str | None


def tool_parser_for(template: str | None, model_type: str, ref: str) -> str | None:
    """The tool parser the template's call format needs (see the module docstring)."""
    for marker, parser in TOOL_MARKERS:
        if template and marker in template:
            return parser
    if model_type in TOOL_BY_MODEL_TYPE:
        return TOOL_BY_MODEL_TYPE[model_type]
    if not template or "tools" not in template:
        return None
    raise ParserChoiceError(
        f"target {ref}: its chat template renders tools in a format spec-gateway does not "
        f"recognise (model_type {model_type!r}); set engine.tool_call_parser to vLLM's "
        "parser for it (e.g. hermes, llama3_json, mistral), or null for none"
    )


def reasoning_parser_for(template: str | None, model_type: str, ref: str) -> str | None:
    """The reasoning parser of a family that thinks; None for one that does not."""
    if model_type in REASONING_BY_MODEL_TYPE:
        return REASONING_BY_MODEL_TYPE[model_type]
    if template and "<think>" in template:
        raise ParserChoiceError(
            f"target {ref}: its chat template opens <think> (model_type {model_type!r}); set "
            "engine.reasoning_parser to vLLM's parser for it (e.g. deepseek_r1), or null"
        )
    return None


def choose_parsers(
    settings: EngineSettings,
    config: Mapping[str, Any],
    template: str | None,
    ref: str,
) -> Parsers:
    """The settings' parsers, `auto` resolved from the target's config and template."""
    model_type = str(config.get("model_type", ""))
    tool = settings.tool_call_parser
    reasoning = settings.reasoning_parser
    return Parsers(
        tool_parser_for(template, model_type, ref) if tool == AUTO else tool,
        reasoning_parser_for(template, model_type, ref) if reasoning == AUTO else reasoning,
    )


def chat_template_of(source: ModelSource, token: str | None) -> str | None:
    """The model's chat template: `chat_template.jinja`, else `tokenizer_config.json`'s
    `chat_template` (a string, or a list of named templates: the `default` one and the
    `tool_use` one together, since both are what the model may be shown)."""
    jinja = _model_file(source, "chat_template.jinja", token)
    if jinja is not None:
        return jinja.read_text(encoding="utf-8")
    config_file = _model_file(source, "tokenizer_config.json", token)
    if config_file is None:
        return None
    try:
        value = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"target {source.ref}: tokenizer_config.json: {exc}") from exc
    if isinstance(value, list):
        return "\n".join(str(item.get("template", "")) for item in value if isinstance(item, dict))
    return value if isinstance(value, str) else None


def _model_file(source: ModelSource, name: str, token: str | None) -> Path | None:
    """One file of the model, local or from the Hub (None: the model has none)."""
    if source.local is not None:
        path = source.local / name
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(source.ref, name, token=token))
    except EntryNotFoundError:
        return None


def resolved_parsers(settings: EngineSettings, environ: Mapping[str, str]) -> Parsers:
    """The parsers for the settings' target, reading its config and chat template."""
    if settings.tool_call_parser != AUTO and settings.reasoning_parser != AUTO:
        return Parsers(settings.tool_call_parser, settings.reasoning_parser)
    from engine.vllm.model_source import read_config

    target, _ = settings.resolved_models()
    token = hub_token(environ)
    source = model_source(target, "target")
    template = chat_template_of(source, token)
    return choose_parsers(settings, read_config(source, token), template, source.ref)


def check_parsers_known(parsers: Parsers) -> None:
    """Each named parser is one vLLM has (its registries), else one line naming it."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    checks = (
        ("tool_call_parser", parsers.tool_call, ToolParserManager),
        ("reasoning_parser", parsers.reasoning, ReasoningParserManager),
    )
    for key, name, manager in checks:
        if name is None:
            continue
        known = _registered(manager)
        if known and name not in known:
            raise ParserChoiceError(
                f"engine.{key}: vLLM has no parser {name!r} (it has: {', '.join(sorted(known))})"
            )


def _registered(manager: Any) -> set[str]:
    """The names a vLLM parser registry knows (eager and lazily imported ones)."""
    names: set[str] = set()
    for attr in ("tool_parsers", "reasoning_parsers", "lazy_parsers"):
        table = getattr(manager, attr, None)
        if isinstance(table, dict):
            names |= set(table)
    return names


__all__ = [
    "AUTO",
    "ParserChoiceError",
    "Parsers",
    "chat_template_of",
    "check_parsers_known",
    "choose_parsers",
    "reasoning_parser_for",
    "resolved_parsers",
    "tool_parser_for",
]
