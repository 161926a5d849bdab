"""Build a twin workload from what a real deployment recorded.

    python -m bench.twin.build_workload --from-run results/bench/STAMP/runs.jsonl --out w.json
    python -m bench.twin.build_workload --from-classes classes.json --out w.json

From a benchmark run (`runs.jsonl`, written by `bench.runner.JsonlSink`): one class per request
family; its acceptance per draft position fitted to the acceptance lengths its requests measured
at each k (`conditional_from_lengths`), from the static-k modes' requests where the run has any (a
mode that moves the depth per step, such as batch-schedule, reports its bound as k, not the depth
each step verified); its prompt and output lengths from the records; the run's phases with their
class mix. Each class's sample body is the benchmark's own prompt of that
family (`bench.families`, the pool the run drew from); a family the pool does not know gets a
synthetic body built from its gateway class label, and the workload's `source` says which.

From `GET /admin/classes` (`{"object": "list", "data": [ClassReport...]}`, saved to a file): one
class per gateway class, its acceptance the controller's own depth profile (conditional p_d, as
the twin reads it), its prompt length uniform within its label's length bucket, one phase whose
mix is the classes' shares of the requests seen. The gateway keeps no request text, so every body
is synthetic (`bench.twin.label_body`). Where the answer has `depth_trials`, the workload's source
names each class's positions that no verify step tried: their p_d is the controller's prior or a
similar class's, not a measurement.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.replay import RequestRecord
from bench.twin.label_body import synthetic_class
from gateway.control.report import measured_positions

#: The least conditional acceptance a position gets: a measured zero would make the position
#: (and every deeper one) unreachable, which no finite sample shows.
FLOOR = 0.01
#: Requests per phase by default: three phases give a mode the issue's 2,000 requests.
PER_PHASE = 700
DEFAULT_ARRIVALS: list[dict[str, Any]] = [
    {"kind": "closed", "concurrency": c} for c in (1, 4, 16, 64)
]


def _non_increasing(values: Sequence[float]) -> list[float]:
    """Least-squares non-increasing fit (pool adjacent violators, equal weights)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [s / n for s, n in blocks for _ in range(int(n))]


def _geometric(lengths: Mapping[int, float]) -> float:
    """The constant conditional p whose chain best fits the lengths (grid, least squares)."""

    def error(p: float) -> float:
        return sum((sum(p**d for d in range(k + 1)) - length) ** 2 for k, length in lengths.items())

    grid = [FLOOR + (1 - FLOOR) * i / 2000 for i in range(2001)]
    return min(grid, key=error)


def conditional_from_lengths(lengths: Mapping[int, float]) -> list[float]:
    """Conditional acceptance p_1..p_K from the mean acceptance lengths measured at depths k.

    A chain of k drafts emits E[L_k] = 1 + sum_{d<=k} m_d tokens per step, where
    m_d = prod_{j<=d} p_j is position d's marginal rate (vLLM's acceptance_rate_per_pos). With
    every k in 1..K measured, m_d = L_d - L_{d-1} (L_0 = 1), made non-increasing by pool adjacent
    violators (a deeper draft is never accepted more often than a shallower one) and clipped to
    [0, 1]; with gaps, one constant p fitted to the lengths (a geometric profile). Then
    p_1 = m_1 and p_d = m_d / m_{d-1}, each in [FLOOR, 1].
    """
    depths = sorted(k for k in lengths if k >= 1)
    if not depths:
        raise ValueError("no acceptance length measured at any k >= 1")
    top = depths[-1]
    if depths == list(range(1, top + 1)):
        steps = [lengths[k] - (lengths[k - 1] if k > 1 else 1.0) for k in depths]
        marginal = [min(max(m, 0.0), 1.0) for m in _non_increasing(steps)]
    else:
        p = _geometric({k: lengths[k] for k in depths})
        marginal = [p**d for d in range(1, top + 1)]
    out: list[float] = []
    for d, m in enumerate(marginal):
        above = marginal[d - 1] if d else 1.0
        out.append(round(min(max(m / above if above > 0 else FLOOR, FLOOR), 1.0), 4))
    return out


