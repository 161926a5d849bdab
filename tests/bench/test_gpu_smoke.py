"""`make gpu-smoke`'s script (`bench.gpu_smoke`; its verdict and report in
`bench.gpu_smoke_verdict`, its readers of the engines' facts in `bench.gpu_smoke_facts`):
what fails a smoke run and what does not, on recorded results; what it reads from
`/metrics`, vLLM's log and the stream; and the whole script end to end in its dry mode
on the CPU build (engine-marked)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bench import gpu_smoke
from bench.families import Prompt
from bench.gateway_proc import GatewayProcess, ModelPaths, descendants
from bench.gpu_smoke import _take_chunk, _take_message, parse_args, tool_items
from bench.gpu_smoke_facts import (
    build_info,
    graph_steps,
    log_facts,
    parse_metrics,
    plan_facts,
    step_depths,
)
from bench.gpu_smoke_verdict import (
    NO_DRAFTER,
    SPECULATIVE,
    Run,
    RunResult,
    SmokeRecord,
    failures,
    looks_like_call,
    notes,
    report,
    smoke_runs,
)
from tests.clock import until_sync
from tests.gateway.conftest import TEST_CALIBRATION

STATIC = {"controller-mode": "static", "pin-k": 4}


def _rec(index: int, text: str, **kw: object) -> SmokeRecord:
    fields: dict[str, object] = {"finish_reason": "length", "output_tokens": 10, "greedy": True}
    fields.update(kw)
    return SmokeRecord("", index, "code", content=text, **fields)  # type: ignore[arg-type]


def _result(run: Run, *records: SmokeRecord, wall_s: float = 2.0) -> RunResult:
    return RunResult(run, wall_s, [replace(r, run=run.label) for r in records])


def _static(c: int, *records: SmokeRecord) -> RunResult:
    return _result(
        Run("static-k4", SPECULATIVE, c, STATIC, "greedy" if c == 1 else "families"), *records
    )


def _plain(c: int, *records: SmokeRecord, wall_s: float = 2.0) -> RunResult:
    return _result(Run(NO_DRAFTER, NO_DRAFTER, c), *records, wall_s=wall_s)


def _tools(*records: SmokeRecord) -> RunResult:
    return _result(Run("tools", SPECULATIVE, 1, STATIC, "tools"), *records)


def _call(
    index: int, name: str = "get_weather", args: str = '{"city": "Paris"}', **kw: object
) -> SmokeRecord:
    fields: dict[str, object] = {"finish_reason": "tool_calls", "offered": ("get_weather",)}
    fields.update(kw)
    return _rec(index, "", tool_calls=[(name, args)], **fields)


# ---- greedy identity ---------------------------------------------------------------


def test_identical_greedy_outputs_at_concurrency_1_pass() -> None:
    same = [_rec(0, "abc"), _rec(1, "xyz")]
    assert failures([_static(1, *same), _plain(1, *same)], "none") == []


def test_a_greedy_difference_at_concurrency_1_fails_with_where() -> None:
    found = failures([_static(1, _rec(0, "abcd")), _plain(1, _rec(0, "abXd"))], "none")
    assert found == [
        "greedy output of #0 code differs at character 2 between speculative static-k4 c1 "
        "and no-drafter no-drafter c1: 'cd' against 'Xd' "
        "(a rerun with --batch-invariant tells numerics from a bug)"
    ]


def test_the_same_text_in_a_different_number_of_tokens_fails() -> None:
    found = failures([_static(1, _rec(0, "ab", output_tokens=3)), _plain(1, _rec(0, "ab"))], "none")
    assert len(found) == 1
    assert "(3 against 10 tokens)" in found[0]


def test_a_bf16_difference_at_concurrency_4_is_a_note_not_a_failure() -> None:
    """Batch shape flips near-ties in bf16 (the old smoke failed on this)."""
    results = [_static(4, _rec(0, "abcd")), _plain(4, _rec(0, "abXd"))]
    assert failures(results, "none") == []
    (note,) = notes(results)
    assert "static-k4 c4" in note
    assert "not a failure" in note


def test_in_batch_invariant_mode_a_difference_at_concurrency_4_fails() -> None:
    results = [_static(4, _rec(0, "abcd")), _plain(4, _rec(0, "abXd"))]
    assert len(failures(results, "none", batch_invariant=True)) == 1
    assert notes(results, batch_invariant=True) == []


def test_the_kill_switch_on_the_speculative_engine_is_not_the_baseline() -> None:
    """k = 0 on the drafter's engine is not compared: only static K against no drafter."""
    k0 = _result(Run("k0", SPECULATIVE, 1, {"speculation-enabled": False}), _rec(0, "zz"))
    assert failures([_static(1, _rec(0, "ab")), k0, _plain(1, _rec(0, "ab"))], "none") == []


