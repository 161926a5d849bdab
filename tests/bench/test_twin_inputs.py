"""The engine twin's shipped inputs and the tools that build new ones.

Every shipped profile and workload must validate, keep the figures its notes derive (the
published points a profile claims to reproduce are recomputed here from the file), and give
each workload class a body that the gateway's real classifier puts in a class of its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench.replay import RequestRecord
from bench.runner import RunKey, RunResult
from bench.twin import build_profile, build_workload
from bench.twin.build_workload import conditional_from_lengths
from bench.twin.label_body import synthetic_class
from bench.twin.schema import Profile, Workload, load_profile, load_workload
from gateway.control.classify import label_of
from gateway.control.controller import Controller
from gateway.control.features import (
    RequestFeatures,
    features_from_chat,
    features_from_completion,
    length_bucket,
    sampling_bucket,
)
from gateway.control.settings import ControllerSettings

TWIN = Path(__file__).resolve().parents[2] / "bench" / "twin"
PROFILES = sorted((TWIN / "profiles").glob("*.json"))
WORKLOADS = sorted((TWIN / "workloads").glob("*.json"))


def _median(spec: dict[str, Any]) -> int:
    if spec["dist"] == "fixed":
        return int(spec["value"])
    if spec["dist"] == "uniform":
        return (int(spec["low"]) + int(spec["high"])) // 2
    return int(min(max(round(float(spec["median"])), int(spec["min"])), int(spec["max"])))


def _features(cls: dict[str, Any], prompt_tokens: int) -> RequestFeatures:
    """The features the gateway extracts from the class's body (`ControllerPlanner.plan_*`)."""
    body = cls["request"]
    sampling = sampling_bucket(float(cls.get("temperature", 0.0)))
    if cls.get("endpoint", "chat") == "chat":
        return features_from_chat(
            body["messages"],
            body.get("tools"),
            body.get("tool_choice"),
            body.get("response_format"),
            prompt_tokens,
            sampling=sampling,
        )
    return features_from_completion(body["prompt"], prompt_tokens, sampling=sampling)


def _expected_tokens(conditional: list[float], k: int) -> float:
    chain, total = 1.0, 1.0
    for p in conditional[:k]:
        chain *= p
        total += chain
    return total


def test_the_shipped_inputs_exist() -> None:
    names = {p.stem for p in PROFILES}
    assert {"h100-llama8b-eagle3", "kimi-k2.6-eagle31", "moe-30b-a3b", "cpu-embedded"} <= names
    assert {"make-bench", "production-mix"} <= {p.stem for p in WORKLOADS}


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profile_validates_and_costs_rise_with_depth(path: Path) -> None:
    profile = load_profile(path)
    assert profile.name == path.stem
    assert profile.source.strip()
    for batch, row in profile.batch_stats.items():
        times = [row[k] for k in sorted(row)]
        if profile.name.startswith("measured-"):
            # A measured step may dip where a wider verify GEMM lands on a better tile
            # (H100, batch 64: k = 7 below k = 6); it still costs more than k = 0 at
            # every depth, and the twin uses the figures as measured.
            assert min(times[1:]) > times[0], f"batch {batch}: a draft cheaper than none"
        else:
            assert times == sorted(times), f"batch {batch}: a deeper draft is cheaper"
        if profile.no_spec_step_ms and batch in profile.no_spec_step_ms:
            assert profile.no_spec_step_ms[batch] <= row[0]
    if profile.workload is not None:
        assert (TWIN / "workloads" / f"{profile.workload}.json").exists()


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_workload_validates_mixes_and_acceptance(path: Path) -> None:
    raw = json.loads(path.read_text())
    workload = load_workload(path)
    assert workload.name == path.stem
    for phase in raw["phases"]:
        assert math.isclose(sum(phase["mix"].values()), 1.0, abs_tol=1e-6), phase["name"]
        named = [*phase["mix"], *(s["class"] for s in phase.get("shifts", []))]
        assert set(named) <= set(raw["classes"])
    for name, cls in raw["classes"].items():
        assert all(0 < p <= 1 for p in cls["acceptance"]), name
        bounds = cls["prompt_tokens"]
        low = bounds.get("min", bounds.get("low", bounds.get("value")))
        high = bounds.get("max", bounds.get("high", bounds.get("value")))
        assert length_bucket(high) <= 2 * length_bucket(low), f"{name}: over two length buckets"


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_each_class_is_its_own_class_for_the_real_classifier(path: Path) -> None:
    classes = json.loads(path.read_text())["classes"]
    controller = Controller(ControllerSettings())
    ids = {
        name: controller.classify(_features(cls, _median(cls["prompt_tokens"]))).class_id
        for name, cls in classes.items()
    }
    assert "other" not in ids.values()
    assert len(set(ids.values())) == len(ids), ids