def length_spec(values: Sequence[int]) -> dict[str, Any]:
    """A length distribution for observed lengths: lognormal (median, sigma of the logs, the
    observed range as bounds), or fixed when they are all equal."""
    if min(values) == max(values):
        return {"dist": "fixed", "value": int(values[0])}
    logs = [math.log(max(v, 1)) for v in values]
    return {
        "dist": "lognormal",
        "median": round(float(statistics.median(values)), 1),
        "sigma": round(statistics.pstdev(logs), 3),
        "min": int(min(values)),
        "max": int(max(values)),
    }


def _exact_mix(counts: Mapping[str, float]) -> dict[str, float]:
    """Shares rounded to 6 decimals that sum to 1 exactly (the largest share absorbs the rest)."""
    total = sum(counts.values())
    mix = {c: round(n / total, 6) for c, n in sorted(counts.items()) if n > 0}
    largest = max(mix, key=lambda c: (mix[c], c))
    mix[largest] = round(1.0 - sum(v for c, v in mix.items() if c != largest), 6)
    return mix


def _bucket_lengths(bucket: int) -> dict[str, Any]:
    """Uniform over one length bucket, so every request keeps its class's bucket."""
    return {"dist": "uniform", "low": 16 if bucket <= 64 else bucket // 2 + 1, "high": bucket}


# ---- from a benchmark run ---------------------------------------------------------------------


def _pool_bodies(families: Iterable[str], seed: int) -> dict[str, dict[str, Any]]:
    """The benchmark's own first prompt of each family (`bench.families.load_pool`)."""
    from bench.families import load_pool

    pool, _ = load_pool(per_family=16, seed=seed)
    out: dict[str, dict[str, Any]] = {}
    for family in families:
        prompts = pool.get(family)
        if not prompts:
            continue
        first = prompts[0]
        if first.messages is not None:
            request: dict[str, Any] = {"messages": first.messages}
            if first.tools:
                request["tools"] = first.tools
            endpoint = "chat"
        else:
            request, endpoint = {"prompt": first.prompt or ""}, "completions"
        temperature = float(first.extra.get("temperature", 0.0))
        out[family] = {"endpoint": endpoint, "request": request, "temperature": temperature}
    return out


def _phase_names(meta: Mapping[str, Any], count: int) -> list[str]:
    """Phase names from the run's `meta.json` ("chat x12, tools+templates x12, ..."),
    else phase0, phase1, ..."""
    text = str(meta.get("phases", ""))
    names = [part.rsplit(" x", 1)[0].strip() for part in text.split(",") if part.strip()]
    return names if len(names) == count else [f"phase{p}" for p in range(count)]


@dataclass
class _RunFacts:
    """What a run's records say per family: one record per request index, the accepted
    drafts and verify steps at each k, and the gateway class labels seen."""

    first: dict[int, RequestRecord] = field(default_factory=dict)
    sums: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    labels: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, r: RequestRecord, measures_acceptance: bool) -> None:
        self.first.setdefault(r.index, r)
        if r.gw_class:
            self.labels[r.family][r.gw_class] += 1
        if measures_acceptance and r.k and r.verify_steps > 0:
            acc = self.sums.setdefault(r.family, {}).setdefault(r.k, [0, 0])
            acc[0] += r.accepted_tokens
            acc[1] += r.verify_steps

    def lengths(self, family: str) -> dict[int, float]:
        """Mean acceptance length (bonus token included) at each k the family ran."""
        return {k: 1.0 + a / n for k, (a, n) in sorted(self.sums[family].items())}


def _run_class(facts: _RunFacts, family: str, body: dict[str, Any] | None) -> dict[str, Any]:
    if body is None:
        seen = facts.labels[family].most_common(1)
        body = synthetic_class(seen[0][0] if seen else "chat/len:64")
        body.pop("bucket")
    own = [r for r in facts.first.values() if r.family == family]
    return {
        **body,
        "acceptance": conditional_from_lengths(facts.lengths(family)),
        "prompt_tokens": length_spec([max(r.prompt_tokens, 1) for r in own]),
        "output_tokens": length_spec([max(r.output_tokens, 1) for r in own]),
    }