def test_a_sampled_output_may_differ() -> None:
    spec, plain = _rec(0, "abcd", greedy=False), _rec(0, "wxyz", greedy=False)
    assert failures([_static(1, spec), _plain(1, plain)], "none") == []


def test_an_error_or_a_stream_without_a_finish_reason_fails() -> None:
    results = [
        _static(1, _rec(0, "a", finish_reason=None)),
        _plain(1, _rec(0, "a", error="APIError: boom")),
    ]
    found = failures(results, "none")
    assert "speculative static-k4 c1 #0 code: stream ended without a finish reason" in found
    assert "no-drafter no-drafter c1 #0 code: APIError: boom" in found


# ---- tool calls --------------------------------------------------------------------


LLAMA_TEXT = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.mark.parametrize(
    ("text", "call"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', True),
        (LLAMA_TEXT, True),
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', True),
        ('[TOOL_CALLS][{"name": "f", "arguments": {}}]', True),
        ("It is sunny in Paris.", False),
        ('{"city": "Paris"}', False),
    ],
)
def test_text_that_looks_like_a_tool_call(text: str, call: bool) -> None:
    assert looks_like_call(text) is call


def test_a_tool_call_returned_as_text_fails() -> None:
    """The wrong parser for the model's call format (the old smoke passed this)."""
    found = failures([_tools(_call(0), _rec(1, LLAMA_TEXT, finish_reason="stop"))], "every")
    assert found == [
        "speculative tools #1 (streamed): a tool call returned as text, not a tool call: "
        + repr(LLAMA_TEXT)
    ]


def test_a_real_model_answering_a_tool_request_in_text_fails() -> None:
    found = failures([_tools(_rec(0, "It is sunny.", finish_reason="stop"))], "every")
    assert len(found) == 1
    assert "plain text, not a tool call" in found[0]


def test_a_real_models_call_must_name_an_offered_tool_with_json_arguments() -> None:
    found = failures([_tools(_call(0, name="get_time"), _call(1, args='{"city": '))], "every")
    assert len(found) == 2
    assert "called 'get_time', not an offered tool" in found[0]
    assert "get_weather called with '{\"city\": '" in found[1]


def test_the_embedded_model_must_call_a_tool_on_one_of_its_prompts() -> None:
    """Text and broken arguments pass beside one good call; alone, they fail."""
    text = _rec(0, "<tool_call>\n{broken", finish_reason="length")
    broken = _call(1, name="inspect_get", args='{"s": "gam": "gam"')
    assert failures([_tools(text, broken, _call(2, name="whatever"))], "any") == []
    (found,) = failures([_tools(text, broken)], "any")
    assert found == (
        "speculative tools: none of 2 requests came back as a tool call with JSON arguments "
        "(1 with broken ones, 1 as text that looks like one)"
    )


def test_no_tool_expectation_checks_nothing() -> None:
    assert failures([_tools(_rec(0, LLAMA_TEXT, finish_reason="stop"))], "none") == []


