"""The harness's pure parts on real value objects: workload, statistics, oracle, report, plots."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import typer

from bench.families import (
    FAMILIES,
    SAMPLED_FAMILY,
    SAMPLED_TEMPERATURE,
    local_pool,
    with_sampled,
)
from bench.modes import ab_modes, default_modes, select_modes
from bench.render import render_markdown, write_report
from bench.replay import RequestRecord, request_kwargs
from bench.report import build_summary
from bench.runner import (
    CALIBRATE_BATCHES_ENV,
    JsonlSink,
    RunKey,
    RunPlan,
    RunResult,
    load_cost_models,
    load_runs,
)
from bench.stats import (
    acceptance_length,
    class_ratios,
    decode_step_s,
    oracle,
    percentile,
    settle_points,
    spread,
)
from bench.workload import (
    ClosedLoop,
    Phase,
    Poisson,
    build_workload,
    default_phases,
    family_counts,
    phase_boundaries,
)
from gateway.control.settings import ControllerSettings


def test_workload_is_seeded_and_shifts_mix_at_phase_boundaries() -> None:
    pool = local_pool(8, seed=3)
    assert set(pool) == set(FAMILIES)
    phases = default_phases(40)
    a = build_workload(phases, pool, seed=11, max_tokens=32)
    b = build_workload(phases, pool, seed=11, max_tokens=32)
    c = build_workload(phases, pool, seed=12, max_tokens=32)
    assert [(i.family, i.prompt) for i in a] == [(i.family, i.prompt) for i in b]
    assert [i.family for i in a] != [i.family for i in c]
    assert phase_boundaries(a) == [40, 80]
    first = {i.family for i in a[:40]}
    second = {i.family for i in a[40:80]}
    assert "chat_alt_template" not in first  # phase 1 has no foreign templates
    assert "chat_alt_template" in second


def test_warm_up_covers_every_family_of_the_workload() -> None:
    """Each engine's first long prefill is slow once: the untimed warm-up runs one
    request of every family, not only the first phase's chats."""
    items = build_workload(default_phases(12), local_pool(8, seed=3), seed=5, max_tokens=16)
    plan = RunPlan([], [ClosedLoop(4)], 1, items, warmup=4)
    warm = plan.warmup_items()
    assert warm[:4] == items[:4]
    assert {i.family for i in warm} == {i.family for i in items}
    assert len(warm) == len({i.index for i in warm})


def test_gateways_calibrate_only_the_batches_closed_loops_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quick run (c4) times batches 1, 2 and 4 at start-up; a run that reaches 16, or
    any open loop (its batch is unbounded), keeps the gateway's default set."""
    assert RunPlan([], [ClosedLoop(4)], 1, []).gateway_env() == {CALIBRATE_BATCHES_ENV: "[1, 2, 4]"}
    assert RunPlan([], [ClosedLoop(1)], 1, []).gateway_env() == {CALIBRATE_BATCHES_ENV: "[1]"}
    assert RunPlan([], [ClosedLoop(1), ClosedLoop(16)], 1, []).gateway_env() == {}
    assert RunPlan([], [ClosedLoop(4), Poisson(3.0)], 1, []).gateway_env() == {}
    # Where the plan sets the batches (the quick run), those.
    set_batches = RunPlan([], [ClosedLoop(4), Poisson(3.0)], 1, [], calibrate_batches=[1])
    assert set_batches.gateway_env() == {CALIBRATE_BATCHES_ENV: "[1]"}
    # The gateway reads it as its calibration setting.
    for name, value in RunPlan([], [ClosedLoop(8)], 1, []).gateway_env().items():
        monkeypatch.setenv(name, value)
    assert ControllerSettings().calibrate_batches == [1, 2, 4, 8]