def _run_source(
    facts: _RunFacts,
    families: Sequence[str],
    bodies: Mapping[str, Any],
    fixed: set[str],
    meta: Mapping[str, Any],
    command: str,
) -> str:
    """The workload's `source`: the command and run, and what each figure was taken from."""
    synthetic = [f for f in families if f not in bodies]
    measured = "; ".join(
        f"{f}: " + ", ".join(f"k={k} {v:.3f}" for k, v in facts.lengths(f).items())
        for f in families
    )
    started = f"the run started {meta['started']}, " if meta.get("started") else ""
    return (
        f"Built by `{command}` ({started}{len(facts.first)} distinct requests). Acceptance: "
        "conditional per position fitted to each family's mean acceptance length at each k "
        + (f"in the {', '.join(sorted(fixed))} modes" if fixed else "it ran")
        + f" ({measured}). Lengths: the records' prompt and output tokens. Bodies: the "
        "benchmark's own first prompt of each family"
        + (f"; SYNTHETIC, from the class label, for {', '.join(synthetic)}" if synthetic else "")
        + "."
        + "".join(
            f" {f} ran as {len(facts.labels[f])} gateway classes "
            f"({', '.join(sorted(facts.labels[f]))}): one class here, the first prompt's body "
            "with the family's pooled acceptance."
            for f in families
            if len(facts.labels[f]) > 1
        )
    )


def from_run(
    path: Path, per_phase: int = PER_PHASE, use_pool: bool = True, command: str | None = None
) -> dict[str, Any]:
    """A workload (as JSON data) from a benchmark run's `runs.jsonl` (module docstring);
    `command`, the one that rebuilds it, is quoted in its source."""
    from bench.report import static_depth
    from bench.runner import load_runs

    runs = load_runs(path)
    fixed = {r.key.mode for r in runs if static_depth(r.key.mode)}
    facts = _RunFacts()
    for run in runs:
        for record in run.records:
            if record.ok:
                facts.add(record, not fixed or run.key.mode in fixed)
    if not facts.first:
        raise ValueError(f"{path}: no successful request records")
    meta_path = path.parent / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    families = sorted({r.family for r in facts.first.values()})
    blind = [f for f in families if f not in facts.sums]
    if blind:
        raise ValueError(f"{path}: no request of {', '.join(blind)} ran with k > 0")
    bodies = _pool_bodies(families, int(meta.get("seed", 1234))) if use_pool else {}
    classes = {f: _run_class(facts, f, bodies.get(f)) for f in families}
    phase_ids = sorted({r.phase for r in facts.first.values()})
    names = _phase_names(meta, len(phase_ids))
    phases = [
        {
            "name": names[i],
            "requests": per_phase,
            "mix": _exact_mix(Counter(r.family for r in facts.first.values() if r.phase == p)),
        }
        for i, p in enumerate(phase_ids)
    ]
    command = command or f"python -m bench.twin.build_workload --from-run {path}"
    source = _run_source(facts, families, bodies, fixed, meta, command)
    return {"classes": classes, "phases": phases, "source": source}


# ---- from /admin/classes ----------------------------------------------------------------------


def from_classes(
    body: Any, requests: int = 3 * PER_PHASE, output_tokens: int = 256
) -> dict[str, Any]:
    """A workload (as JSON data) from `GET /admin/classes`' answer (module docstring)."""
    rows = body.get("data", []) if isinstance(body, Mapping) else list(body)
    rows = [r for r in rows if r.get("samples", 0) > 0 and r.get("class_id") != "other"]
    if not rows:
        raise ValueError("no class with samples in the /admin/classes answer")
    classes: dict[str, Any] = {}
    counts: dict[str, float] = {}
    measured: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: (str(r["label"]), str(r["class_id"]))):
        name = str(row["label"])
        if name in classes:
            name = f"{name}#{str(row['class_id'])[:6]}"
        spec = synthetic_class(str(row["label"]))
        profile = [float(p) for p in row.get("depth_profile") or []]
        if not profile:
            profile = conditional_from_lengths({1: float(row["acceptance_length"])})
        classes[name] = {
            "endpoint": spec["endpoint"],
            "request": spec["request"],
            "temperature": spec["temperature"],
            "acceptance": [round(min(max(p, FLOOR), 1.0), 4) for p in profile],
            "prompt_tokens": _bucket_lengths(spec["bucket"]),
            "output_tokens": {"dist": "fixed", "value": output_tokens},
        }
        counts[name] = float(row["samples"])
        trials = row.get("depth_trials")
        if trials is not None:
            measured[name] = measured_positions(trials)
    source = (
        "Built by bench.twin.build_workload from a gateway's /admin/classes: acceptance per class "
        "is the controller's depth profile (conditional p_d); the mix is each class's share of "
        "the requests it saw; every request body is SYNTHETIC (built from the class label, a "
        "stand-in text for each system prompt); prompt lengths uniform within the label's length "
        f"bucket; output lengths fixed at {output_tokens} (the gateway does not report them)."
        + _unmeasured(measured, classes)
    )
    phase = {"name": "observed", "requests": requests, "mix": _exact_mix(counts)}
    return {"classes": classes, "phases": [phase], "source": source}


