"""Render the drift dashboard's main panels to `grafana/drift-dashboard.png` (matplotlib).

The data is SIMULATED, and the picture says so: one hour of three request classes,
each request drafting k tokens per verify step and accepting position p with the
class's per-position probability (chain stops at the first rejection, as in
speculative decoding). At minute 30 the `chat` class's system prompt changes and
its acceptance collapses; a controller lowers its k step by step. Per-minute series
are computed with the dashboard's own definitions (acceptance length = 1 + accepted /
verify steps, fallback share = k=0 requests / requests, tokens/s = output tokens /
60 s), so the picture shows what the panels draw, not a live capture.

Run: `.venv/bin/python grafana/render_drift_png.py` (deterministic: fixed seed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = Path(__file__).with_name("drift-dashboard.png")
MINUTES = 60
DRIFT_AT = 30


@dataclass
class SimClass:
    name: str
    profile: list[float]  # P(accept position p | accepted p-1)
    k: int
    requests_per_min: int
    step_s: float  # seconds per verify step
    k_schedule: dict[int, int] = field(default_factory=dict)  # minute -> new k
    drift_profile: list[float] | None = None


def simulate(cls: SimClass, rng: random.Random) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {"al": [], "k": [], "fb": [], "tps": [], "tpot": []}
    series.update({f"p{p}": [] for p in range(4)})
    k = cls.k
    for minute in range(MINUTES):
        k = cls.k_schedule.get(minute, k)
        profile = cls.drift_profile if cls.drift_profile and minute >= DRIFT_AT else cls.profile
        accepted = steps = fallback = tokens = 0
        drafted_at = [0] * 4
        accepted_at = [0] * 4
        step_time = 0.0
        for _ in range(cls.requests_per_min):
            k_req = k if rng.random() > 0.05 else min(4, max(0, k + rng.choice((-1, 1))))
            fallback += k_req == 0
            out = 0
            while out < 64:
                n = 0
                for p in range(k_req):  # vLLM counts every drafted position per step
                    drafted_at[p] += 1
                for p in range(k_req):
                    if rng.random() >= profile[p]:
                        break
                    accepted_at[p] += 1
                    n += 1
                steps += k_req > 0
                accepted += n
                out += n + 1
                step_time += cls.step_s * (1 + 0.12 * k_req)
            tokens += out
        series["al"].append(1 + accepted / steps if steps else float("nan"))
        series["k"].append(k)
        series["fb"].append(fallback / cls.requests_per_min)
        series["tps"].append(tokens / 60)
        series["tpot"].append(step_time / tokens * 1000)
        for p in range(4):
            series[f"p{p}"].append(
                accepted_at[p] / drafted_at[p] if drafted_at[p] else float("nan")
            )
    return series


def classes() -> list[SimClass]:
    return [
        SimClass(
            "chat/sys:3f2a/len:512",
            [0.82, 0.72, 0.62, 0.5],
            3,
            40,
            0.012,
            k_schedule={33: 2, 37: 1},
            drift_profile=[0.42, 0.3, 0.2, 0.12],
        ),
        SimClass("chat/tools/len:2048", [0.88, 0.8, 0.72, 0.65], 4, 25, 0.015),
        SimClass("completion/json_object/len:128", [0.3, 0.2, 0.1, 0.05], 0, 30, 0.011),
    ]


def render(path: Path = OUT) -> Path:
    rng = random.Random(7)
    sims = classes()
    data = {c.name: simulate(c, rng) for c in sims}
    t = list(range(MINUTES))
    fig, axes = plt.subplots(3, 2, figsize=(15, 11), constrained_layout=True)
    fig.suptitle(
        "spec-gateway / Speculation drift - main panels (SIMULATED data, see render_drift_png.py)",
        fontsize=13,
    )
    decisions = [m for c in sims for m in c.k_schedule]
    panels = [
        (axes[0][0], "al", "Acceptance length by class", "tokens / verify step"),
        (axes[0][1], "k", "Speculation depth k by class", "k"),
        (axes[1][1], "fb", "Fallback (k = 0) share by class", "share"),
        (axes[2][0], "tps", "Output tokens/s by class", "tokens/s"),
        (axes[2][1], "tpot", "TPOT p50 by class", "ms / token"),
    ]
    for ax, key, title, ylabel in panels:
        for name, series in data.items():
            style = {"drawstyle": "steps-post"} if key == "k" else {}
            ax.plot(t, series[key], label=name, linewidth=1.8, **style)
        ax.axvline(DRIFT_AT, color="red", linestyle="--", linewidth=1)
        for m in decisions:
            ax.axvline(m, color="tab:blue", linestyle=":", linewidth=1)
        ax.set_title(title, loc="left")
        ax.set_ylabel(ylabel)
        ax.set_xlabel("minutes")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="lower left", fontsize=8)
    axes[0][0].annotate("drift down (chat)", (DRIFT_AT + 0.5, 3.2), color="red", fontsize=8)
    axes[0][1].annotate("k decisions", (33.5, 3.6), color="tab:blue", fontsize=8)
    heat = axes[1][0]
    chat = data[sims[0].name]
    grid = [chat[f"p{p}"] for p in range(4)]
    image = heat.imshow(grid, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=1,
                        extent=(0, MINUTES, -0.5, 3.5))  # fmt: skip
    heat.set_yticks(range(4))
    heat.set_title(f"Depth profile: acceptance rate by draft position ({sims[0].name})", loc="left")
    heat.set_ylabel("draft position")
    heat.set_xlabel("minutes")
    fig.colorbar(image, ax=heat, label="P(accept)")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(render())
