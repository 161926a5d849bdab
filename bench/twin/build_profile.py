"""Build a twin cost profile from a gateway's measured step costs or from vLLM's profiler.

    python -m bench.twin.build_profile --admin-costs http://HOST:8000/admin/costs \\
        --admin-key KEY --out bench/twin/profiles/mine.json
    python -m bench.twin.build_profile --admin-costs costs.json --out mine.json
    python -m bench.twin.build_profile --vllm-profile dynamic_speculative_config.json \\
        --prefill-ms-per-token 0.03 --no-spec-overhead 0.066 --out mine.json

`/admin/costs` (`gateway.runtime`: `calibration`, `buckets`, `prefill_ms_per_token`): the start-up
calibration (`gateway.calibration.calibrate`) times each depth 0..K at each calibrated batch
size by the engine's step clock; those medians become `batch_stats`, the time to the first token
at each depth less k = 0's at the smallest batch becomes `first_token_extra_ms`, and the cold
prefill per prompt token becomes the target's prefill cost. The drafter's own prefill is not
timed apart: it is inside the calibration's first-token times (`drafter` is 0). With
`--use-learned`, each calibrated batch's k > 0 times are its k = 0 time multiplied by the cost
model's relative cost in that bucket as traffic left it (`buckets[].relative_cost`), so the
profile carries what the gateway learned since start-up. The gateway runs with a drafter, so
its profile has no `no_spec_step_ms` (the twin takes k = 0's).

vLLM's dynamic speculative decoding profiler (`batch_stats: {batch: {k: median ms}}`,
`acceptance_rate_per_pos`, `max_num_speculative_tokens`) gives `batch_stats` as it is; the first
drafts are priced as a batch-1 step's extra over k = 0 at each k; the prefill costs, which the
profiler does not measure, come from the options, and `--no-spec-overhead h` sets the engine
without a drafter at k = 0's time / (1 + h) (vLLM issue 49986 measured h = 0.066 for an EAGLE-3
head on Llama-3.1-8B).

A `make bench` run's `summary.json` (`--bench-summary`) gives the CPU engine's profile from the
run's client-side figures (`bench.twin.bench_profile.from_bench_summary` states the rule);
`--validation-out` also writes the run's tokens/s for the twin's validation; `--beyond FILE`
(saved `/admin/costs` answers whose calibration timed the run's largest batch and larger ones)
carries it past that batch (`bench.twin.calibrated`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.twin.bench_profile import from_bench_summary, run_inputs
from bench.twin.calibrated import beyond_largest, median_by
from gateway.control.cost_model import batch_bucket


def _fetch(location: str, admin_key: str | None) -> Any:
    """JSON from a file, or from a URL with the admin key as a bearer token."""
    if location.startswith(("http://", "https://")):
        import httpx

        headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        return httpx.get(location, headers=headers, timeout=30).raise_for_status().json()
    return json.loads(Path(location).read_text())


def _learned(
    stats: dict[int, dict[int, float]], buckets: list[Mapping[str, Any]]
) -> dict[int, dict[int, float]]:
    """Each calibrated batch's k > 0 times as k = 0's x the bucket's learned relative cost."""
    relative = {int(b["batch_bucket"]): list(b.get("relative_cost") or []) for b in buckets}
    out: dict[int, dict[int, float]] = {}
    for batch, row in stats.items():
        costs = relative.get(batch_bucket(batch))
        if not costs or 0 not in row:
            out[batch] = row
            continue
        out[batch] = {k: round(row[0] * float(c), 3) for k, c in enumerate(costs)}
    return out