def test_tool_items_are_the_weather_prompt_and_due_family_prompts_both_ways() -> None:
    tools = [gpu_smoke.WEATHER_TOOL]
    due = Prompt("tool_call", messages=[{"role": "user", "content": "Run f."}], tools=tools)
    answered = Prompt("tool_call", messages=[{"role": "tool", "content": "{}"}], tools=tools)
    chosen = tool_items([due, answered])
    assert [i.prompt for i in chosen] == [gpu_smoke.WEATHER_PROMPT] * 2 + [due] * 2
    assert [i.index for i in chosen] == [0, 1, 2, 3]  # even: streamed, odd: not
    assert {i.max_tokens for i in chosen} == {gpu_smoke.TOOL_MAX_TOKENS}


def _chunk(delta: dict[str, object], finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def test_a_streamed_tool_call_is_assembled_from_its_fragments() -> None:
    rec, calls = SmokeRecord("tools c1", 0, "tool_call", True), {}  # type: ignore[var-annotated]
    head = {
        "index": 0,
        "id": "t",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    _take_chunk(rec, _chunk({"role": "assistant", "tool_calls": [head]}), calls)
    _take_chunk(
        rec, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}), calls
    )
    _take_chunk(
        rec, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}), calls
    )
    _take_chunk(rec, _chunk({}, "tool_calls"), calls)
    assert calls == {0: ["get_weather", '{"city": "Paris"}']}
    assert rec.finish_reason == "tool_calls"
    assert rec.content == ""


def test_a_whole_message_with_a_tool_call_is_read() -> None:
    completion = ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "t",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
            "speculation": {"class": "tools", "class_id": "c", "k": 4, "reason": "r"},
            "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.5}},
        }
    )
    rec = SmokeRecord("tools c1", 1, "tool_call", True, streamed=False)
    _take_message(rec, completion)
    assert (rec.tool_calls, rec.finish_reason, rec.output_tokens) == (
        [("f", "{}")],
        "tool_calls",
        7,
    )
    assert (rec.gw_class, rec.k, rec.acceptance_length) == ("tools", 4, 2.5)


# ---- the plan, /metrics, vLLM's log, the report --------------------------------------


def test_the_speculative_engine_runs_first_then_the_one_without_a_drafter() -> None:
    runs = smoke_runs(4, 4)
    assert [(r.engine, r.label, r.kind) for r in runs] == [
        (SPECULATIVE, "adaptive c4", "families"),
        (SPECULATIVE, "static-k4 c4", "families"),
        (SPECULATIVE, "k0 c4", "families"),
        (SPECULATIVE, "static-k4 c1", "greedy"),
        (SPECULATIVE, "tools c1", "tools"),
        (NO_DRAFTER, "no-drafter c4", "families"),
        (NO_DRAFTER, "no-drafter c1", "greedy"),
        (NO_DRAFTER, "tools c1", "tools"),
    ]
    assert all(r.flags == {} for r in runs if r.engine == NO_DRAFTER)
    # At concurrency 1 the measured runs are the greedy check already.
    assert [r.label for r in smoke_runs(3, 1)].count("static-k3 c1") == 1


METRICS = """\
# TYPE specgw_build info
specgw_build_info{version="1",model="m",drafter="d",max_depth="4",step_rule="on"} 1.0
# TYPE specgw_engine_step_depth counter
specgw_engine_step_depth_total{depth="0"} 2.0
specgw_engine_step_depth_total{depth="4"} 6.0
specgw_engine_step_depth_total{depth="mixed"} 2.0
# TYPE specgw_engine_cudagraph_steps counter
specgw_engine_cudagraph_steps_total{runtime_mode="FULL"} 8.0
specgw_engine_cudagraph_steps_total{runtime_mode="PIECEWISE"} 2.0
"""


def test_metrics_give_steps_by_graph_mode_and_depth_and_the_build() -> None:
    samples = parse_metrics(METRICS)
    assert graph_steps(samples) == {"FULL": 8.0, "PIECEWISE": 2.0}
    assert step_depths(samples) == {"0": 2.0, "4": 6.0, "mixed": 2.0}
    assert build_info(samples)["step_rule"] == "on"
    assert graph_steps(parse_metrics(METRICS.split("# TYPE specgw_engine_cuda")[0])) is None


