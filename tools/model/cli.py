"""`spec-gateway model build|measure`: a typer app the gateway's CLI mounts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Build and measure the embedded default model.", no_args_is_help=True)

OutOpt = Annotated[
    Path | None, typer.Option(help="Output directory, replaced atomically (default: shipped).")
]
BudgetOpt = Annotated[str, typer.Option(help="full (about 35 min on 2 cores) or tiny (< 1 min).")]
StdlibOpt = Annotated[
    Path | None, typer.Option(help="Standard-library source dir (default: running Python's).")
]


ReuseOpt = Annotated[
    Path | None,
    typer.Option(help="Train only the drafters, on the target already built in this directory."),
]


@app.command()
def build(
    out: OutOpt = None,
    budget: BudgetOpt = "full",
    stdlib: StdlibOpt = None,
    reuse_target: ReuseOpt = None,
) -> None:
    """Build tokenizer, target and both drafters from the standard library, with a manifest."""
    from engine.model_paths import default_model_root
    from tools.model.build import BuildError
    from tools.model.build import build as run_build
    from tools.model.corpus import CorpusError

    if budget not in ("full", "tiny"):
        raise typer.BadParameter("budget must be 'full' or 'tiny'")
    target = out or default_model_root()
    try:
        manifest = run_build(target, budget, stdlib, reuse_target)  # type: ignore[arg-type]
    except (BuildError, CorpusError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"built {target} in {manifest['build_seconds']} s")


@app.command()
def measure(
    root: Annotated[Path | None, typer.Option(help="Built model directory.")] = None,
    prompts: Annotated[int, typer.Option(help="Held-out prompts per family.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt.")] = 96,
    depths: Annotated[
        str, typer.Option(help="Speculation depths k, comma-separated.")
    ] = "1,2,3,4,5",
    out: Annotated[Path | None, typer.Option(help="Where acceptance.md/json go.")] = None,
) -> None:
    """Acceptance length per family and k, both drafters, through vLLM's per-request metrics."""
    from engine.model_paths import default_model_root
    from tools.model.measure import run_measure

    model = root or default_model_root()
    ks = [int(k) for k in depths.split(",") if k.strip()]
    run_measure(model, prompts, max_tokens, ks, out or model)


if __name__ == "__main__":
    app()