def _unmeasured(measured: Mapping[str, int], classes: Mapping[str, Any]) -> str:
    """The source's note on the positions no verify step of a class tried (`depth_trials`
    0): their p_d is the controller's prior or a similar class's, not the class's own."""
    short = [
        f"{name}: none" if depth == 0 else f"{name}: p_1..p_{depth}"
        for name, depth in measured.items()
        if depth < len(classes[name]["acceptance"])
    ]
    if not short:
        return ""
    return (
        " Measured positions (the rest are the controller's prior or a similar class's p_d, "
        f"which no draft of the class tried): {'; '.join(short)}."
    )


def finish(data: dict[str, Any], name: str, poisson: float | None) -> dict[str, Any]:
    """The workload with its name and arrivals, validated by the twin's own schema."""
    from bench.twin.schema import Workload

    arrivals = [*DEFAULT_ARRIVALS]
    if poisson:
        arrivals.append({"kind": "poisson", "rate_per_s": poisson})
    workload = {
        "name": name,
        "source": data["source"],
        "classes": data["classes"],
        "phases": data["phases"],
        "arrivals": arrivals,
    }
    Workload.model_validate(workload)
    return workload


def main(
    out: Annotated[Path, typer.Option(help="Workload JSON to write.")],
    from_run_path: Annotated[
        Path | None, typer.Option("--from-run", help="A benchmark run's runs.jsonl.")
    ] = None,
    from_classes_path: Annotated[
        Path | None, typer.Option("--from-classes", help="A saved /admin/classes answer.")
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Workload name (default: the file stem).")
    ] = None,
    per_phase: Annotated[int, typer.Option(help="Requests per phase (--from-run).")] = PER_PHASE,
    requests: Annotated[int, typer.Option(help="Requests (--from-classes).")] = 3 * PER_PHASE,
    output_tokens: Annotated[
        int, typer.Option(help="Output tokens per request (--from-classes).")
    ] = 256,
    poisson: Annotated[
        float | None, typer.Option(help="Also replay open-loop at this rate (requests/s).")
    ] = None,
) -> None:
    """Write a twin workload built from a real run or from a gateway's /admin/classes."""
    if from_run_path is not None and from_classes_path is None:
        command = " ".join(
            [
                f"python -m bench.twin.build_workload --from-run {from_run_path}",
                *([f"--name {name}"] if name else []),
                *([f"--per-phase {per_phase}"] if per_phase != PER_PHASE else []),
                *([f"--poisson {poisson:g}"] if poisson else []),
                f"--out {out}",
            ]
        )
        data = from_run(from_run_path, per_phase, command=command)
    elif from_classes_path is not None and from_run_path is None:
        data = from_classes(json.loads(from_classes_path.read_text()), requests, output_tokens)
    else:
        raise typer.BadParameter("give exactly one of --from-run and --from-classes")
    workload = finish(data, name or out.stem, poisson)
    out.write_text(json.dumps(workload, indent=2) + "\n")
    typer.echo(f"wrote {out}: {len(workload['classes'])} classes, {len(workload['phases'])} phases")


if __name__ == "__main__":
    typer.run(main)
