"""What `make gpu-smoke`'s engines say about themselves: pure parsers, no engine.

Three sources, each read as it is: the gateway's `/metrics` (its build labels, the
depths its engine's steps verified, and a CUDA-graph step counter where one is
exported), vLLM's start-up log (its resolved graph config, its capture summary) and
`spec-gateway plan` (the batch-depth rule and FULL-graph widths the gateway computes
for this machine). A figure none of them gives is reported as n/a with the reason,
never estimated.
"""

from __future__ import annotations

import re

#: Labels a CUDA-graph step counter may carry its runtime mode in (FULL, PIECEWISE, NONE).
GRAPH_MODE_LABELS = ("runtime_mode", "cudagraph_mode", "mode")
#: Why the replay share is blank when no such counter is on `/metrics`.
NO_GRAPH_COUNTS = (
    "the gateway's /metrics has no CUDA-graph step counter: vLLM hands each step's "
    "CUDAGraphStat (observability_config.cudagraph_metrics) only to its logging stat "
    "logger, which the embedded engine never asks to log"
)
Samples = list[tuple[str, dict[str, str], float]]


def parse_metrics(text: str) -> Samples:
    """(name, labels, value) of every sample of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def graph_steps(samples: Samples) -> dict[str, float] | None:
    """Engine steps by CUDA-graph runtime mode, from any `*cudagraph*_total` counter
    with a mode label (vLLM's or the gateway's); None when there is none."""
    counts: dict[str, float] | None = None
    for name, labels, value in samples:
        mode = next((labels[k] for k in GRAPH_MODE_LABELS if k in labels), None)
        if "cudagraph" not in name or not name.endswith("_total") or mode is None:
            continue
        counts = counts or {}
        mode = mode.rsplit(".", 1)[-1].upper()  # `CUDAGraphMode.FULL` or `FULL`
        counts[mode] = counts.get(mode, 0.0) + value
    return counts


def step_depths(samples: Samples) -> dict[str, float]:
    """Decoding steps by the drafts each verified (`specgw_engine_step_depth_total`)."""
    return {
        labels["depth"]: value
        for name, labels, value in samples
        if name == "specgw_engine_step_depth_total" and "depth" in labels
    }


def build_info(samples: Samples) -> dict[str, str]:
    return next((labels for name, labels, _ in samples if name == "specgw_build_info"), {})


def delta(
    after: dict[str, float] | None, before: dict[str, float] | None
) -> dict[str, float] | None:
    if after is None:
        return None
    before = before or {}
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


_EAGER = re.compile(r"enforce_eager=(True|False)")
_GRAPH_MODE = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)")
_CAPTURE_SIZES = re.compile(r"'cudagraph_capture_sizes': \[([\d, ]*)\]")


def log_facts(log: str) -> dict[str, str]:
    """What the engine's start-up log says: vLLM's resolved config line (eager, graph
    mode, capture sizes) and its graph-capture summary (time, memory)."""
    facts: dict[str, str] = {}
    for line in log.splitlines():
        if "Initializing a V1 LLM engine" in line:
            for key, pattern in (("enforce_eager", _EAGER), ("cudagraph_mode", _GRAPH_MODE)):
                if m := pattern.search(line):
                    facts[key] = m.group(1)
            if m := _CAPTURE_SIZES.search(line):
                sizes = [int(s) for s in m.group(1).replace(" ", "").split(",") if s]
                facts["capture_sizes"] = _span(sizes)
        elif "Graph capturing finished" in line:
            facts["graph_capture"] = line.split("Graph capturing", 1)[1].strip()
    return facts


#: The lines of `spec-gateway plan`'s section for this machine that `report` shows.
PLAN_LINES = {"rule": "batch-depth rule:", "full_graphs": "FULL decode graphs:"}


def plan_facts(
    engine: str, status: int, stdout: str, stderr: str
) -> tuple[dict[str, str], list[str]]:
    """What `spec-gateway plan` gives for this machine, the batch-depth rule (policy,
    step depths) and the FULL decode graphs (width, widest batch per depth); or, where
    it refuses the settings (exit 2: `serve` would refuse them or silently lose a
    feature) or fails, that as a failure."""
    if status != 0:
        why = (stderr.strip().splitlines() or ["no message"])[-1][:300]
        verb = "refuses it" if status == 2 else f"failed (exit status {status})"
        return {}, [f"{engine} engine: spec-gateway plan {verb}: {why}"]
    _, here, rest = stdout.partition("[this machine")
    facts = {}
    for line in rest.split("\n\n", 1)[0].splitlines() if here else []:
        for key, prefix in PLAN_LINES.items():
            if line.strip().startswith(prefix):
                facts[key] = line.strip()[len(prefix) :].strip()
    return facts, []


def _span(sizes: list[int]) -> str:
    ordered = sorted(set(sizes))
    if len(ordered) <= 6:
        return str(ordered)
    return f"{len(ordered)} sizes, {ordered[0]}..{ordered[-1]}"