def from_admin_costs(body: Mapping[str, Any], use_learned: bool = False) -> dict[str, Any]:
    """Profile data (without name) from `/admin/costs` (module docstring)."""
    points = list(body.get("calibration") or [])
    stats = median_by(points, "step_ms")
    if not stats or any(0 not in row for row in stats.values()):
        raise ValueError(
            "/admin/costs has no calibration at k = 0 for every batch size: start the gateway "
            "with the start-up calibration on (SPECGW_CONTROL_CALIBRATE_BATCHES, e.g. [1, 4, 16])"
        )
    if use_learned:
        stats = _learned(stats, list(body.get("buckets") or []))
    firsts = median_by(points, "ttft_ms")
    smallest = firsts.get(min(firsts), {}) if firsts else {}
    first_extra = {
        k: round(max(ms - smallest[0], 0.0), 3) for k, ms in smallest.items() if k and 0 in smallest
    }
    batches = ", ".join(str(b) for b in stats)
    return {
        "source": (
            "Built by bench.twin.build_profile from a gateway's /admin/costs: median step ms per "
            f"batch size ({batches}) and depth from its start-up calibration, timed by the "
            "engine's step clock"
            + (", k > 0 scaled by the cost model's learned relative costs" if use_learned else "")
            + "; first-token extra per depth at the smallest batch; the cold prefill per prompt "
            "token (the drafter's prefill is inside the first-token times)."
        ),
        "max_k": max(k for row in stats.values() for k in row),
        "batch_stats": stats,
        "prefill_ms_per_token": {
            "target": float(body.get("prefill_ms_per_token") or 0.0),
            "drafter": 0.0,
        },
        "first_token_extra_ms": first_extra,
    }


def from_vllm_profile(
    body: Mapping[str, Any],
    prefill_ms_per_token: float,
    drafter_ms_per_token: float,
    no_spec_overhead: float | None,
) -> dict[str, Any]:
    """Profile data (without name) from vLLM's dynamic-SD profiler output (module docstring)."""
    stats = {
        int(b): {int(k): float(ms) for k, ms in sorted(row.items(), key=lambda i: int(i[0]))}
        for b, row in sorted(body["batch_stats"].items(), key=lambda i: int(i[0]))
    }
    if 1 not in stats or any(0 not in row for row in stats.values()):
        raise ValueError("the profile needs batch size 1 and k = 0 at every batch size")
    data: dict[str, Any] = {
        "source": (
            "Built by bench.twin.build_profile from vLLM's dynamic speculative decoding profile "
            "(batch_stats, acceptance_rate_per_pos); first-token extra = a batch-1 step's extra "
            f"over k = 0; prefill {prefill_ms_per_token} ms per prompt token (target) and "
            f"{drafter_ms_per_token} (drafter) given on the command line"
            + (
                f"; no-drafter engine = k = 0 / {1 + no_spec_overhead:g}"
                if no_spec_overhead is not None
                else ""
            )
            + "."
        ),
        "max_k": int(
            body.get("max_num_speculative_tokens") or max(k for r in stats.values() for k in r)
        ),
        "batch_stats": stats,
        "prefill_ms_per_token": {"target": prefill_ms_per_token, "drafter": drafter_ms_per_token},
        "first_token_extra_ms": {
            k: round(ms - stats[1][0], 3) for k, ms in stats[1].items() if k and ms > stats[1][0]
        },
    }
    if no_spec_overhead is not None:
        data["no_spec_step_ms"] = {
            b: round(row[0] / (1 + no_spec_overhead), 3) for b, row in stats.items()
        }
    rates = body.get("acceptance_rate_per_pos")
    if rates:
        data["acceptance_rate_per_pos"] = [float(r) for r in rates]
    return data


