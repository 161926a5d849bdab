"""The `specgw_*` catalogue: golden exposition, promtool lint, recording semantics."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from gateway.control.classify import RequestClass
from gateway.control.report import ClassReport
from gateway.engine_watch import EngineState
from gateway.observability.events import export_class_reports
from gateway.observability.metrics import GatewayMetrics, render_metrics
from tests.observability.conftest import CHAT, FLAGS, populate, sample_outcome

GOLDEN = Path(__file__).parent / "golden" / "metrics_exposition.txt"
C = RequestClass("c0ffee00c0ffee00", "c")


def exposition_schema(body: str) -> str:
    """HELP/TYPE lines and, per sample name, its label names: everything but values."""
    lines: list[str] = []
    for family in text_string_to_metric_families(body):
        lines.append(f"# HELP {family.name} {family.documentation}")
        lines.append(f"# TYPE {family.name} {family.type}")
        shapes = sorted({f"{s.name}{{{','.join(sorted(s.labels))}}}" for s in family.samples})
        lines.extend(shapes)
    return "\n".join(lines) + "\n"


def test_exposition_matches_golden(metrics: GatewayMetrics) -> None:
    body, content_type = render_metrics(metrics.registry)
    assert content_type.startswith("text/plain")
    gateway_only = body.decode().split("# HELP python_", 1)[0]
    schema = exposition_schema(gateway_only)
    if os.environ.get("SPECGW_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(schema)
    assert schema == GOLDEN.read_text(), (
        "the /metrics schema changed; if deliberate, rerun with SPECGW_UPDATE_GOLDEN=1 "
        "and commit tests/observability/golden/metrics_exposition.txt"
    )


def test_every_gateway_family_is_prefixed_and_counters_end_in_total(
    metrics: GatewayMetrics,
) -> None:
    body, _ = render_metrics(metrics.registry)
    families = list(text_string_to_metric_families(body.decode()))
    ours = [f for f in families if f.name.startswith("specgw_")]
    assert len(ours) == 32
    for family in ours:
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith("_total"), sample.name
            else:
                assert not sample.name.endswith("_total"), sample.name


def test_render_includes_default_registry_where_vllm_registers() -> None:
    # vLLM registers `vllm:*` on prometheus-client's default REGISTRY; stand in with a
    # real counter there (what vLLM's PrometheusStatLogger does) and remove it after.
    probe = Counter("vllm:specgw_probe_requests", "probe", registry=REGISTRY)
    try:
        probe.inc()
        m = GatewayMetrics(CollectorRegistry(), max_depth=2)
        body = render_metrics(m.registry)[0].decode()
        assert "specgw_engine_ready 0.0" in body
        assert "vllm:specgw_probe_requests_total 1.0" in body
    finally:
        REGISTRY.unregister(probe)


def test_promtool_check_metrics_reports_no_problem_for_specgw(
    metrics: GatewayMetrics, promtool: str
) -> None:
    body, _ = render_metrics(metrics.registry)
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=30
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).decode().splitlines()
        if line.startswith("specgw_")
    ]
    assert problems == []


def sample_value(m: GatewayMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_acceptance_length_reconciles_with_vllm_definition() -> None:
    """1 + accepted / steps from the counters equals the per-request definition."""
    m = GatewayMetrics(CollectorRegistry(), max_depth=4)
    a = sample_outcome(3, 10, (8, 5, 2))
    b = sample_outcome(2, 20, (10, 3))
    m.record_outcome(C, a)
    m.record_outcome(C, b)
    accepted = sample_value(m, "specgw_accepted_tokens_total", class_id=C.class_id)
    steps = sample_value(m, "specgw_verify_steps_total", class_id=C.class_id)
    assert (accepted, steps) == (28, 30)
    assert accepted is not None
    assert steps is not None
    pooled = 1 + accepted / steps
    weighted = (a.speculation.acceptance_length * 10 + b.speculation.acceptance_length * 20) / 30
    assert abs(pooled - weighted) < 1e-12
    per_pos = [
        sample_value(m, "specgw_accepted_tokens_per_position_total", position=str(p),
                     class_id=C.class_id)
        for p in range(4)
    ]  # fmt: skip
    assert per_pos == [18, 8, 2, 0]
    drafted = [
        sample_value(m, "specgw_draft_tokens_per_position_total", position=str(p),
                     class_id=C.class_id)
        for p in range(4)
    ]  # fmt: skip
    assert drafted == [30, 30, 10, 0]


def test_fallback_and_histogram_count_share_a_denominator() -> None:
    m = GatewayMetrics(CollectorRegistry(), max_depth=4)
    for _ in range(3):
        m.record_outcome(C, sample_outcome(0, 0, ()))
    m.record_outcome(C, sample_outcome(2, 5, (3, 1)))
    fallback = sample_value(m, "specgw_fallback_requests_total", class_id=C.class_id)
    finished = sample_value(m, "specgw_acceptance_length_count", class_id=C.class_id)
    assert (fallback, finished) == (3, 4)


def test_forget_class_removes_every_series_of_the_class(metrics: GatewayMetrics) -> None:
    metrics.forget_class(CHAT.class_id)
    body = render_metrics(metrics.registry)[0].decode()
    assert CHAT.class_id not in body
    assert CHAT.label not in body  # its info series went with it
    assert 'class_id="other"' in body
    metrics.record_outcome(CHAT, sample_outcome(3, 4, (1,)))
    assert sample_value(metrics, "specgw_verify_steps_total", class_id=CHAT.class_id) == 4
    info = {"class_id": CHAT.class_id, "label": CHAT.label}
    assert sample_value(metrics, "specgw_class_info", **info) == 1


def test_decision_reasons_are_folded_to_a_bounded_label(metrics: GatewayMetrics) -> None:
    body = render_metrics(metrics.registry)[0].decode()
    # Only the gateway's families: vLLM's own (finish `reason`, ...) share the endpoint
    # once an in-process engine has registered them earlier in the test session.
    ours = "\n".join(line for line in body.splitlines() if line.startswith("specgw_"))
    reasons = set(re.findall(r'reason="([^"]*)"', ours))
    assert reasons == {"goodput"}


def test_unknown_flags_are_not_exported() -> None:
    m = GatewayMetrics(CollectorRegistry(), max_depth=1, flags=FLAGS)
    m.set_flags([("not.a.flag", 1.0)])
    body = render_metrics(m.registry)[0].decode()
    assert "not.a.flag" not in body
    populate(m)
    assert sample_value(m, "specgw_flag_state", flag="speculation.k_max") == 4.0


def test_build_info_is_one_series_with_what_the_replica_runs(metrics: GatewayMetrics) -> None:
    labels = {
        "version": "0.1.0",
        "model": "specgw-default",
        "drafter": "eagle3.1",
        "vllm_version": "0.32.0",
        "max_depth": "4",
        "step_rule": "off",
    }
    assert sample_value(metrics, "specgw_build_info", **labels) == 1.0
    body = render_metrics(metrics.registry)[0].decode()
    assert len([line for line in body.splitlines() if line.startswith("specgw_build_info")]) == 1


def test_engine_state_is_one_hot_and_ready_only_in_ready() -> None:
    m = GatewayMetrics(CollectorRegistry(), max_depth=2)
    assert sample_value(m, "specgw_engine_ready") == 0.0
    assert sample_value(m, "specgw_engine_state", state="starting") == 1.0
    for state in EngineState:
        m.set_engine_state(state)
        values = {
            s.value: sample_value(m, "specgw_engine_state", state=s.value) for s in EngineState
        }
        assert values == {s.value: 1.0 if s is state else 0.0 for s in EngineState}
        ready = sample_value(m, "specgw_engine_ready")
        assert ready == (1.0 if state is EngineState.READY else 0.0)


def test_admission_wait_and_gateway_ttft_are_their_own_series() -> None:
    """The engine-side TTFT keeps its own family; the gateway's adds what came before."""
    m = GatewayMetrics(CollectorRegistry(), max_depth=2)
    m.record_outcome(C, sample_outcome(2, 5, (3, 1)))  # engine TTFT 0.08 s
    m.record_admission(C, 1.5)
    m.record_gateway_ttft(C, 1.5 + 0.08)
    c = {"class_id": C.class_id}
    assert sample_value(m, "specgw_time_to_first_token_seconds_sum", **c) == 0.08
    assert sample_value(m, "specgw_gateway_time_to_first_token_seconds_sum", **c) == 1.58
    assert sample_value(m, "specgw_admission_wait_seconds_sum", **c) == 1.5
    assert sample_value(m, "specgw_admission_wait_seconds_bucket", le="1.0", **c) == 0.0
    assert sample_value(m, "specgw_admission_wait_seconds_bucket", le="2.5", **c) == 1.0