VLLM_CONFIG_LINE = (
    "(EngineCore pid=1) INFO 01-01 00:00:00 [core.py:134] Initializing a V1 LLM engine "
    "(v0.33.0) with config: model='m', enforce_eager=False, compilation_config={'mode': "
    "<CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: "
    "(2, 1)>, 'cudagraph_capture_sizes': [512, 504, 8, 4, 2, 1, 16, 24], 'x': 1}"
)


def test_the_log_gives_vllms_resolved_graph_config() -> None:
    log = (
        VLLM_CONFIG_LINE
        + "\nINFO [gpu_model_runner.py:1] Graph capturing finished in 12 secs, took 0.50 GiB\n"
    )
    facts = log_facts(log)
    assert facts["enforce_eager"] == "False"
    assert facts["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert facts["capture_sizes"] == "8 sizes, 1..512"
    assert facts["graph_capture"] == "finished in 12 secs, took 0.50 GiB"
    assert "captured" not in facts


PLAN = """\
target: meta-llama/Llama-3.1-8B-Instruct
drafter: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B  K = 4

[this machine: cuda]
  execution: torch.compile + CUDA graphs (cudagraph_mode FULL_AND_PIECEWISE), model runner V2
  batch-depth rule: uniform; step depths: 0, 1, 2, 3, 4
  FULL decode graphs: k=0 (width 1) to batch 256, k=4 (width 5) to batch 96

[CUDA (one 80 GiB GPU): cuda]
  batch-depth rule: per-request; step depths: 0
"""


def test_the_plan_gives_the_rule_and_full_graph_widths_of_this_machine() -> None:
    facts, failed = plan_facts(SPECULATIVE, 0, PLAN, "")
    assert facts == {
        "rule": "uniform; step depths: 0, 1, 2, 3, 4",
        "full_graphs": "k=0 (width 1) to batch 256, k=4 (width 5) to batch 96",
    }
    assert failed == []


def test_settings_the_plan_refuses_are_a_failure() -> None:
    err = "vLLM logs\nspec-gateway: engine: depth 2 has no FULL decode graph on CUDA\n"
    assert plan_facts(SPECULATIVE, 2, "", err) == (
        {},
        [
            "speculative engine: spec-gateway plan refuses it: "
            "spec-gateway: engine: depth 2 has no FULL decode graph on CUDA"
        ],
    )
    (crashed,) = plan_facts(NO_DRAFTER, 1, "", "Traceback\nKeyError: 'x'")[1]
    assert crashed == "no-drafter engine: spec-gateway plan failed (exit status 1): KeyError: 'x'"


def test_the_report_prints_throughput_against_no_drafter_graphs_depths_and_classes() -> None:
    spec = [_rec(0, "a", gw_class="code", k=4, acceptance_length=2.5, output_tokens=30)]
    static = _static(4, *spec)
    static.graph_steps, static.step_depths = {"FULL": 9.0, "NONE": 1.0}, {"4": 3.0, "mixed": 1.0}
    facts = {
        SPECULATIVE: {"max_depth": "4", "step_rule": "on", "cudagraph_mode": "FULL_AND_PIECEWISE"}
    }
    text = report([static, _plain(4, *spec, wall_s=3.0), _tools(_call(0))], facts)
    rows = text.splitlines()
    assert "run                    engine        tokens/s  vs no-drafter  FULL graphs" in text
    assert (
        "static-k4 c4           speculative       15.0          1.50x          90%  4:75% mixed:25%"
        in rows
    )
    assert "no-drafter c4          no-drafter        10.0          1.00x          n/a  n/a" in rows
    assert "FULL graphs n/a: the gateway's /metrics has no CUDA-graph step counter" in text
    assert (
        "speculative engine: vLLM ?, K=4, step rule on; enforce eager n/a; cudagraph mode "
        "FULL_AND_PIECEWISE; capture sizes n/a; graph capture n/a"
    ) in rows
    assert "  plan: FULL decode graphs: n/a (spec-gateway plan gave none)" in rows
    assert "no-drafter engine: did not run" in text
    assert "  code                             1     4.00       2.50" in text
    assert (
        "tools (speculative): 1 of 1 requests with tool_choice=auto came back as tool calls "
        "(1 with JSON arguments), 0 as text that looks like one"
    ) in text


def test_an_engine_that_does_not_start_is_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("gateway exited early:\nTraceback ...\nRuntimeError: no device\n")

    monkeypatch.setattr(gpu_smoke, "start_gateway", refuse)
    monkeypatch.setattr(gpu_smoke, "startup_plan", lambda *_: ({}, []))
    args = parse_args(["--dry"])
    models = ModelPaths(tmp_path, tmp_path, "given")
    results, facts, failed = asyncio.run(
        gpu_smoke.on_engine(NO_DRAFTER, args, models, tmp_path, [])
    )
    assert (results, facts) == ([], {})
    assert failed == [
        "no-drafter engine did not start: gateway exited early: RuntimeError: no device "
        f"(logs in {tmp_path})"
    ]


def test_batch_invariant_mode_is_asked_of_both_engines() -> None:
    env = gpu_smoke.engine_env(parse_args(["--dry", "--batch-invariant"]))
    assert env["VLLM_BATCH_INVARIANT"] == "1"
    assert '"cudagraph_metrics": true' in env["SPECGW_ENGINE_EXTRA_ARGS"]
    assert "VLLM_BATCH_INVARIANT" not in gpu_smoke.engine_env(parse_args(["--dry"]))


def test_stopping_an_engine_ends_what_its_gateway_left_running(tmp_path: Path) -> None:
    """The next engine needs the GPU: a child the gateway leaves behind (here a `sleep`
    orphaned when its shell is terminated) is killed after the grace period."""
    shell = subprocess.Popen(["bash", "-c", "sleep 60 & wait"])
    until_sync(lambda: descendants(shell.pid), 10.0, "the shell's child", poll_s=0.05)
    left = descendants(shell.pid)
    GatewayProcess("http://127.0.0.1:1", shell, tmp_path / "log", tmp_path).stop_all(grace_s=1)

    def running() -> bool:
        return any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in left)

    with contextlib.suppress(AssertionError):  # a kill is delivered at once; allow 5 s
        until_sync(lambda: not running(), 5.0)
    assert not running()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