def test_each_phase_has_its_mix_in_whole_requests() -> None:
    """Counts by largest remainder, not a draw per request: seed 1234 drew one long-context
    request a run where the mix asks for 2.4."""
    assert family_counts({"a": 0.45, "b": 0.2, "c": 0.35}, 12) == {"a": 6, "b": 2, "c": 4}
    assert family_counts({"a": 1.0, "b": 1.0}, 3) == {"a": 2, "b": 1}  # a tie: first named
    assert family_counts({"a": 0.5, "b": 0.0}, 4) == {"a": 4, "b": 0}
    with pytest.raises(ValueError, match="positive weight"):
        family_counts({"a": 0.0}, 2)
    phases = default_phases(12)
    items = build_workload(phases, with_sampled(local_pool(8, seed=3)), seed=1234, max_tokens=16)
    for p, phase in enumerate(phases):
        drawn = [i.family for i in items if i.phase == p]
        assert {f: drawn.count(f) for f in phase.mix} == family_counts(phase.mix, 12)
    assert sum(i.family == "long_context" for i in items) == 2
    # Shuffled within the phase, not in blocks of a family.
    chat = [i.family for i in items if i.phase == 0]
    assert chat != sorted(chat, key=list(phases[0].mix).index)


def test_class_ratio_pairs_the_same_requests_and_brackets_the_pooled_ratio() -> None:
    def run(mode: str, repeat: int, e2e: dict[str, list[float]]) -> RunResult:
        recs = [
            _rec(10 * j + i, fam, 0, 0, t)
            for j, (fam, times) in enumerate(sorted(e2e.items()))
            for i, t in enumerate(times)
        ]
        return RunResult(RunKey(mode, "c4", repeat), 1.0, recs)

    # "steady": A twice as fast on every request; "noisy": 0.5x to 2x request by request.
    a = [run("a", r, {"steady": [0.5, 1.0], "noisy": [0.5, 4.0]}) for r in range(3)]
    b = [run("b", r, {"steady": [1.0, 2.0], "noisy": [1.0, 2.0]}) for r in range(3)]
    failed = RequestRecord(0, 0, "noisy", False, 0.0, 0.1, error="boom")
    b.append(RunResult(RunKey("b", "c4", 3), 1.0, [failed]))  # no slot in A: not paired
    ratios = class_ratios(a, b)
    steady, noisy = ratios["steady"], ratios["noisy"]
    assert (steady.ratio, steady.low, steady.high, steady.pairs) == pytest.approx(
        (2.0, 2.0, 2.0, 6)
    )
    assert noisy.ratio == pytest.approx((20 / 4.5) / (20 / 3.0))  # pooled: tokens / seconds
    assert noisy.low < noisy.ratio < noisy.high
    assert noisy.low >= 0.5
    assert noisy.high <= 2.0
    assert class_ratios(a, b) == ratios  # seeded


def test_sampled_chat_is_the_main_chat_sent_sampled_with_a_seed_per_request() -> None:
    pool = with_sampled(local_pool(4, seed=3))
    assert [p.messages for p in pool[SAMPLED_FAMILY]] == [p.messages for p in pool["chat_main"]]
    items = build_workload(default_phases(12), pool, seed=1234, max_tokens=16)
    sampled = [i for i in items if i.family == SAMPLED_FAMILY]
    assert len(sampled) == 5  # 3 in the chat phase, 2 in code+long
    body = request_kwargs(sampled[0], "m")
    assert (body["temperature"], body["seed"]) == (SAMPLED_TEMPERATURE, sampled[0].index)
    greedy = request_kwargs(next(i for i in items if i.family == "chat_main"), "m")
    assert greedy["temperature"] == 0.0
    assert "seed" not in greedy


def test_workload_rejects_a_phase_without_prompts() -> None:
    with pytest.raises(ValueError, match="none of its families"):
        build_workload([Phase("x", 3, {"nope": 1.0})], local_pool(2, 0), 0, 8)


def test_poisson_offsets_are_seeded_with_the_asked_mean_rate() -> None:
    offsets = Poisson(20.0, seed=5).offsets(2000)
    assert offsets == Poisson(20.0, seed=5).offsets(2000)
    assert offsets[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(offsets))
    assert 2000 / offsets[-1] == pytest.approx(20.0, rel=0.1)
    assert ClosedLoop(4).label == "c4"


