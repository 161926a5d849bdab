"""The engine arguments' platform defaults (`engine.vllm.engine_args`): on CUDA, graphs
(not eager) and a capture schedule that gives Model Runner V2 a FULL graph of every
width 1 + k, k = 0 included; on the CPU, eager and nothing added; the operator's own
schedule or eager setting wins. vLLM's real `AsyncEngineArgs`; no engine."""

from __future__ import annotations

from engine.settings import EngineSettings
from engine.vllm.batch_depth import CAPTURE_SCHEDULE_KEY, PREFILL_STEP_KEY, full_batches
from engine.vllm.engine_args import engine_args
from tools.model.testing_models import TinyModels


def test_cuda_runs_graphs_by_default_and_captures_every_width(tiny: TinyModels) -> None:
    settings = EngineSettings(model=tiny.target, drafter=tiny.drafter, max_depth=4)
    args = engine_args(settings, device="cuda")
    assert args.enforce_eager is False
    spec = args.speculative_config
    assert spec is not None
    assert sorted(k for _, _, k in spec["num_speculative_tokens_per_batch_size"]) == [0, 1, 2, 3, 4]
    assert args.additional_config == {CAPTURE_SCHEDULE_KEY: True}
    sizes = args.compilation_config.cudagraph_capture_sizes
    assert set(full_batches(range(5), sizes, 256)) == {0, 1, 2, 3, 4}
    assert args.max_num_seqs == 256
    assert args.max_model_len is None  # vLLM's: the model's own length


def test_the_cpu_stays_eager_with_nothing_added(tiny: TinyModels) -> None:
    settings = EngineSettings(model=tiny.target, drafter=tiny.drafter, max_depth=4)
    args = engine_args(settings, device="cpu")
    assert args.enforce_eager is True
    assert args.speculative_config is not None
    assert "num_speculative_tokens_per_batch_size" not in args.speculative_config
    assert not args.additional_config
    assert args.max_num_seqs == 32


def test_the_operators_schedule_and_eager_setting_win(tiny: TinyModels) -> None:
    own = EngineSettings(
        model=tiny.target,
        drafter=tiny.drafter,
        spec_tokens_per_batch_size=[(1, 8, 4), (9, 64, 2)],
        prefill_step_depth=1,
    )
    args = engine_args(own, device="cuda")
    assert args.speculative_config is not None
    assert args.speculative_config["num_speculative_tokens_per_batch_size"] == [
        [1, 8, 4],
        [9, 64, 2],
    ]
    assert args.additional_config == {PREFILL_STEP_KEY: 1}
    eager = EngineSettings(model=tiny.target, drafter=tiny.drafter, enforce_eager=True)
    args = engine_args(eager, device="cuda")
    assert args.enforce_eager is True
    assert not args.additional_config


def test_no_drafter_no_schedule(tiny: TinyModels) -> None:
    args = engine_args(EngineSettings(model=tiny.target), device="cuda")
    assert args.speculative_config is None
    assert args.enforce_eager is False
    assert not args.additional_config
