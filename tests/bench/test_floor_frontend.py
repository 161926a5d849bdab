"""The pure parts of `bench.floor_timers`, the timer table of `bench.floor_summary` and
`bench.frontend_vs_vllm`: step phases, the attribution table, A B B A order, CLI flags
from engine arguments, the front-end table and verdict. No engine starts here."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from bench.floor_summary import Case, timer_table
from bench.floor_timers import PhaseTimers, step_phase
from bench.frontend_vs_vllm import (
    Pairs,
    Turn,
    abba_order,
    cli_flags,
    paired_verdict,
    pairs_summary,
    rounds_summary,
    summary_rows,
    verdict,
    vllm_command,
)
from engine.settings import EngineSettings


def _output(scheduled: dict[str, int], spec: dict[str, list[int]], new: bool = False) -> object:
    return SimpleNamespace(
        scheduled_new_reqs=[object()] if new else [],
        num_scheduled_tokens=scheduled,
        scheduled_spec_decode_tokens=spec,
    )


def test_a_step_is_prefill_when_it_schedules_prompt_tokens() -> None:
    assert step_phase(_output({"a": 1, "b": 1}, {})) == "decode"
    assert step_phase(_output({"a": 5}, {"a": [1, 2, 3, 4]})) == "decode"  # 1 + 4 drafts
    assert step_phase(_output({"a": 6}, {"a": [1, 2, 3, 4]})) == "prefill"  # a chunk
    assert step_phase(_output({"a": 1}, {}, new=True)) == "prefill"


def test_timers_file_each_call_under_the_steps_phase() -> None:
    ticks = iter([0.0, 0.002, 1.0, 1.005])
    timers = PhaseTimers(clock=lambda: next(ticks))
    timers.phase = "prefill"
    timers.timed("execute_model", lambda: None)()
    timers.phase = "decode"
    timers.timed("execute_model", lambda: None)()
    taken = timers.take()
    assert taken["prefill"]["execute_model"] == [0.002, 1.0]
    assert abs(taken["decode"]["execute_model"][0] - 0.005) < 1e-12
    assert timers.take() == {}


def test_the_table_gives_ms_per_step_and_the_rest_of_the_step() -> None:
    case = Case("spec k=0")
    worker = {"decode": {"execute_model": [0.06, 10], "sample_tokens": [0.01, 10]}}
    core = {"decode": {"core.step": [0.1, 10], "core.schedule": [0.005, 10]}}
    case.absorb([core, worker])
    case.absorb([core, worker])  # a second repeat adds up
    assert case.steps("decode") == 20
    assert case.ms_per_step("decode", "execute_model") == 6.0
    assert abs((case.ms_per_step("decode", "executor+ipc") or 0) - 2.5) < 1e-9
    assert case.ms_per_step("decode", "propose_draft_token_ids") is None
    assert case.ms_per_step("prefill", "execute_model") is None
    text = timer_table([case, Case("no-spec")], "decode")
    assert "execute_model" in text
    assert "6.000" in text
    assert "propose" not in text


def test_abba_alternates_the_order_per_pair() -> None:
    assert abba_order(3, ["A", "B"]) == ["A", "B", "B", "A", "A", "B"]


def test_cli_flags_follow_vllms_spelling() -> None:
    flags = cli_flags(
        {
            "max_num_seqs": 32,
            "enforce_eager": True,
            "async_scheduling": None,
            "enable_prefix_caching": False,
            "served_model_name": ["specgw-default"],
            "speculative_config": {"method": "eagle3", "num_speculative_tokens": 4},
        }
    )
    assert flags[:3] == ["--max-num-seqs", "32", "--enforce-eager"]
    assert "--no-enable-prefix-caching" in flags
    assert "--async-scheduling" not in flags
    at = flags.index("--served-model-name")
    assert flags[at + 1] == "specgw-default"
    spec = json.loads(flags[flags.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "num_speculative_tokens": 4}


def test_the_vllm_command_carries_the_gateways_engine_configuration(tmp_path: Path) -> None:
    settings = EngineSettings(model=tmp_path / "t", drafter=tmp_path / "d", max_depth=3)
    cmd = vllm_command(settings, 8123)
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "t")
    assert cmd[cmd.index("--port") + 1] == "8123"
    for flag, value in [
        ("--scheduler-cls", "engine.vllm.scheduler.AutoSpecDepthScheduler"),
        ("--worker-extension-cls", "engine.vllm.worker.SpecGatewayWorker"),
        ("--max-num-seqs", "32"),
        ("--per-request-spec-decode-metrics", "detailed"),
    ]:
        assert cmd[cmd.index(flag) + 1] == value, flag
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 3
    assert spec["model"] == str(tmp_path / "d")


def test_the_verdict_reads_medians_over_turns() -> None:
    gw = [Turn([0.0100, 0.0110, 0.0200], 0.0024, 50.0), Turn([0.0102, 0.0111, 0.0150], 0.0026, 48)]
    vl = [Turn([0.0098, 0.0105, 0.0140], 0.0020, 52.0), Turn([0.0100, 0.0109, 0.0150], 0.0022, 51)]
    turns = {"gateway": gw, "vllm": vl}
    rows = summary_rows(turns)
    assert rows[1].startswith("gateway")
    assert rows[2].startswith("vllm")
    lines = verdict(turns)
    assert lines[0].startswith("TTFT p50 gateway - vllm: +0.35 ms")
    assert "1.19x" in lines[2]


def test_the_paired_verdict_reads_each_pair_of_neighbouring_turns() -> None:
    """Both servers 10 ms slower in the second pair (the host's drift): the medians over
    turns mix it in, the pairs do not."""
    gw = [Turn([0.020] * 10, 0.0050, 40.0), Turn([0.031] * 10, 0.0069, 38.0)]
    vl = [Turn([0.019] * 10, 0.0040, 42.0), Turn([0.029] * 10, 0.0060, 40.0)]
    lines = paired_verdict({"gateway": gw, "vllm": vl})
    assert lines[0].startswith("paired by neighbouring turns (2 pairs)")
    assert lines[1].startswith("TTFT p50 gateway - vllm: +1.50 ms [+1.00 to +2.00]")
    assert lines[3].startswith("CPU per request gateway / vllm: 1.20x [1.15 to 1.25]")
    assert paired_verdict({"gateway": [], "vllm": []}) == []


def test_the_interleaved_summary_pairs_each_prompt_with_itself() -> None:
    """The host's drift moves both servers alike from prompt to prompt: the per-prompt
    difference stays at 1 ms with a tight interval while each server's own TTFTs spread
    over 20 ms."""
    vllm = [0.020 + 0.0001 * i for i in range(200)]
    gateway = [t + 0.001 for t in vllm]
    lines = pairs_summary(Pairs(gateway, vllm, {"gateway": 0.006, "vllm": 0.005}))
    assert lines[0] == "interleaved: 200 prompts, each on both servers one after the other"
    assert lines[1].endswith("front-end CPU 6.00 ms/request")
    assert lines[3].startswith("TTFT p50 gateway - vllm: +1.00 ms")
    assert lines[5] == "median per-prompt difference: +1.00 ms [95 % +1.00 to +1.00]"
    assert pairs_summary(Pairs()) == []


def test_the_p50_excess_interval_is_wide_when_the_pairs_disagree() -> None:
    vllm = [0.020] * 100
    gateway = [0.018, 0.024] * 50  # median +1 ms, but half the prompts are 2 ms faster
    line = pairs_summary(Pairs(gateway, vllm))[3]
    low, high = (float(x) for x in line.split("[95 % ")[1].split("]")[0].split(" to "))
    assert low < 0 < high


def test_rounds_are_reported_one_by_one_and_pooled() -> None:
    rounds = [
        Pairs([0.021] * 10, [0.020] * 10, {"gateway": 0.004, "vllm": 0.004}),
        Pairs([0.030] * 10, [0.0302] * 10, {"gateway": 0.006, "vllm": 0.004}),
    ]
    lines = rounds_summary(rounds)
    assert lines[1] == "median per-prompt difference by round: +1.00, -0.20 ms (median +0.40)"
    assert lines[2].startswith("interleaved: 20 prompts")
    assert lines[3].endswith("front-end CPU 5.00 ms/request")
    assert rounds_summary([]) == []
