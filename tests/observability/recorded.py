"""vLLM's `vllm:*` series recorded from a real gateway, and a collector that replays them.

The in-process test gateways run on the fake backend, which has no vLLM engine and so
no `vllm:*` series; the vLLM dashboard's queries need them. `RecordedVllmSeries`
serves the families of `recorded/vllm_exposition.txt` (the `/metrics` of a real
gateway after a short mixed load) as they were, except that counters and histogram
counts and sums grow with time (x (1 + t / 10 s)), so `rate()` over them is positive:
a replay, labelled as one, not vLLM. Quantiles and ratios of the recording stay
what they were (every counter of a family scales alike).

Re-record with a real engine (two minutes on a 2-core CPU):

    .venv/bin/python -m tests.observability.recorded
"""

from __future__ import annotations

import concurrent.futures
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

RECORDING = Path(__file__).parent / "recorded" / "vllm_exposition.txt"
#: Seconds over which the replayed counters double.
GROWTH_S = 10.0


class RecordedVllmSeries(Collector):
    """A prometheus-client collector of the recorded `vllm:*` families, growing counters."""

    def __init__(self, text: str | None = None) -> None:
        body = text if text is not None else RECORDING.read_text()
        # prometheus-client writes each counter's `_created` as a gauge family of its own:
        # left out (the counters' own names cover them, and nothing reads them).
        self._families = [
            f
            for f in text_string_to_metric_families(body)
            if f.name.startswith("vllm:") and not f.name.endswith("_created")
        ]
        self._start = time.monotonic()

    def collect(self) -> Iterator[Metric]:
        factor = 1.0 + (time.monotonic() - self._start) / GROWTH_S
        for family in self._families:
            grows = family.type in ("counter", "histogram")
            out = Metric(family.name, family.documentation, family.type)
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                out.add_sample(s.name, s.labels, s.value * factor if grows else s.value)
            yield out


def record(base_url: str, api_key: str) -> str:
    """A short mixed load on a real gateway, then its `vllm:*` exposition lines."""
    headers = {"authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as http:
        model = http.get("/v1/models").json()["data"][0]["id"]

        def chat(i: int) -> int:
            system = ("You are terse.", "You write Python.", "You answer in JSON.")[i % 3]
            body = {
                "model": model,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "hi"},
                ],
                "max_tokens": 24,
                "temperature": 0,
                "stream": i % 2 == 0,
            }
            return http.post("/v1/chat/completions", json=body).status_code

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(chat, range(16)))
        assert statuses.count(200) == len(statuses), statuses
        time.sleep(2)  # vLLM's stat loggers publish after the last step
        text = http.get("/metrics").text
    keep = [line for line in text.splitlines() if "vllm:" in line]
    return "\n".join(keep) + "\n"


def main() -> None:
    from bench.gateway_proc import BENCH_KEY, GatewayConfig, model_paths, start_gateway
    from tests.gateway.conftest import NO_CALIBRATION

    with tempfile.TemporaryDirectory(prefix="record-vllm-") as tmp:
        env = dict(NO_CALIBRATION)
        gw = start_gateway(GatewayConfig("record", env=env), model_paths(Path(tmp)), Path(tmp))
        try:
            text = record(gw.base_url, BENCH_KEY)
        finally:
            gw.stop()
    RECORDING.parent.mkdir(exist_ok=True)
    RECORDING.write_text(text)
    print(f"{RECORDING}: {len(text.splitlines())} lines")


if __name__ == "__main__":
    main()