# ---- end to end --------------------------------------------------------------------


def _dry_smoke(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench.gpu_smoke", "--dry", "--per-family", "1"]
    cmd += ["--max-tokens", "8", "--concurrency", "2", "--out", str(out)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=1800, check=False, env={**os.environ, **env}
    )


@pytest.mark.engine
def test_the_script_runs_end_to_end_on_the_fake_backend(tmp_path: Path) -> None:
    """The whole script (two `spec-gateway serve` processes one after the other, flags,
    runs, report) with no model: the engine tier, since it starts server processes."""
    done = _dry_smoke(tmp_path, SPECGW_ENGINE_BACKEND="fake")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu-smoke: ok (" in done.stdout
    assert "static-k4 c1" in done.stdout
    assert "no-drafter c2" in done.stdout


@pytest.mark.engine
def test_the_dry_smoke_runs_end_to_end(tmp_path: Path) -> None:
    """The same script on the CPU build and the embedded model, tiny sizes: 0 = passed,
    greedy text identical at concurrency 1 and a tool call from each engine."""
    # Calibrated as the suite's other gateways are.
    done = _dry_smoke(tmp_path, **TEST_CALIBRATION)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu-smoke: ok" in done.stdout
    assert "no-drafter c1" in done.stdout
    assert ", K=0, step rule off;" in done.stdout  # the no-drafter engine
    assert "  plan: FULL decode graphs: none" in done.stdout  # the CPU: eager
    assert (tmp_path / "gpu_smoke.json").is_file()
