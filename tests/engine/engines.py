"""Engine settings and Prometheus helpers shared by the real-engine test modules."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from engine.settings import EngineSettings
from tests.models import model_pair

GREEDY_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The JSON encoder turns Python objects into",
    "import json\n\ndata = json.loads(",
    "class Point:\n    def __init__(self, x, y):",
)


def engine_settings(*, speculative: bool = True, max_depth: int = 4) -> EngineSettings:
    models = model_pair()
    return EngineSettings(
        model=models.target,
        drafter=models.drafter if speculative else None,
        max_depth=max_depth,
        kv_cache_gib=1,
        max_model_len=1024,
        max_num_seqs=16,
        dtype="float32",  # exact greedy comparisons across batch shapes
        warmup_prompts=2,
    )


def counter_total(name: str) -> float:
    """Sum of a vLLM counter over all label sets (vLLM registers in the default registry)."""
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == name:
                total += sample.value
    return total


def per_position_totals() -> dict[int, float]:
    out: dict[int, float] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                pos = int(sample.labels["position"])
                out[pos] = out.get(pos, 0.0) + sample.value
    return out


__all__ = ["GREEDY_PROMPTS", "Path", "counter_total", "engine_settings", "per_position_totals"]
