"""The tool-call and reasoning parsers chosen from the model (`engine.vllm.parsers`): the
embedded model's template teaches `<tool_call>` tags (hermes), Llama 3.x's JSON after
`<|python_tag|>` (llama3_json); a template with tools in an unknown format is refused
with a request to name the parser; an explicit setting wins; a name vLLM does not have
is refused. Real templates and vLLM's real parser registries; no engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.settings import EngineSettings
from engine.vllm.parsers import (
    ParserChoiceError,
    Parsers,
    check_parsers_known,
    resolved_parsers,
    tool_parser_for,
)
from tools.model.chat_template import CHAT_TEMPLATE
from tools.model.testing_models import TinyModels

#: The custom-tool part of Meta's Llama 3.1 chat template (`tokenizer_config.json` of
#: meta-llama/Llama-3.1-8B-Instruct): calls are JSON, built-in ones follow <|python_tag|>.
LLAMA31_TOOL_PART = (
    "{%- if tools is not none %}{%- set tools_in_user_message = true %}{%- endif %}"
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of '
    "argument name and its value}.' }}"
    "{%- for tool_call in message.tool_calls %}{%- if builtin_tools is defined and "
    "tool_call.name in builtin_tools %}{{- '<|python_tag|>' + tool_call.name + '.call(' }}"
    "{%- endif %}{%- endfor %}<|eot_id|>"
)


def _model_dir(root: Path, model_type: str, template: str | None) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    tokenizer: dict[str, object] = {} if template is None else {"chat_template": template}
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return root


@pytest.mark.parametrize(
    ("template", "model_type", "parser"),
    [
        (CHAT_TEMPLATE, "llama", "hermes"),
        (LLAMA31_TOOL_PART, "llama", "llama3_json"),
        ("{{ '[AVAILABLE_TOOLS]' }}{{ tools }}{{ '[TOOL_CALLS]' }}", "mistral", "mistral"),
        ("{{ messages }}", "gpt_oss", "openai"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "llama", None),
        (None, "llama", None),
    ],
)
def test_the_tool_parser_is_the_one_the_template_teaches(
    template: str | None, model_type: str, parser: str | None
) -> None:
    assert tool_parser_for(template, model_type, "m") == parser


def test_a_template_with_tools_in_an_unknown_format_asks_for_the_setting() -> None:
    with pytest.raises(ParserChoiceError, match=r"set engine.tool_call_parser"):
        tool_parser_for("{% for t in tools %}<<CALL>>{{ t }}{% endfor %}", "newfamily", "m")


def test_a_llama_shaped_model_gets_llama3_json_not_hermes(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "llama", "llama", LLAMA31_TOOL_PART)
    parsers = resolved_parsers(EngineSettings(model=model), {})
    assert parsers == Parsers("llama3_json", None)


def test_the_embedded_template_gets_hermes(tiny: TinyModels, tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "embedded", "llama", CHAT_TEMPLATE)
    assert resolved_parsers(EngineSettings(model=model), {}).tool_call == "hermes"
    # The tiny test model's template renders no tools: no automatic tool choice.
    assert resolved_parsers(EngineSettings(model=tiny.target), {}).tool_call is None


def test_a_thinking_family_gets_its_reasoning_parser(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "qwen3", "qwen3", "<tool_call>{{ tools }}<think>")
    assert resolved_parsers(EngineSettings(model=model), {}) == Parsers("hermes", "qwen3")


def test_an_explicit_setting_wins_and_null_turns_it_off(tmp_path: Path) -> None:
    model = _model_dir(tmp_path / "m", "llama", LLAMA31_TOOL_PART)
    settings = EngineSettings(model=model, tool_call_parser="pythonic", reasoning_parser=None)
    assert resolved_parsers(settings, {}) == Parsers("pythonic", None)
    settings = EngineSettings(model=model, tool_call_parser=None)
    assert resolved_parsers(settings, {}).tool_call is None


def test_a_parser_vllm_does_not_have_is_named() -> None:
    check_parsers_known(Parsers("llama3_json", "qwen3"))
    with pytest.raises(ParserChoiceError, match=r"^engine.tool_call_parser: vLLM has no parser"):
        check_parsers_known(Parsers("llama3-json", None))
