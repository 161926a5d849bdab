"""Per-class acceptance from `specgw_*` reconciles with vLLM's own `vllm:*` counters.

A real vLLM CPU engine (tiny rigged target + EAGLE 3.1 drafter, acceptance about 1/2
per position) serves two classes at different k plus a k = 0 class; the gateway's
catalogue records each outcome. Summed over classes, accepted tokens, verify steps
and per-position acceptances must equal the deltas of vLLM's engine-wide counters
(vLLM counts one "draft" per request per verify step), so the per-class acceptance
length `1 + accepted / verify_steps` is the engine's, split by class.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from engine.interface import GenerateRequest
from engine.settings import EngineSettings
from engine.vllm.engine import VLLMEngine
from gateway.control.classify import RequestClass
from gateway.observability.metrics import GatewayMetrics
from tests.models import model_pair

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

PROMPTS = ("The quick brown fox", "Once upon a time", "def main():", "Dear team,")


def vllm_totals(max_depth: int) -> dict[str, float]:
    def total(name: str, **labels: str) -> float:
        value = 0.0
        for family in REGISTRY.collect():
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    value += sample.value
        return value

    out = {
        "accepted": total("vllm:spec_decode_num_accepted_tokens_total"),
        "steps": total("vllm:spec_decode_num_drafts_total"),
        "drafted": total("vllm:spec_decode_num_draft_tokens_total"),
    }
    for p in range(max_depth):
        out[f"pos{p}"] = total(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)
        )
    return out


def gateway_totals(m: GatewayMetrics, classes: list[str]) -> dict[str, float]:
    def total(name: str, **labels: str) -> float:
        return sum(
            m.registry.get_sample_value(name, {"class_id": c, **labels}) or 0.0 for c in classes
        )

    out = {
        "accepted": total("specgw_accepted_tokens_total"),
        "steps": total("specgw_verify_steps_total"),
        "drafted": total("specgw_draft_tokens_total"),
    }
    for p in range(m.max_depth):
        out[f"pos{p}"] = total("specgw_accepted_tokens_per_position_total", position=str(p))
    return out


async def test_gateway_acceptance_reconciles_with_vllm_counters() -> None:
    models = model_pair()
    settings = EngineSettings(
        model=models.target,
        drafter=models.drafter,
        max_depth=3,
        kv_cache_gib=1,
        per_request_metrics="detailed",
    )
    async with VLLMEngine.started(settings) as engine:
        metrics = GatewayMetrics(CollectorRegistry(), max_depth=engine.max_depth)
        classes = {"deep": 3, "shallow": 1, "off": 0}
        await asyncio.sleep(0.5)  # let the warm-up's last stats land before the baseline
        before = vllm_totals(engine.max_depth)

        async def run(cls: str, k: int, i: int) -> None:
            request = GenerateRequest(
                request_id=f"reconcile-{cls}-{i}", prompt=PROMPTS[i % 4], max_tokens=24, k=k
            )
            async for chunk in engine.generate(request):
                if chunk.outcome is not None:
                    metrics.record_outcome(RequestClass(cls, cls), chunk.outcome)

        await asyncio.gather(*(run(cls, k, i) for cls, k in classes.items() for i in range(4)))
        await asyncio.sleep(1.0)  # stats of the last step are logged after its outputs
        after = vllm_totals(engine.max_depth)
    engine_delta = {key: after[key] - before[key] for key in after}
    ours = gateway_totals(metrics, list(classes))
    print("vllm delta", engine_delta, "gateway", ours)
    assert ours["steps"] > 0
    assert 0 < ours["accepted"] < ours["drafted"]
    assert ours == engine_delta
    assert metrics.registry.get_sample_value("specgw_verify_steps_total", {"class_id": "off"}) == 0
    assert (
        metrics.registry.get_sample_value("specgw_fallback_requests_total", {"class_id": "off"})
        == 4
    )
