"""The sensitivity run of adaptive verification: how far the classes' calibrations must differ.

`gateway-av` gains over `vllm-av` in two ways: its class bounds (the controller's depth
per class, the drafter skipped where every bound is 0), and one acceptance estimator per
class where vLLM pools one over every request (vLLM issue 57533). The second gains only
where the classes' calibrations differ: one logistic fit then mispredicts every class.
This run varies that difference and the signal's strength, on the same requests and
draws as the standard run, for the two modes alone:

- spread s: class c's AUC = centre + s z_c, centre the workload's AUC and z_c spaced
  evenly over [-1, 1] in the order of the class's first-draft acceptance (the lowest
  acceptance the lowest AUC, as the embedded drafter's measurement has it: tool calls
  lowest in both, `bench/results/confidence/calibration.json`), so the classes' AUCs
  span 2 s; `SPREADS` at full signal;
- the signal's strength: every class's separation d' times `SCALES` (weaker, stronger:
  `bench.twin.confidence`, `--confidence-scale`) at the spread the measurement reads.

The measured spread (`measured_spread`): half the range of the per-family AUCs of the
embedded EAGLE 3.1 and EAGLE-3 drafters, greedy and sampled (the families of `make
bench`: main chat, code, another template, an unfamiliar system prompt, tool calls,
long context). That is where this repository's real traffic sits on the spread axis;
GPU-sized drafters are not measured here.

    python -m bench twin --sensitivity --profile bench/twin/profiles/h100-llama8b-eagle3.json \
        --arrivals c1,c4 --seeds 1

writes `sensitivity.json`, `sensitivity.md` and `sensitivity.png` into `--out`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.twin.markdown import fmt, table
from bench.twin.modes.verify import GATEWAY_AV, VLLM_AV
from bench.twin.runner import Case, run_case
from bench.twin.schema import Workload

#: Spreads of the classes' AUC (half their range) at full signal.
SPREADS = (0.0, 0.05, 0.1, 0.15, 0.2)
#: Signal strengths (d' times this) at the measured spread.
SCALES = (0.5, 2.0)
#: The spread the weaker and stronger signal run at (about the measured one).
SCALED_SPREAD = 0.1
#: gateway-av over vllm-av that the issue asks of the production mix at c1 and c4.
TARGET = 1.03
MODES = (VLLM_AV, GATEWAY_AV)
CALIBRATION = Path(__file__).resolve().parents[2] / "bench/results/confidence/calibration.json"


def spread_workload(workload: Workload, spread: float) -> Workload:
    """The workload with class c's AUC at centre + spread z_c (module docstring)."""
    centre = workload.confidence.auc
    order = sorted(workload.classes, key=lambda n: (workload.classes[n].acceptance[0], n))
    last = max(len(order) - 1, 1)
    classes = {
        name: workload.classes[name].model_copy(
            update={"confidence_auc": centre + spread * (2.0 * i / last - 1.0)}
        )
        for i, name in enumerate(order)
    }
    return workload.model_copy(update={"classes": classes})


def measured_spread(path: Path = CALIBRATION) -> dict[str, float]:
    """Half the range of the per-family AUCs, per drafter and mode ("eagle3.1 greedy": s)."""
    if not path.exists():
        return {}
    drafters = json.loads(path.read_text())["drafters"]
    out = {}
    for drafter, modes in sorted(drafters.items()):
        for mode, families in sorted(modes.items()):
            aucs = [f["auc"] for name, f in families.items() if name != "all" and "auc" in f]
            if aucs:
                out[f"{drafter} {mode}"] = round((max(aucs) - min(aucs)) / 2.0, 4)
    return out


def grid() -> list[tuple[float, float]]:
    """(spread, scale) points: every spread at full signal, then the scales."""
    return [*((s, 1.0) for s in SPREADS), *((SCALED_SPREAD, x) for x in SCALES)]


