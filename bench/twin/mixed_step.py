"""Put a measured mixed-step cost into cost profiles (`Profile.mixed_step`).

    python -m bench.twin.mixed_step bench/twin/measurements/mixed-depth-h100-llama8b.json \\
        bench/twin/profiles/measured-h100-llama8b-eagle3.json
    python -m bench.twin.mixed_step MEASUREMENT --plot ratios.png   # the ratios as a figure

`bench/gpu/gpu_pieces.py` times, on a GPU, the step in which b0 of b requests verify nothing
beside b - b0 verifying k drafts, run PIECEWISE as vLLM runs such a step, against the uniform
step at k with a FULL graph; `bench/mixed_step_cpu.py` times the same mix on the CPU engine
with per-request depths (its step clock). Each row becomes `ratio[b][k][b0 / b]`. A profile whose
figures come from elsewhere (a published profile of the same model shape) takes the table with
a source that says whose it is.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.twin.schema import Profile

#: Each measurement's ratio field and the command that measures it.
MEASURED_BY = {
    "piecewise_over_uniform": "python -m bench.gpu.gpu_pieces",
    "mixed_over_uniform": "python -m bench.mixed_step_cpu",
}


def _field(rows: list[dict[str, Any]]) -> str:
    """The ratio field of a measurement's rows (`MEASURED_BY`)."""
    for name in MEASURED_BY:
        if rows and all(name in row for row in rows):
            return name
    raise ValueError(f"rows need one ratio field of {sorted(MEASURED_BY)}")


def mixed_step_of(measurement: dict[str, Any], path: str) -> dict[str, Any]:
    """The `mixed_step` block of a `gpu_pieces` or `bench.mixed_step_cpu` output."""
    name = _field(measurement["rows"])
    ratio: dict[int, dict[int, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in measurement["rows"]:
        batch, share = row["batch"], row["zero"] / row["batch"]
        ratio[batch][row["k"]][round(share, 4)] = row[name]
    return {
        "source": f"{measurement['source']} ({path}; command: {MEASURED_BY[name]})",
        "ratio": {
            str(b): {
                str(k): {str(s): r for s, r in sorted(v.items())} for k, v in sorted(d.items())
            }
            for b, d in sorted(ratio.items())
        },
    }


def plot(measurement: dict[str, Any], title: str, path: Path) -> None:
    """The measurement's ratios to the uniform step at D, by share of the batch at k = 0:
    one panel per D, one line per batch size (the piecewise step; share 0: the graph loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = measurement["rows"]
    name = _field(rows)
    depths = sorted({r["k"] for r in rows})
    fig, axes = plt.subplots(1, len(depths), figsize=(5 * len(depths), 4), sharey=True)
    for ax, depth in zip(axes if len(depths) > 1 else [axes], depths, strict=True):
        for batch in sorted({r["batch"] for r in rows}):
            points = sorted(
                (r["zero"] / batch, r[name])
                for r in rows
                if r["k"] == depth and r["batch"] == batch
            )
            ax.plot(*zip(*points, strict=True), marker="o", label=f"batch {batch}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"D = {depth}")
        ax.set_xlabel("share of the batch at k = 0")
        ax.grid(alpha=0.3)
    (axes[0] if len(depths) > 1 else axes).set_ylabel("mixed step / uniform step at D")
    (axes[-1] if len(depths) > 1 else axes).legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(
    measurement: Annotated[
        Path, typer.Argument(help="A gpu_pieces or bench.mixed_step_cpu output (JSON).")
    ],
    profiles: Annotated[
        list[Path] | None, typer.Argument(help="Profiles to write it into.")
    ] = None,
    plot_to: Annotated[
        Path | None, typer.Option("--plot", help="Also draw the ratios into this PNG.")
    ] = None,
) -> None:
    """Write the measurement's mixed-step table into each profile, validated."""
    document = json.loads(measurement.read_text())
    if plot_to is not None:
        plot(document, measurement.stem, plot_to)
        typer.echo(f"wrote {plot_to}")
    block = mixed_step_of(document, str(measurement))
    for path in profiles or []:
        profile = json.loads(path.read_text())
        profile["mixed_step"] = block
        Profile.model_validate(profile)
        path.write_text(json.dumps(profile, indent=2) + "\n")
        typer.echo(f"wrote mixed_step into {path}")


if __name__ == "__main__":
    typer.run(main)