def test_engine_steps_count_by_the_depth_every_decoder_verified() -> None:
    from prometheus_client import CollectorRegistry

    from engine.interface import EngineStep

    m = GatewayMetrics(CollectorRegistry(), max_depth=4)
    for step in (
        EngineStep(0.01, 3, 3 * 3),  # three decoders at depth 2
        EngineStep(0.01, 2, 2),  # depth 0
        EngineStep(0.01, 2, 2 + 3),  # 0 and 3: mixed
        EngineStep(0.01, 0, 0, prefill_requests=1, prefill_tokens=9),  # no decoder
    ):
        m.record_engine_step(False, step.common_depth(), step.decode_requests > 0)
    value = m.registry.get_sample_value
    assert value("specgw_engine_step_depth_total", {"depth": "2"}) == 1
    assert value("specgw_engine_step_depth_total", {"depth": "0"}) == 1
    assert value("specgw_engine_step_depth_total", {"depth": "mixed"}) == 1
    assert value("specgw_engine_steps_total", {"filed": "false"}) == 4


def test_each_steps_graph_mode_is_counted_where_the_engine_reports_it() -> None:
    """The FULL-graph share (`specgw_engine_cudagraph_steps_total`): vLLM's
    `CUDAGraphStat.runtime_mode` per step, nothing where it is not reported."""
    m = GatewayMetrics(CollectorRegistry(), max_depth=4)
    for mode in ("FULL", "FULL", "PIECEWISE", "NONE", None):
        m.record_engine_step(False, 2, True, mode)
    value = m.registry.get_sample_value
    assert value("specgw_engine_cudagraph_steps_total", {"mode": "FULL"}) == 2
    assert value("specgw_engine_cudagraph_steps_total", {"mode": "PIECEWISE"}) == 1
    assert value("specgw_engine_cudagraph_steps_total", {"mode": "NONE"}) == 1