def test_percentile_and_spread() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    s = spread([3.0, None, 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)


def _rec(index: int, family: str, phase: int, k: int, e2e: float, **kw: float) -> RequestRecord:
    return RequestRecord(
        index=index,
        phase=phase,
        family=family,
        ok=True,
        start=float(index),
        e2e=e2e,
        ttft=0.01,
        tpot=e2e / 10,
        output_tokens=10,
        k=k,
        **kw,  # type: ignore[arg-type]
    )


def test_acceptance_length_is_vllms_definition() -> None:
    recs = [
        _rec(0, "a", 0, 2, 1.0, verify_steps=4, accepted_tokens=4),
        _rec(1, "a", 0, 2, 1.0, verify_steps=6, accepted_tokens=1),
    ]
    assert acceptance_length(recs) == pytest.approx(1 + 5 / 10)
    assert acceptance_length([_rec(0, "a", 0, 0, 1.0)]) == 1.0


def _static_runs() -> dict[int, list[RunResult]]:
    # Class "fast" is best at k=2 (0.5 s), class "slow" at k=1 (0.5 s).
    times = {1: {"fast": 1.0, "slow": 0.5}, 2: {"fast": 0.5, "slow": 2.0}}
    out: dict[int, list[RunResult]] = {}
    for k, per_class in times.items():
        recs = [_rec(i, fam, 0, k, per_class[fam]) for i, fam in enumerate(["fast", "slow"] * 3)]
        out[k] = [RunResult(RunKey(f"static-k{k}", "c4", 0), 3.0, recs)]
    return out


def test_oracle_picks_the_best_k_per_class_and_assembles_its_times() -> None:
    choice, assembled = oracle(_static_runs())
    assert choice == {"fast/0": 2, "slow/0": 1}
    assert sorted(assembled) == list(range(6))
    assert all(e2e == 0.5 for e2e, _ in assembled.values())


def test_settle_points_count_requests_until_the_final_k_holds() -> None:
    ks = [4, 4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2]
    recs = [_rec(i, "a", 0, k, 1.0) for i, k in enumerate(ks)]
    recs += [_rec(100 + i, "b", 1, 1, 1.0) for i in range(5)]
    points = settle_points(recs)
    # From request 2 on, 9 of the 10 get k=2: within the 10 % left for exploration probes.
    assert points == {"a/0": 2, "b/1": 0}
    assert settle_points(recs, tail_share=1.0)["a/0"] == 3


def _runs() -> list[RunResult]:
    runs = []
    for k, static in _static_runs().items():
        runs += static
        runs.append(RunResult(RunKey(f"static-k{k}", "c4", 1), 3.2, static[0].records))
    adaptive = [
        _rec(i, fam, 0, 2 if fam == "fast" else 1, 0.5)
        for i, fam in enumerate(["fast", "slow"] * 3)
    ]
    nospec = [_rec(i, fam, 0, 0, 0.8) for i, fam in enumerate(["fast", "slow"] * 3)]
    failed = RequestRecord(6, 0, "fast", False, 6.0, 0.1, error="APIError: boom")
    runs.append(RunResult(RunKey("adaptive", "c4", 0), 2.0, [*adaptive, failed]))
    runs.append(RunResult(RunKey("no-spec", "c4", 0), 2.5, nospec))
    k0 = [
        _rec(i, fam, 0, 0, 0.8 if fam == "fast" else 1.0)
        for i, fam in enumerate(["fast", "slow"] * 3)
    ]
    runs.append(RunResult(RunKey("k0", "c4", 0), 4.0, k0))
    return runs


def test_summary_checks_and_markdown_from_runs(tmp_path: Path) -> None:
    summary = build_summary(_runs(), {"started": "t", "notes": ["a note"]})
    cell = summary["cells"]["adaptive"]["c4"]
    assert cell["errors"] == 1
    assert cell["tokens_per_s"]["median"] == pytest.approx(60 / 2.0)
    assert summary["cells"]["static-k1"]["c4"]["tokens_per_s"]["n"] == 2
    checks = {c["claim"]: c for c in summary["checks"]}
    best_static = (60 / 3.0 + 60 / 3.2) / 2  # median of the two repeats of static-k1
    ratio = checks["adaptive tokens/s / best static k, k0 included (c4)"]
    assert ratio["value"] == pytest.approx((60 / 2.0) / best_static)
    assert ratio["pass"] is True
    # Repeat by repeat against the best static mode (static-k1 ran twice, adaptive once).
    assert ratio["detail"] == f"static-k1; by repeat {(60 / 2.0) / (60 / 3.0):.2f}"
    assert checks["adaptive / hindsight per-class oracle (c4, estimated)"][
        "value"
    ] == pytest.approx(1.0)
    assert checks["worst class: adaptive / no speculation (c1)"]["pass"] is None
    worst = checks["worst class: adaptive / no speculation (c4)"]
    assert worst["value"] == pytest.approx(0.8 / 0.5)
    assert worst["detail"].startswith("fast; 90% CI 1.60-1.60, 3 requests")
    assert summary["class_ratios"]["adaptive"]["c4"]["slow"]["pairs"] == 3
    # Yardsticks: the oracle over the best static k in the same estimate; k0's worst
    # class over no-spec (slow took 1.0 s a request in k0 against 0.8 in no-spec).
    yard = summary["yardsticks"]
    estimated = summary["oracle"]["c4"]["mode_estimated_speed"]
    best = max((m for m in estimated if m.startswith("static-k") or m == "k0"), key=estimated.get)
    assert yard["oracle_over_best_static"]["best_static"] == best
    assert yard["oracle_over_best_static"]["value"] == pytest.approx(
        summary["oracle"]["c4"]["estimated_speed"] / estimated[best]
    )
    assert yard["k0_worst_class"]["c4"]["class"] == "slow"
    assert yard["k0_worst_class"]["c4"]["ratio"] == pytest.approx(0.8)
    # k0 against no speculation, repeat 0 of each: 60 tokens in 4.0 s against 2.5 s.
    floor = checks["k0 / no speculation tokens/s, paired by repeat (c4)"]
    assert floor["value"] == pytest.approx(2.5 / 4.0)
    assert floor["pass"] is False
    assert floor["detail"] == "95% CI 0.62-0.62; by repeat 0.62"
    assert "k0 / no speculation tokens/s, paired by repeat (c1)" not in checks  # no c1 runs
    assert cell["requests_by_class"] == {"fast": 3, "slow": 3}  # the failed one not counted
    md = render_markdown(summary)
    assert "| adaptive | c4 | 30.0 |" in md
    assert "Requests per run: fast 3, slow 3" in md
    assert "| 1.600 (fast; 90% CI 1.60-1.60, 3 requests) | >= 0.98 | PASS |" in md
    assert "a note" in md
    assert "Worst class of k0 / no speculation" in md
    assert "c4 0.800 (slow;" in md
    assert "validates the harness" in md  # no embedded model named in meta
    embedded = render_markdown(build_summary(_runs(), {"model_source": "embedded default model"}))
    assert "validates the harness" not in embedded
    json_path, md_path = write_report(summary, tmp_path)
    assert json.loads(json_path.read_text())["checks"] == json.loads(json.dumps(summary["checks"]))
    assert md_path.read_text() == md


def test_runs_round_trip_through_jsonl(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "runs.jsonl")
    for run in _runs():
        sink(run)
    back = load_runs(tmp_path / "runs.jsonl")
    assert [(r.key, r.wall_s, r.records) for r in back] == [
        (r.key, r.wall_s, r.records) for r in _runs()
    ]


def test_plots_are_pngs(tmp_path: Path) -> None:
    from bench.plots import write_plots

    runs = _runs()
    paths = write_plots(build_summary(runs, {}), runs, tmp_path)
    assert {p.name for p in paths} == {
        "tokens_per_s.png",
        "k_over_time.png",
        "acceptance_over_time.png",
    }
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_modes_cover_no_spec_static_depths_and_adaptive() -> None:
    modes = default_modes(4, batch_schedule=True)
    names = [m.name for m in modes]
    assert names[0] == "no-spec"
    assert {"k0", "static-k1", "static-k4", "batch-schedule", "adaptive"} <= set(names)
    assert not modes[0].gateway.drafter
    assert {m.gateway.name for m in modes if m.name.startswith("static")} == {"spec"}
    # Each adaptive mode has a process of its own: repeats are interleaved across modes,
    # and its controller must learn from its own traffic only.
    floor = next(m for m in modes if m.name == "adaptive-floor")
    assert floor.flags["batch-floor"] == 0.98
    for name in ("adaptive", "adaptive-floor"):
        mode = next(m for m in modes if m.name == name)
        assert mode.gateway.drafter
        assert mode.gateway.name not in {m.gateway.name for m in modes if m.name != name}
    assert [m.static_k for m in modes if m.static_k is not None] == [1, 2, 3, 4]
    assert [m.name for m in select_modes(modes, ["static-k2", "no-spec"])] == [
        "no-spec",
        "static-k2",
    ]
    with pytest.raises(ValueError, match="unknown modes"):
        select_modes(modes, ["static-k9"])
    # The A/B modes run only when named, each in a process of its own, one flag off.
    ab = ab_modes(4)
    assert select_modes(modes, None, ab) == modes
    chosen = select_modes(modes, ["adaptive-nolower", "adaptive"], ab)
    assert [m.name for m in chosen] == ["adaptive", "adaptive-nolower"]
    assert chosen[1].flags["batch-lower"] is False
    assert chosen[1].flags["controller-mode"] == "adaptive"
    step = select_modes(modes, ["adaptive-step"], ab)[0]
    assert step.gateway.env == {"SPECGW_CONTROL_STEP_RULE": "on"}
    assert step.flags == {"controller-mode": "adaptive", "pin-k": -1}
    prior = select_modes(modes, ["adaptive-prior"], ab)[0]
    assert prior.gateway.env == {"SPECGW_CONTROL_COLD_START": "prior"}
    assert prior.flags == step.flags
    own = [m.gateway.name for m in ab]
    assert len(set(own)) == len(own)
    assert not set(own) & {m.gateway.name for m in modes}


def test_static_depths_include_k0_and_nothing_else() -> None:
    from bench.report import static_depth

    assert [static_depth(m) for m in ("k0", "static-k3", "no-spec", "adaptive")] == [
        0,
        3,
        None,
        None,
    ]


def test_repeats_are_interleaved_across_modes_and_each_process_starts_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Repeat r of every mode before repeat r + 1 of any: host drift during a run lands in
    every mode's spread, not between modes. The orchestration only: processes and
    replays are stand-ins here; `test_bench_quick` runs the real ones."""
    from bench import runner
    from bench.gateway_proc import ModelPaths

    started: list[str] = []
    ran: list[tuple[str, int]] = []

    class Proc:
        def __init__(self, name: str) -> None:
            self.name = name
            self.stopped = False

        def stop(self) -> None:
            self.stopped = True

    procs: list[Proc] = []

    def start(config: object, models: object, workdir: object) -> Proc:
        started.append(config.name)  # type: ignore[attr-defined]
        procs.append(Proc(config.name))  # type: ignore[attr-defined]
        return procs[-1]

    async def flags(gw: object, mode: object, plan: object) -> int | None:
        return mode.expect_k  # type: ignore[attr-defined,no-any-return]

    async def repeat(gw: Proc, mode: object, plan: object, r: int, *rest: object) -> None:
        ran.append((mode.name, r))  # type: ignore[attr-defined]
        assert not gw.stopped

    monkeypatch.setattr(runner, "start_gateway", start)
    monkeypatch.setattr(runner, "_apply_flags", flags)
    monkeypatch.setattr(runner, "_run_repeat", repeat)
    monkeypatch.setattr(runner, "save_cost_models", lambda *_: None)
    modes = default_modes(2, batch_schedule=False)
    plan = RunPlan(modes, [ClosedLoop(1)], 3, [])
    models = ModelPaths(tmp_path, tmp_path, "none")
    notes = runner.run_all(plan, models, tmp_path, lambda _r: None)
    assert notes == []
    # A B B A: each repeat reverses the last one's order.
    assert ran == [(m.name, r) for r in range(3) for m in (modes if r % 2 == 0 else modes[::-1])]
    assert sorted(started) == sorted({m.gateway.name for m in modes})
    assert all(p.stopped for p in procs)


def test_a_decode_step_is_timed_over_the_steps_after_the_prefills_token() -> None:
    # 10 tokens: the prefill's, then 3 verify steps of 1 + 3 accepted each, the last cut
    # by max_tokens (1 + 3 + 9 > 10): 3 steps in the 90 ms after the first token.
    cut = _rec(0, "a", 0, 4, 0.1, verify_steps=3, accepted_tokens=9)
    assert decode_step_s(cut) == pytest.approx(0.03)
    # Uncut: 1 + 3 verify + 4 accepted = 8 tokens, and 2 plain decode steps for the rest.
    assert decode_step_s(_rec(0, "a", 0, 4, 0.1, verify_steps=3, accepted_tokens=4)) == (
        pytest.approx(0.09 / 5)
    )
    assert decode_step_s(_rec(0, "a", 0, 0, 0.1)) == pytest.approx(0.01)
    # One step after the first token says nothing about a step's cost.
    assert decode_step_s(_rec(0, "a", 0, 4, 0.1, verify_steps=1, accepted_tokens=9)) is None


def test_step_costs_are_measured_per_static_depth_and_set_beside_the_cost_model(
    tmp_path: Path,
) -> None:
    # k0: 10 tokens in 10 steps, 90 ms after the first token -> 10 ms a step; static-k1:
    # the prefill's token, then 4 verify steps (4 + 5 accepted tokens) in 80 ms -> 20 ms;
    # static-k2: 3 verify steps (3 + 6) in 45 ms -> 15 ms.
    runs = [
        RunResult(RunKey("k0", "c4", 0), 1.0, [_rec(i, "a", 0, 0, 0.1) for i in range(3)]),
        RunResult(
            RunKey("static-k1", "c4", 0),
            1.0,
            [_rec(i, "a", 0, 1, 0.09, verify_steps=4, accepted_tokens=5) for i in range(3)],
        ),
        RunResult(
            RunKey("static-k2", "c4", 0),
            1.0,
            [_rec(i, "a", 0, 2, 0.055, verify_steps=3, accepted_tokens=6) for i in range(3)],
        ),
        # Adaptive's requests price no depth: only static modes are measured.
        RunResult(RunKey("adaptive", "c4", 0), 1.0, [_rec(0, "a", 0, 2, 9.0, verify_steps=4)]),
    ]
    body = {
        "object": "cost_model",
        "buckets": [{"batch_bucket": 4, "relative_cost": [1, 1.1, 1.3]}],
    }
    (tmp_path / "costs-spec-adaptive.json").write_text(json.dumps(body))
    models = load_cost_models(tmp_path)
    assert models == {"spec-adaptive": body["buckets"]}
    summary = build_summary(runs, {}, cost_models=models)
    cost = summary["step_costs"]["c4"]
    assert cost["step_ms"] == pytest.approx({"0": 10.0, "1": 20.0, "2": 15.0})
    assert cost["relative"] == pytest.approx({"0": 1.0, "1": 2.0, "2": 1.5})
    md = render_markdown(summary)
    assert "| c4 | measured (k0 step 10.0 ms) | 1.00 | 2.00 | 1.50 |" in md
    assert "| c4 | spec-adaptive model (bucket 4) | 1.00 | 1.10 | 1.30 |" in md


def test_arrivals_are_chosen_by_label_in_the_plans_order() -> None:
    from bench.__main__ import FULL, select_arrivals

    assert select_arrivals(FULL.arrivals, None) == FULL.arrivals
    chosen = select_arrivals(FULL.arrivals, ["c16", "c4"])
    assert [a.label for a in chosen] == ["c4", "c16"]
    with pytest.raises(typer.BadParameter, match="unknown arrival c8"):
        select_arrivals(FULL.arrivals, ["c8"])


def test_a_server_is_waited_for_and_stopped_and_an_early_exit_names_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    from bench.gateway_proc import free_port, stop_process, wait_ready

    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        server = subprocess.Popen(cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(server, f"http://127.0.0.1:{port}/", log, timeout_s=60)
    finally:
        stop_process(server, grace_s=10)
    assert server.poll() is not None
    with log.open("wb") as out:
        gone = subprocess.Popen([sys.executable, "-c", "print('no device')"], stdout=out)
    with pytest.raises(RuntimeError, match=r"(?s)^gateway exited early:\n.*no device"):
        wait_ready(gone, f"http://127.0.0.1:{free_port()}/", log, timeout_s=60, name="gateway")