def test_production_mix_meets_its_stated_shape() -> None:
    workload = load_workload(TWIN / "workloads" / "production-mix.json")
    assert len(workload.phases) == 3
    assert all(p.requests >= 700 for p in workload.phases)
    overall: dict[str, float] = {}
    for phase in workload.phases:
        for name, share in phase.mix.items():
            overall[name] = overall.get(name, 0.0) + share * phase.requests
    total = workload.total_requests
    group = {
        "main chat": ("chat_main", "chat_sampled"),
        "code": ("code",),
        "tools and JSON": ("tool_call", "json_output"),
        "foreign": ("foreign_system", "foreign_template"),
        "rag": ("rag",),
    }
    shares = {g: sum(overall.get(c, 0.0) for c in cs) / total for g, cs in group.items()}
    want = {"main chat": 0.4, "code": 0.2, "tools and JSON": 0.15, "foreign": 0.15, "rag": 0.1}
    assert shares == pytest.approx(want, abs=1e-9)
    agentic = workload.phases[1]
    assert [(s.class_name, s.after, s.acceptance_scale) for s in agentic.shifts] == [
        ("chat_main", 0.5, 0.7)
    ]
    kinds = sorted(a.kind for a in workload.arrivals)
    assert kinds == ["closed", "closed", "closed", "closed", "poisson"]


def test_kimi_profile_reproduces_the_published_speedups() -> None:
    profile = load_profile(TWIN / "profiles" / "kimi-k2.6-eagle31.json")
    tau = 3.01  # SPEED-Bench coding acceptance length at k = 3
    for concurrency, published in ((1, 2.03), (4, 1.71), (16, 1.66)):
        speedup = tau * profile.no_spec_ms(concurrency) / profile.step_ms(concurrency, 3)
        assert speedup == pytest.approx(published, abs=0.006)


def test_moe_profile_reproduces_the_published_points() -> None:
    profile = load_profile(TWIN / "profiles" / "moe-30b-a3b.json")
    # AngelSlim issue 163: batch 1, acceptance length 2.017, 170.35 tokens/s (219 without).
    assert 2.017 / (profile.step_ms(1, 3) / 1000) == pytest.approx(170.35, rel=0.01)
    assert 1000 / profile.no_spec_ms(1) == pytest.approx(218.89, rel=0.001)
    # recipes issue 923: 36.5 % draft acceptance (length 2.095 at k = 3): TPOT +32 % / +81 %.
    length = 1 + 3 * 0.365
    for batch, tpot_ratio in ((8, 1.32), (64, 1.81)):
        tpot = profile.step_ms(batch, 3) / length
        assert tpot / profile.no_spec_ms(batch) == pytest.approx(tpot_ratio, rel=0.005)


def test_h100_profile_keeps_the_published_profile_and_repairs_its_outlier() -> None:
    profile = load_profile(TWIN / "profiles" / "h100-llama8b-eagle3.json")
    assert profile.batch_stats[1] == {0: 6.87, 1: 7.97, 3: 9.41, 4: 9.91, 5: 10.8, 7: 12.29}
    assert profile.batch_stats[64][7] < 2 * profile.batch_stats[64][5]  # not the 120.57 outlier
    assert profile.no_spec_ms(1) == pytest.approx(6.87 / 1.066, abs=0.01)
    assert profile.acceptance_rate_per_pos == [0.76, 0.54, 0.39, 0.28, 0.21, 0.15, 0.12]


