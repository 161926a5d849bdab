"""Put a measured mixed-step cost into cost profiles (`Profile.mixed_step`).

    python -m bench.twin.mixed_step bench/twin/measurements/mixed-depth-h100-llama8b.json \\
        bench/twin/profiles/measured-h100-llama8b-eagle3.json

`bench/twin/gpu_pieces.py` times, on a GPU, the step in which b0 of b requests verify nothing
beside b - b0 verifying k drafts, run PIECEWISE as vLLM runs such a step, against the uniform
step at k with a FULL graph; each of its rows becomes `ratio[b][k][b0 / b]`. A profile whose
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


def mixed_step_of(measurement: dict[str, Any], path: str) -> dict[str, Any]:
    """The `mixed_step` block of a `gpu_pieces` output."""
    ratio: dict[int, dict[int, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in measurement["rows"]:
        batch, share = row["batch"], row["zero"] / row["batch"]
        ratio[batch][row["k"]][round(share, 4)] = row["piecewise_over_uniform"]
    return {
        "source": f"{measurement['source']} ({path}; command: python -m bench.twin.gpu_pieces)",
        "ratio": {
            str(b): {
                str(k): {str(s): r for s, r in sorted(v.items())} for k, v in sorted(d.items())
            }
            for b, d in sorted(ratio.items())
        },
    }


def main(
    measurement: Annotated[Path, typer.Argument(help="A gpu_pieces output (JSON).")],
    profiles: Annotated[list[Path], typer.Argument(help="Profiles to write it into.")],
) -> None:
    """Write the measurement's mixed-step table into each profile, validated."""
    block = mixed_step_of(json.loads(measurement.read_text()), str(measurement))
    for path in profiles:
        profile = json.loads(path.read_text())
        profile["mixed_step"] = block
        Profile.model_validate(profile)
        path.write_text(json.dumps(profile, indent=2) + "\n")
        typer.echo(f"wrote mixed_step into {path}")


if __name__ == "__main__":
    typer.run(main)
