"""Plain depth-0 steps take no EAGLE-3 aux hidden states (`engine.vllm.draft_skip._aux_capture`).

The first tests read the vLLM code the skip rests on, so that a vLLM that moves it fails
here; the others drive the installed wrappers on a runner made with `object.__new__`
(no model): the aux capture is off inside a depth-0 step and back on after it.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import torch
from vllm.model_executor.models.interfaces import EagleModelMixin
from vllm.model_executor.models.llama import LlamaModel
from vllm.v1.worker.cpu_model_runner import CPUModelRunner

from engine.vllm.draft_skip import DraftSkipExtension

LAYERS = (2, 8, 13)


def test_the_runner_unpacks_aux_states_only_while_asked() -> None:
    source = inspect.getsource(CPUModelRunner.execute_model)
    assert "if self.use_aux_hidden_state_outputs:" in source
    assert "hidden_states, aux_hidden_states = model_output" in source


def test_the_target_returns_aux_states_only_when_it_took_some() -> None:
    assert "if len(aux_hidden_states) > 0:" in inspect.getsource(LlamaModel.forward)


def test_an_empty_layer_set_captures_nothing() -> None:
    holder = object.__new__(EagleModelMixin)
    hidden, residual = torch.ones(2, 4), torch.ones(2, 4)
    holder.aux_hidden_state_layers = LAYERS
    assert len(holder._maybe_add_hidden_state([], 8, hidden, residual)) == 1
    holder.aux_hidden_state_layers = ()
    assert holder._maybe_add_hidden_state([], 8, hidden, residual) == []


class _Worker(DraftSkipExtension):
    def __init__(self, runner: Any) -> None:
        self.model_runner = runner


def _runner(enforce_eager: bool) -> tuple[Any, list[tuple[bool, tuple[int, ...]]]]:
    """A V1 CPU runner without a model; `seen` records (aux on, layers) in each call."""
    runner: Any = object.__new__(CPUModelRunner)
    holder = SimpleNamespace(aux_hidden_state_layers=LAYERS)
    seen: list[tuple[bool, tuple[int, ...]]] = []

    def execute_model(scheduler_output: Any) -> None:
        seen.append((runner.use_aux_hidden_state_outputs, holder.aux_hidden_state_layers))

    runner.speculative_config = object()
    runner.use_async_scheduling = False
    runner.use_aux_hidden_state_outputs = True
    runner.model_config = SimpleNamespace(enforce_eager=enforce_eager)
    runner.model = SimpleNamespace(model=holder)
    runner.execute_model = execute_model
    runner.sample_tokens = lambda grammar_output: None
    runner._input_fits_in_drafter = lambda common_attn_metadata: True
    return runner, seen


def test_a_depth_zero_step_runs_without_aux_capture_and_restores_it() -> None:
    runner, seen = _runner(enforce_eager=True)
    assert _Worker(runner).specgw_install_draft_skip()
    runner.execute_model(SimpleNamespace(num_spec_tokens_to_schedule=0))
    runner.execute_model(SimpleNamespace(num_spec_tokens_to_schedule=2))
    assert seen == [(False, ()), (True, LAYERS)]
    assert runner.use_aux_hidden_state_outputs is True
    assert runner.model.model.aux_hidden_state_layers == LAYERS


def test_a_compiled_model_keeps_its_aux_capture() -> None:
    runner, seen = _runner(enforce_eager=False)
    assert _Worker(runner).specgw_install_draft_skip()
    runner.execute_model(SimpleNamespace(num_spec_tokens_to_schedule=0))
    assert seen == [(True, LAYERS)]