def test_production_chat_acceptance_is_the_profiles_e3_rates() -> None:
    workload = load_workload(TWIN / "workloads" / "production-mix.json")
    chat = list(workload.classes["chat_main"].acceptance)
    marginal, chain = [], 1.0
    for p in chat:
        chain *= p
        marginal.append(round(chain, 3))
    assert marginal == [0.76, 0.54, 0.39, 0.28, 0.21, 0.15, 0.12]


# ---- building workloads -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "conditional", [[0.8, 0.7, 0.6, 0.5], [0.9, 0.9, 0.9], [0.3, 0.05, 0.5]], ids=str
)
def test_conditional_from_lengths_recovers_a_chain(conditional: list[float]) -> None:
    lengths = {k: _expected_tokens(conditional, k) for k in range(1, len(conditional) + 1)}
    assert conditional_from_lengths(lengths) == pytest.approx(conditional, abs=1e-3)


def test_conditional_from_lengths_never_lets_a_deeper_draft_win() -> None:
    # Measured: position 2 accepted more often than position 1 (noise); pooled instead.
    fitted = conditional_from_lengths({1: 1.4, 2: 1.9, 3: 2.0})
    assert fitted == pytest.approx([0.45, 1.0, 0.2222], abs=1e-3)
    assert _expected_tokens(fitted, 3) == pytest.approx(2.0, abs=1e-3)
    assert conditional_from_lengths({1: 1.2, 2: 1.2})[1] == build_workload.FLOOR


def test_conditional_from_lengths_with_gaps_fits_a_geometric_profile() -> None:
    fitted = conditional_from_lengths({3: 2.5})
    assert len(set(fitted)) == 1
    assert _expected_tokens(fitted, 3) == pytest.approx(2.5, abs=2e-3)


def _record(index: int, phase: int, family: str, k: int, **extra: Any) -> RequestRecord:
    return RequestRecord(index, phase, family, True, 0.0, 1.0, 0.1, 0.01, k=k, **extra)


def _write_run(path: Path) -> None:
    """Two modes over the same four requests: static k = 1 and static k = 2."""
    runs = []
    for k, accepted in ((1, {0: 6, 1: 6, 2: 2, 3: 5}), (2, {0: 10, 1: 10, 2: 2, 3: 8})):
        records = [
            _record(
                i,
                phase,
                family,
                k,
                output_tokens=out,
                prompt_tokens=prompt,
                accepted_tokens=accepted[i],
                verify_steps=10,
                gw_class=label,
            )
            for i, (phase, family, out, prompt, label) in enumerate(
                [
                    (0, "chat_main", 30, 40, "chat/sys:3ab0/len:64"),
                    (0, "chat_main", 20, 36, "chat/sys:3ab0/len:64"),
                    (1, "tool_call", 24, 300, "chat/sys:3ab0/tools/len:512"),
                    (1, "mystery", 32, 200, "chatml/sys:0a1b/toolmsg/len:256/t1"),
                ]
            )
        ]
        runs.append(RunResult(RunKey(f"static-k{k}", "c1", 0), 1.0, records))
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in runs))
    meta = {"seed": 1234, "phases": "chat x2, tools x2"}
    (path.parent / "meta.json").write_text(json.dumps(meta))


def test_from_run_builds_a_valid_workload(tmp_path: Path) -> None:
    _write_run(tmp_path / "runs.jsonl")
    data = build_workload.from_run(tmp_path / "runs.jsonl", per_phase=700)
    workload = Workload.model_validate(build_workload.finish(data, "mine", 2.0))
    # chat_main: 12 accepted in 20 steps at k = 1 (length 1.6), 20 in 20 at k = 2 (2.0).
    assert list(workload.classes["chat_main"].acceptance) == pytest.approx([0.6, 0.6667], abs=1e-3)
    assert [p.name for p in workload.phases] == ["chat", "tools"]
    assert workload.phases[0].mix == {"chat_main": 1.0}
    assert workload.phases[1].mix == {"mystery": 0.5, "tool_call": 0.5}
    assert workload.phases[0].requests == 700
    prompt = workload.classes["chat_main"].prompt_tokens.model_dump()
    assert (prompt["min"], prompt["max"], prompt["median"]) == (36, 40, 38.0)
    assert "tools" in workload.classes["tool_call"].request  # the benchmark's own prompt
    mystery = workload.classes["mystery"]  # unknown family: synthetic from its label
    assert mystery.endpoint == "completions"
    assert mystery.temperature == pytest.approx(0.7)
    assert "SYNTHETIC" in workload.source
    assert "mystery" in workload.source
    assert [a.label for a in workload.arrivals] == ["c1", "c4", "c16", "c64", "poisson2"]