def run(cases: Sequence[Case], seeds: Sequence[int]) -> dict[str, Any]:
    """gateway-av over vllm-av per profile, grid point, arrival and seed."""
    rows = []
    for case in cases:
        for spread, scale in grid():
            point = replace(
                case, workload=spread_workload(case.workload, spread), confidence_scale=scale
            )
            result = run_case(point, seeds, modes=list(MODES))
            for label, by_seed in result.cells.items():
                ratios = [
                    cell[GATEWAY_AV]["tokens_per_s"] / cell[VLLM_AV]["tokens_per_s"]
                    for cell in by_seed.values()
                ]
                rows.append(
                    {
                        "profile": case.profile.name,
                        "workload": case.workload.name,
                        "spread": spread,
                        "scale": scale,
                        "arrival": label,
                        "ratio": sorted(ratios)[len(ratios) // 2],
                        "seeds": len(ratios),
                    }
                )
    return {"rows": rows, "measured_spread": measured_spread(), "target": TARGET}


def needed_spread(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The smallest spread (linear between grid points, full signal) at which the ratio
    reaches TARGET; None where no spread of the grid reaches it."""
    points = sorted((float(r["spread"]), float(r["ratio"])) for r in rows if r["scale"] == 1.0)
    if points and points[0][1] >= TARGET:
        return points[0][0]
    for (s0, r0), (s1, r1) in itertools.pairwise(points):
        if r0 < TARGET <= r1:
            return s0 + (s1 - s0) * (TARGET - r0) / (r1 - r0)
    return None


def render(result: Mapping[str, Any]) -> str:
    """The tables: the ratio per spread and signal, per profile and arrival."""
    rows = result["rows"]
    lines = ["# Adaptive verification: sensitivity to the classes' calibrations", ""]
    lines += ["\n\n".join((__doc__ or "").split("\n\n")[1:4]), ""]
    measured = result["measured_spread"]
    if measured:
        where = ", ".join(f"{k} {fmt(v, 3)}" for k, v in measured.items())
        lines += [f"Measured spread (half the range of the families' AUCs): {where}.", ""]
    keys = sorted({(r["profile"], r["arrival"]) for r in rows})
    for profile, arrival in keys:
        mine = [r for r in rows if r["profile"] == profile and r["arrival"] == arrival]
        body = [
            [
                fmt(r["spread"], 2),
                fmt(r["scale"], 1),
                fmt(r["ratio"]),
                "yes" if r["ratio"] >= TARGET else "",
            ]
            for r in mine
        ]
        need = needed_spread(mine)
        lines += [
            f"## {profile} {arrival}: gateway-av / vllm-av",
            "",
            *table(["AUC spread", "signal (d' x)", "gateway-av / vllm-av", f">= {TARGET}"], body),
            "",
            "Spread needed for "
            + f"{TARGET}x: "
            + (
                "not reached on the grid"
                if need is None
                else "reached at no spread (the class bounds alone)"
                if need == 0.0
                else fmt(need, 3)
            ),
            "",
        ]
    return "\n".join(lines)


def plot(result: Mapping[str, Any], path: Path) -> None:
    """The ratio against the spread per profile and arrival, the target and the measured
    spreads marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["scale"] == 1.0]
    fig, ax = plt.subplots(figsize=(7, 4))
    for profile, arrival in sorted({(r["profile"], r["arrival"]) for r in rows}):
        mine = sorted(
            (r["spread"], r["ratio"])
            for r in rows
            if r["profile"] == profile and r["arrival"] == arrival
        )
        ax.plot(*zip(*mine, strict=True), marker="o", label=f"{profile} {arrival}")
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1, label=f"{TARGET}x")
    ax.axhline(1.0, color="black", linewidth=0.5)
    for i, spread in enumerate(result["measured_spread"].values()):
        ax.axvline(
            spread, color="tab:red", alpha=0.3, linewidth=1, label="measured" if i == 0 else None
        )
    ax.set_xlabel("spread of the classes' AUC (half their range)")
    ax.set_ylabel("gateway-av / vllm-av tokens/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: Mapping[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sensitivity.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (out / "sensitivity.md").write_text(render(result) + "\n")
    plot(result, out / "sensitivity.png")
