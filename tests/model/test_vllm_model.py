"""The shipped default model in real vLLM: acceptance, spec-on == spec-off, tool calls.

One engine at a time (2 shared cores): the module's fixture runs the held-out
prompts through the EAGLE 3.1 engine (k = 3), shuts it down, then through the
same target without speculation, and the tests compare the recorded outputs.
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.models import embedded_model
from tools.model.corpus import load_corpus
from tools.model.families import FamilyPrompt, family_prompts
from tools.model.measure import Sample, open_llm, run_prompts, summarise

pytestmark = pytest.mark.engine
MAX_TOKENS = 48


@dataclass(frozen=True, slots=True)
class Runs:
    prompts: list[FamilyPrompt]
    spec: list[Sample]
    plain: list[Sample]
    tool_texts: list[str]


def _prompts() -> list[FamilyPrompt]:
    docs = load_corpus()
    return family_prompts(docs, "chat_main", n=12) + family_prompts(docs, "code", n=12)


@pytest.fixture(scope="module")
def runs() -> Runs:
    models = embedded_model()
    assert models is not None, "the embedded default model is not built"
    prompts = _prompts()
    tools = family_prompts(load_corpus(), "tool_call", n=4)
    llm: Any = open_llm(models.target, models.drafter, 3)
    spec = run_prompts(llm, prompts, MAX_TOKENS)
    tool_out = [llm.chat(p.messages, _greedy(64), tools=p.tools, use_tqdm=False) for p in tools]
    tool_texts = [o[0].outputs[0].text for o in tool_out]
    del llm
    gc.collect()
    llm = open_llm(models.target, None, 0)
    plain = run_prompts(llm, prompts, MAX_TOKENS)
    del llm
    gc.collect()
    return Runs(prompts, spec, plain, tool_texts)


def _greedy(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def test_acceptance_length_above_1_5_on_chat_main(runs: Runs) -> None:
    main = [s for s in runs.spec if s.family == "chat_main"]
    summary = summarise(main)
    assert summary["acceptance_length"] is not None, summary
    assert summary["acceptance_length"] > 1.5, summary


def test_speculation_does_not_change_greedy_outputs(runs: Runs) -> None:
    assert len(runs.spec) >= 20
    assert all(s.steps > 0 for s in runs.spec), "every request ran speculative steps"
    mismatched = [i for i, (a, b) in enumerate(zip(runs.spec, runs.plain, strict=True))
                  if a.tokens != b.tokens]  # fmt: skip
    assert not mismatched, f"spec-on differs from spec-off on prompts {mismatched}"


def test_hermes_parser_extracts_the_models_own_tool_call(runs: Runs) -> None:
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    models = embedded_model()
    assert models is not None
    tok: Any = AutoTokenizer.from_pretrained(str(models.target))
    parser = Hermes2ProToolParser(tok)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    parsed = [parser.extract_tool_calls(t, request) for t in runs.tool_texts]
    called = [p for p in parsed if p.tools_called]
    assert called, f"no tool call parsed from {runs.tool_texts}"
    for p in called:
        json.loads(p.tool_calls[0].function.arguments)