def test_from_run_reads_acceptance_from_the_static_modes(tmp_path: Path) -> None:
    # batch-schedule reports its bound (k = 2) while its steps ran shallower: left out.
    path = tmp_path / "runs.jsonl"
    _write_run(path)
    records = [
        _record(
            0, 0, "chat_main", 2, accepted_tokens=0, verify_steps=10, gw_class="chat/sys:1/len:64"
        ),
        _record(
            1, 0, "chat_main", 2, accepted_tokens=0, verify_steps=10, gw_class="chat/sys:2/len:64"
        ),
    ]
    run = RunResult(RunKey("batch-schedule", "c1", 0), 1.0, records)
    path.write_text(path.read_text() + json.dumps(run.to_json()) + "\n")
    data = build_workload.from_run(path, per_phase=700, command="CMD")
    assert data["classes"]["chat_main"]["acceptance"] == pytest.approx([0.6, 0.6667], abs=1e-3)
    assert "static-k1, static-k2 modes" in data["source"]
    assert "`CMD`" in data["source"]
    assert "chat_main ran as 3 gateway classes" in data["source"]


def _class_row(class_id: str, label: str, samples: int, profile: list[float]) -> dict[str, Any]:
    return {
        "class_id": class_id,
        "label": label,
        "samples": samples,
        "acceptance_length": _expected_tokens(profile, len(profile)),
        "depth_profile": profile,
    }


def test_from_classes_builds_a_valid_synthetic_workload(tmp_path: Path) -> None:
    answer = {
        "object": "list",
        "data": [
            _class_row("a" * 16, "chat/sys:3ab0/len:512", 300, [0.8, 0.7, 0.0]),
            _class_row("b" * 16, "chat/sys:3ab0/tools/toolmsg/len:1024", 100, [0.3, 0.2, 0.1]),
            _class_row("c" * 16, "llama2/sys:9f00/len:256/t1", 100, [0.6, 0.5, 0.4]),
            _class_row("other", "other", 50, [0.5, 0.5, 0.5]),
        ],
    }
    path = tmp_path / "classes.json"
    path.write_text(json.dumps(answer))
    out = tmp_path / "w.json"
    build_workload.main(out=out, from_classes_path=path, requests=1000)
    workload = load_workload(out)
    assert set(workload.classes) == {
        "chat/sys:3ab0/len:512",
        "chat/sys:3ab0/tools/toolmsg/len:1024",
        "llama2/sys:9f00/len:256/t1",
    }
    assert workload.phases[0].mix == {
        "chat/sys:3ab0/len:512": 0.6,
        "chat/sys:3ab0/tools/toolmsg/len:1024": 0.2,
        "llama2/sys:9f00/len:256/t1": 0.2,
    }
    assert list(workload.classes["chat/sys:3ab0/len:512"].acceptance)[2] == build_workload.FLOOR
    assert "SYNTHETIC" in workload.source
    assert "Measured positions" not in workload.source  # an answer without depth_trials


def test_from_classes_names_the_positions_no_draft_measured() -> None:
    """`depth_trials` 0 at a position: its p_d is the controller's prior or a similar
    class's, and the workload's source says so, class by class."""
    rows = [
        _class_row("a" * 16, "chat/sys:3ab0/len:512", 300, [0.8, 0.7, 0.6]),
        _class_row("b" * 16, "alpaca/sys:5da3/len:64", 100, [0.8, 0.7, 0.6]),
        _class_row("c" * 16, "chat/sys:3ab0/tools/len:512", 100, [0.3, 0.2, 0.1]),
    ]
    rows[0]["depth_trials"] = [900, 700, 500]
    rows[1]["depth_trials"] = [0, 0, 0]
    rows[2]["depth_trials"] = [40, 0, 0]
    source = build_workload.from_classes({"object": "list", "data": rows})["source"]
    assert "alpaca/sys:5da3/len:64: none" in source
    assert "chat/sys:3ab0/tools/len:512: p_1..p_1" in source
    assert "chat/sys:3ab0/len:512:" not in source


