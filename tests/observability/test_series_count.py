"""Class identity and cost in the exposition: series keyed by class id with one info
series per class, no `_created`, and the per-class and per-replica counts the catalogue
states (`gateway.observability.metrics`), counted from the real registry's text."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.control.classify import OTHER, RequestClass
from gateway.control.controller import Controller
from gateway.control.features import RequestFeatures, features_from_chat
from gateway.control.settings import ControllerSettings
from gateway.observability.events import MetricsEvents
from gateway.observability.metrics import GatewayMetrics, class_series, render_metrics
from gateway.telemetry import UNCLASSIFIED
from tests.observability.conftest import FLAGS, sample_outcome

K = 4
#: The controller's default class cap (`ControllerSettings.max_classes`).
CAP = ControllerSettings().max_classes


def samples(metrics: GatewayMetrics) -> list[tuple[str, dict[str, str]]]:
    """Every `specgw_*` sample line of the replica's `/metrics` body, parsed."""
    body = render_metrics(metrics.registry)[0].decode()
    return [
        (s.name, s.labels)
        for family in text_string_to_metric_families(body)
        if family.name.startswith("specgw_")
        for s in family.samples
    ]


def serve_one(metrics: GatewayMetrics, cls: RequestClass) -> None:
    """What one request and the next scrape record for its class (`GatewayTelemetry`,
    `export_class_reports`): every family bound on a class's first request."""
    metrics.record_request(cls, 200)
    metrics.record_depth(cls, 3)
    metrics.record_outcome(cls, sample_outcome(K, 10, (8, 5, 2, 1)))
    metrics.record_admission(cls, 0.02)
    metrics.record_gateway_ttft(cls, 0.1)
    metrics.record_drift_score(cls, 0.1)
    metrics.record_measured_positions(cls, 3)


def test_series_per_class_and_per_replica_at_the_class_cap() -> None:
    replica = GatewayMetrics(CollectorRegistry(), max_depth=K, flags=FLAGS)
    own = len(samples(replica))  # the replica's families, before any class
    classes = [RequestClass(f"{i:016x}", f"chat/len:{i}") for i in range(CAP)] + [OTHER]
    for cls in classes:
        serve_one(replica, cls)
    lines = samples(replica)
    per_class = [n for n, labels in lines if labels.get("class_id") == classes[0].class_id]
    # The catalogue's docstring: 115 + 2 K, one `specgw_requests_total` per status met.
    assert class_series(K) == 123
    assert len(per_class) == class_series(K) + 1
    assert len(lines) - own == (CAP + 1) * (class_series(K) + 1) == 8060
    assert not [n for n, _ in lines if n.endswith("_created")]
    # Measured before class ids and without `_created`: 145 per class (22 of them
    # `_created`) and 9,465 in all at this cap.
    print(f"per class {len(per_class)}, replica {len(lines)} ({own} of its own)")


def test_refused_requests_count_under_one_unclassified_id_with_its_info() -> None:
    metrics = GatewayMetrics(CollectorRegistry(), max_depth=K)
    metrics.record_request(UNCLASSIFIED, 400, "invalid_request_error")
    ids = {labels.get("class_id") for _, labels in samples(metrics)} - {None}
    assert ids == {"unclassified"}
    info = {"class_id": "unclassified", "label": "unclassified"}
    assert metrics.registry.get_sample_value("specgw_class_info", info) == 1


def tools_request(tool_choice: str | None) -> RequestFeatures:
    """The features of a chat request offering one tool, as the chat route reads them."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    return features_from_chat(messages, [weather], tool_choice, None, prompt_tokens=60)


def test_two_classes_with_one_label_keep_their_own_series_and_eviction() -> None:
    """Tools with `tool_choice` unset and `"auto"` are two classes with one label: each
    keeps its series, and evicting one (the controller's LRU, through `MetricsEvents`)
    removes its series and info only."""
    now = [0.0]
    metrics = GatewayMetrics(CollectorRegistry(), max_depth=K)
    settings = ControllerSettings(max_classes=2, class_idle_s=1.0)
    controller = Controller(
        settings, max_depth=K, events=MetricsEvents(metrics), clock=lambda: now[0]
    )
    unset = controller.classify(tools_request(None))
    now[0] = 1.0
    auto = controller.classify(tools_request("auto"))
    assert unset.label == auto.label == "chat/tools/len:64"
    assert unset.class_id != auto.class_id
    metrics.record_outcome(unset, sample_outcome(3, 10, (8, 5, 2)))
    metrics.record_outcome(auto, sample_outcome(1, 4, (1,)))
    value = metrics.registry.get_sample_value
    assert value("specgw_verify_steps_total", {"class_id": unset.class_id}) == 10
    assert value("specgw_verify_steps_total", {"class_id": auto.class_id}) == 4
    info = {cls.class_id: {"class_id": cls.class_id, "label": cls.label} for cls in (unset, auto)}
    assert all(value("specgw_class_info", labels) == 1 for labels in info.values())

    now[0] = 5.0  # both idle past class_idle_s: a third class evicts the older one
    third = controller.classify(tools_request("required"))
    assert third.class_id not in (unset.class_id, auto.class_id)
    ids = {labels.get("class_id") for _, labels in samples(metrics)}
    assert unset.class_id not in ids
    assert auto.class_id in ids
    assert value("specgw_class_info", info[unset.class_id]) is None
    assert value("specgw_class_info", info[auto.class_id]) == 1
    assert value("specgw_verify_steps_total", {"class_id": auto.class_id}) == 4