def test_class_reports_export_the_positions_each_class_measured() -> None:
    """`export_class_reports`: the leading positions with verify steps of the class's own
    (`ClassReport.depth_trials`), 0 for a class still on a borrowed or prior profile."""
    metrics = GatewayMetrics(CollectorRegistry(), max_depth=4, flags=FLAGS)

    def report(label: str, trials: tuple[int, ...]) -> ClassReport:
        return ClassReport(
            class_id=label,
            label=label,
            samples=5,
            acceptance_length=1.0,
            acceptance_length_ci=(1.0, 1.0),
            acceptance_length_ewma=None,
            depth_profile=(0.7,) * len(trials),
            depth_trials=trials,
            k=0,
            k_by_batch={1: 0},
            reason="cold start: like chat/len:64",
            drift_state="stable",
            drifts=0,
            drift_statistic=0.25,
            explored=0,
        )

    reports = [
        report("borrowed", (0, 0, 0, 0)),
        report("shallow", (10, 5, 0, 0)),
        report("deep", (10, 5, 3, 1)),
    ]
    export_class_reports(metrics, reports)
    gauge = "specgw_class_measured_positions"
    got = {r.label: sample_value(metrics, gauge, class_id=r.class_id) for r in reports}
    assert got == {"borrowed": 0.0, "shallow": 2.0, "deep": 4.0}
    assert sample_value(metrics, "specgw_drift_score", class_id="deep") == 0.25
    metrics.forget_class("shallow")
    assert sample_value(metrics, gauge, class_id="shallow") is None