@pytest.mark.parametrize(
    "label",
    [
        "chat/len:64",
        "chat/sys:ab12/tools/toolmsg/len:512/t1",
        "chat/sys:1234/turns:2/tools:required/json_object/len:1024",
        "chat/tools:named/json_schema/len:128",
        "chatml/sys:0a1b/turns:4/toolmsg/len:256/t0.5",
        "llama3/len:64",
        "llama2/sys:aaaa/len:2048",
        "alpaca/sys:9f00/len:128",
        "code/len:64",
        "plain/len:64/t2",
    ],
)
def test_a_synthetic_body_classifies_as_its_label(label: str) -> None:
    spec = synthetic_class(label)
    got = label_of(_features(spec, spec["bucket"]))

    def without_system(text: str) -> list[str]:
        return [p for p in text.split("/") if not p.startswith("sys:")]

    assert without_system(got) == without_system(label)
    assert ("sys:" in got) == ("sys:" in label)


def test_synthetic_system_prompts_keep_classes_apart() -> None:
    controller = Controller(ControllerSettings())
    labels = ["chat/sys:1234/len:64", "chat/sys:5678/len:64", "chat/sys:abcd/len:64"]
    ids = {controller.classify(_features(synthetic_class(x), 64)).class_id for x in labels}
    assert len(ids) == len(labels)


# ---- building profiles ------------------------------------------------------------------------


def test_profile_from_admin_costs(tmp_path: Path) -> None:
    calibration = [
        {"k": k, "batch": b, "step_ms": ms, "samples": 50, "ttft_ms": ttft, "timed_by": "steps"}
        for b, rows in {
            1: [(10.0, 20.0), (14.0, 26.0), (17.0, 27.0)],
            4: [(20.0, 30.0)] * 3,
        }.items()
        for k, (ms, ttft) in enumerate(rows)
    ]
    buckets = [{"batch_bucket": 4, "relative_cost": [1.0, 1.5, 2.0], "samples": [9, 9, 9]}]
    answer = {"calibration": calibration, "buckets": buckets, "prefill_ms_per_token": 0.2}
    (tmp_path / "costs.json").write_text(json.dumps(answer))
    out = tmp_path / "mine.json"
    build_profile.main(out=out, admin_costs=str(tmp_path / "costs.json"), use_learned=True)
    profile = load_profile(out)
    assert profile.batch_stats == {1: {0: 10.0, 1: 14.0, 2: 17.0}, 4: {0: 20.0, 1: 30.0, 2: 40.0}}
    assert profile.first_token_extra_ms == {1: 6.0, 2: 7.0}
    assert (profile.prefill_ms_per_token.target, profile.max_k) == (0.2, 2)
    assert not profile.zero_skips_drafter  # Model Runner V2 unless told
    cpu = tmp_path / "cpu.json"
    build_profile.main(out=cpu, admin_costs=str(tmp_path / "costs.json"), zero_skips_drafter=True)
    assert load_profile(cpu).zero_skips_drafter


def test_profile_from_admin_costs_needs_a_calibration() -> None:
    with pytest.raises(ValueError, match="calibration"):
        build_profile.from_admin_costs({"calibration": [], "buckets": []})


def test_profile_from_vllm_profiler_output() -> None:
    # The shape of vLLM's dynamic-SD profiler output (pull request 32374's example).
    body = {
        "is_online": False,
        "batch_stats": {"1": {"0": 6.52, "1": 7.37, "3": 8.84}, "64": {"0": 7.77, "3": 13.5}},
        "max_num_speculative_tokens": 3,
        "acceptance_rate_per_pos": [0.68, 0.39, 0.2],
    }
    data = build_profile.from_vllm_profile(body, 0.03, 0.001, 0.066)
    profile = Profile.model_validate({"name": "p", **data})
    assert profile.step_ms(1, 3) == 8.84
    assert profile.no_spec_ms(64) == pytest.approx(7.77 / 1.066, abs=1e-3)
    assert profile.first_token_extra_ms == {1: pytest.approx(0.85), 3: pytest.approx(2.32)}
    assert profile.acceptance_rate_per_pos == [0.68, 0.39, 0.2]