def main(
    out: Annotated[Path, typer.Option(help="Profile JSON to write.")],
    admin_costs: Annotated[
        str | None, typer.Option(help="/admin/costs: a URL or a saved answer.")
    ] = None,
    vllm_profile: Annotated[
        Path | None, typer.Option(help="vLLM's dynamic-SD profiler output (JSON).")
    ] = None,
    admin_key: Annotated[str | None, typer.Option(help="Admin key for a URL.")] = None,
    use_learned: Annotated[
        bool, typer.Option(help="Scale k > 0 by the cost model's learned relative costs.")
    ] = False,
    prefill_ms_per_token: Annotated[float, typer.Option(help="Target prefill (vLLM).")] = 0.0,
    drafter_ms_per_token: Annotated[float, typer.Option(help="Drafter prefill (vLLM).")] = 0.0,
    no_spec_overhead: Annotated[
        float | None, typer.Option(help="k = 0's cost over an engine without drafter (vLLM).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Profile name (default: file stem).")] = None,
    zero_skips_drafter: Annotated[
        bool,
        typer.Option(
            help="A depth-0 step skips the drafter (vLLM's V1 runner, as on the CPU); "
            "off for Model Runner V2 (CUDA's default)."
        ),
    ] = False,
    bench_summary: Annotated[
        Path | None, typer.Option(help="A `make bench` run's summary.json.")
    ] = None,
    validation_out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the run's tokens/s for the twin's validation (--bench-summary)."
        ),
    ] = None,
    beyond: Annotated[
        list[Path] | None,
        typer.Option(
            help="A saved /admin/costs whose calibration timed the run's largest batch and "
            "larger ones: those batches' rows from each depth's growth (--bench-summary; "
            "repeat for several calibrations)."
        ),
    ] = None,
) -> None:
    """Write a twin cost profile from /admin/costs, vLLM's profiler output or a bench run."""
    from bench.twin.schema import Profile

    sources = [admin_costs, vllm_profile, bench_summary]
    if sum(s is not None for s in sources) != 1:
        raise typer.BadParameter(
            "give exactly one of --admin-costs, --vllm-profile and --bench-summary"
        )
    if beyond and bench_summary is None:
        raise typer.BadParameter("--beyond extends a --bench-summary profile")
    try:
        if admin_costs is not None:
            data = from_admin_costs(_fetch(admin_costs, admin_key), use_learned)
        elif vllm_profile is not None:
            body = json.loads(vllm_profile.read_text())
            data = from_vllm_profile(
                body, prefill_ms_per_token, drafter_ms_per_token, no_spec_overhead
            )
        else:
            assert bench_summary is not None
            data = _from_bench_run(
                bench_summary, out, name, zero_skips_drafter, validation_out, beyond or []
            )
    except ValueError as err:  # an input that cannot make a profile: say which, no traceback
        raise typer.BadParameter(str(err)) from err
    notes = data.pop("notes", None)
    profile = {"name": name or out.stem, **data, "zero_skips_drafter": zero_skips_drafter}
    if notes:
        profile["notes"] = notes
    Profile.model_validate(profile)
    out.write_text(json.dumps(profile, indent=2) + "\n")
    typer.echo(f"wrote {out}: batch sizes {', '.join(str(b) for b in data['batch_stats'])}")


def _from_bench_run(
    summary_path: Path,
    out: Path,
    name: str | None,
    zero_skips_drafter: bool,
    validation_out: Path | None,
    beyond: list[Path],
) -> dict[str, Any]:
    """`from_bench_summary` on a file, quoting the command, carried past its largest batch
    by the calibrations in `beyond` (`bench.twin.calibrated`); the validation's cut beside it."""
    from bench.twin.validation import real_run_cut

    summary = json.loads(summary_path.read_text())
    command = " ".join(
        [
            "python -m bench.twin.build_profile",
            f"--bench-summary {summary_path}",
            *([f"--name {name}"] if name else []),
            *(["--zero-skips-drafter"] if zero_skips_drafter else []),
            *([f"--validation-out {validation_out}"] if validation_out else []),
            *(f"--beyond {path}" for path in beyond),
            f"--out {out}",
        ]
    )
    prompt_tokens, drafter_share = run_inputs(summary)
    data = from_bench_summary(summary, prompt_tokens, drafter_share, command)
    if beyond:
        data = beyond_largest(data, [(str(p), json.loads(p.read_text())) for p in beyond])
    if validation_out is not None:
        cut = real_run_cut(summary, str(summary_path), command)
        validation_out.write_text(json.dumps(cut, indent=1, sort_keys=True) + "\n")
    return data


if __name__ == "__main__":
    typer.run(main)
