"""The speculation floor per request: engines resident, each burst run on every variant.

    python -m bench.floor_interleaved [--bursts 80 48 32] [--concurrency 1 4 16] [--depths 0 4]
        [--variant LABEL=JSON ...] [--profile]

Every engine is started once and held, one serving at a time: A (no drafter), the
speculative engine (EAGLE 3.1, K = --max-depth) and one per `--variant` (extra engine
arguments, for the A/B of one engine change). The unit is a burst at concurrency c: c - 1
requests start together and, once each has a token, one joins the batch they decode in
(at c = 1 one request alone). Each burst runs on every variant back to back, in a seeded
random order with an idle gap before each: A, A again (A', the A/A null: the method's own
resolution), and each engine at each depth in --depths. Each request's TTFT and TPOT
(vLLM's per-request figures) and the burst's engine CPU per output token are set against
the same request of A's run of that burst, seconds apart, so the host's slower drift
cancels. Printed per concurrency and variant, then per prompt family: the median ratio
over requests and its 95 % interval from a bootstrap over whole bursts (a burst's requests
share a batch). Targets: k = 0 within 1.03x on TTFT and TPOT, k > 0 TTFT within 1.2x.

`--profile` loads `bench.floor_timers` into every engine and also prints each variant's
milliseconds per step in each component, per phase (the timers cost a little of every
step: read that run's ratios as context only). Written: the results (--out, raw bursts and
timer totals included) and a PNG of the k = 0 rows; `--summarise-only FILE` prints the
tables again, `--plot-only FILE...` redraws the PNG. The manual: `bench/README.md`. A
benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from bench.engines import add_model_options, cpu_seconds, family_prompts, models, one_request
from bench.floor_summary import (
    BASE,
    METRICS,
    NULL,
    PHASES,
    PROFILED,
    BurstRun,
    Case,
    Plan,
    Totals,
    by_family,
    cell,
    family_table,
    plot,
    summarise,
    table,
    timer_table,
)
from bench.floor_versus import digest, identity, versus, versus_table
from bench.gateway_proc import descendants

#: The resident speculative engine without extra arguments.
SPEC = "speculative"


def burst_plans(conc: int, bursts: int, max_tokens: int, seed: int) -> list[Plan]:
    """`bursts` bursts of `conc` requests over the bench's family prompts (long context
    included), reply lengths drawn in [max_tokens / 2, 3 max_tokens / 2] (seeded)."""
    pool = family_prompts(conc * bursts)
    # The pool is finite: past its end prompts repeat (each request's unique first block
    # still keeps it from the prefix cache).
    labelled = [pool[i % len(pool)] for i in range(conc * bursts)]
    rng = random.Random(seed)
    plans = []
    for b in range(bursts):
        chunk = labelled[b * conc : (b + 1) * conc]
        lengths = tuple(rng.randint(max_tokens // 2, 3 * max_tokens // 2) for _ in chunk)
        plans.append(Plan(tuple(t for _, t in chunk), lengths, tuple(f for f, _ in chunk)))
    return plans


async def run_burst(
    engine: Any, pids: set[int], plan: Plan, k: int, salt: str | None = None
) -> BurstRun:
    """The plan's starters together, then its joiner once each starter has a token. Each
    request carries its family as its class (`SPEC_CLASS_ARG`). With `salt`, every
    request's unique first block is `salt` and its index (the same prompt on every
    engine) and its output tokens are kept as a digest."""
    from engine.interface import SPEC_CLASS_ARG

    starters = len(plan.texts) - 1
    firsts = [asyncio.Event() for _ in range(starters)]
    outputs: list[list[int]] = [[] for _ in plan.texts]

    def request(i: int, first: asyncio.Event | None) -> Any:
        family = plan.families[i] if plan.families else None
        return one_request(
            engine,
            plan.texts[i],
            k,
            plan.lengths[i],
            first=first,
            salt=None if salt is None else f"{salt}-{i}",
            extra={SPEC_CLASS_ARG: family} if family else None,
            tokens=outputs[i],
        )

    cpu0 = cpu_seconds(pids)
    tasks = [asyncio.create_task(request(i, firsts[i])) for i in range(starters)]
    for event in firsts:
        await event.wait()
    joiner = asyncio.create_task(request(starters, None))
    outcomes = await asyncio.gather(*tasks, joiner)
    cpu = cpu_seconds(pids) - cpu0
    tokens = sum(o.output_tokens for o in outcomes)
    run = BurstRun()
    for i, o in enumerate(outcomes):
        joined = i == starters
        run.ttft_start.append(None if joined else o.ttft_s)
        run.ttft_join.append(o.ttft_s if joined else None)
        run.tpot.append(o.tpot_s)
        run.digests.append(digest(outputs[i]) if salt is not None else "")
    run.cpu_per_token.append(cpu / max(tokens, 1))
    return run


def turn_order(seed: int, names: Sequence[str]) -> list[str]:
    """A seeded random order per burst: every variant equally likely at every place (a
    fixed or mirrored order would leave a place effect, the run after a change of engine
    or concurrency, on the same variants every time)."""
    order = list(names)
    random.Random(seed).shuffle(order)
    return order


def variants(
    depths: Sequence[int],
    null: bool,
    labels: Sequence[str] = (),
    variant_depths: Sequence[int] | None = None,
) -> dict[str, tuple[str, int]]:
    """Each variant's name -> (the engine that runs it, its depth k); the `--variant`
    engines at `variant_depths` (None: at `depths`)."""
    names = {BASE: (BASE, 0), **({NULL: (BASE, 0)} if null else {})}
    names.update({f"k = {d}": (SPEC, d) for d in depths})
    extra = depths if variant_depths is None else variant_depths
    names.update({f"{label} k = {d}": (label, d) for label in labels for d in extra})
    return names


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """`LABEL=JSON` -> (label, extra engine arguments)."""
    label, sep, raw = text.partition("=")
    try:
        extra = json.loads(raw) if sep else None
    except json.JSONDecodeError as exc:
        message = f"{text!r}: the part after '=' is not JSON ({exc})"
        raise argparse.ArgumentTypeError(message) from exc
    if not label.strip() or not isinstance(extra, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL={{JSON object}}")
    if label in (BASE, NULL, SPEC):
        raise argparse.ArgumentTypeError(f"{text!r}: {label!r} names a built-in engine")
    return label.strip(), extra


def engine_extras(args: argparse.Namespace) -> dict[str, tuple[bool, dict[str, Any]]]:
    """Each resident engine -> (with the drafter, its extra engine arguments)."""
    timed = dict(PROFILED) if args.profile else {}
    engines = {BASE: (False, timed), SPEC: (True, timed)}
    engines.update({label: (True, {**timed, **extra}) for label, extra in args.variant})
    return engines


def print_now(line: str) -> None:
    print(line, flush=True)


async def install_timers(engine: Any) -> None:
    """Wrap the runner's methods in every worker of a profiled engine (`bench.floor_timers`)."""
    await engine._llm.collective_rpc("specgw_floor_install")


async def take_timers(engine: Any) -> list[Totals]:
    """The engine core's and each worker's totals since the last take, then cleared."""
    llm = engine._llm  # the bench reads the engine core's utility, not part of the seam
    core: Totals = await llm.engine_core.call_utility_async("specgw_floor_profile")
    workers: list[Totals] = await llm.collective_rpc("specgw_floor_take")
    return [core, *workers]


@contextlib.asynccontextmanager
async def resident_engines(
    args: argparse.Namespace, log: Callable[[str], None]
) -> AsyncIterator[tuple[dict[str, Any], dict[str, set[int]], str]]:
    """Every engine of `engine_extras` started and held, one after the other; each
    engine's process ids, and the model's description."""
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    target, drafter, described = models(args)
    log(f"model: {described}")
    async with contextlib.AsyncExitStack() as stack:
        engines: dict[str, Any] = {}
        pids: dict[str, set[int]] = {}
        for name, (speculative, extra) in engine_extras(args).items():
            before = set(descendants(os.getpid()))
            settings = EngineSettings(
                model=target,
                drafter=drafter if speculative else None,
                max_depth=args.max_depth,
                warmup_prompts=4,
                extra_args=extra,
            )
            engines[name] = await stack.enter_async_context(VLLMEngine.started(settings))
            pids[name] = set(descendants(os.getpid())) - before
            if args.profile:
                await install_timers(engines[name])
                await take_timers(engines[name])  # drop what the warm-up left
            log(f"{name}: engine processes {sorted(pids[name])}")
        yield engines, pids, described


async def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    names = variants(
        args.depths, args.null, [label for label, _ in args.variant], args.variant_depths
    )
    bursts = dict(zip(args.concurrency, args.bursts, strict=True))
    runs: dict[tuple[int, str], list[BurstRun]] = {
        (c, n): [] for c in args.concurrency for n in names
    }
    cases = {key: Case(key[1]) for key in runs}
    all_plans = {c: burst_plans(c, bursts[c], args.max_tokens, seed=c) for c in args.concurrency}
    async with resident_engines(args, log) as (engines, pids, described):
        started = time.perf_counter()
        for i, conc in enumerate(args.concurrency):
            if i:  # a run that dies later keeps what it has measured
                checkpoint(args, {c: bursts[c] for c in args.concurrency[:i]}, runs, described)
            plans = all_plans[conc]
            for b, plan in enumerate(plans):
                for name in turn_order(1000 * conc + b, list(names)):
                    which, k = names[name]
                    # vLLM's workers spin on their queue for a second after their last read
                    # (`shm_broadcast`): let the engine that ran last fall asleep first.
                    await asyncio.sleep(args.gap)
                    salt = f"{conc}-{b}" if args.compare_outputs else None
                    burst = await run_burst(engines[which], pids[which], plan, k, salt)
                    runs[(conc, name)].append(burst)
                    if salt is not None:  # the next engine's run of this prompt starts cold
                        await engines[which]._llm.reset_prefix_cache()
                    if args.profile:  # read after the burst, outside its timing
                        cases[(conc, name)].absorb(await take_timers(engines[which]))
                if (b + 1) % max(1, len(plans) // 4) == 0 or b + 1 == len(plans):
                    so_far = summarise(
                        {key: v for key, v in runs.items() if key[0] == conc}, [conc], list(names)
                    )
                    brief = "; ".join(f"{r['variant']} TPOT {cell(r, 'tpot')}" for r in so_far)
                    log(
                        f"c{conc} [{b + 1}/{len(plans)}] "
                        f"{time.perf_counter() - started:.0f} s: {brief}"
                    )
    profile = {f"c{c} {n}": case.totals for (c, n), case in cases.items() if case.totals}
    rows, families, against = report(runs, all_plans, list(names), log, profile, args.versus)
    raw = _raw(runs, args.concurrency)
    return {
        "command": " ".join(sys.argv),
        "model": described,
        "rows": rows,
        "families": families,
        **against,
        "bursts": raw,
        **({"profile": profile} if profile else {}),
    }


def _raw(
    runs: dict[tuple[int, str], list[BurstRun]], concurrency: Sequence[int]
) -> dict[str, list[dict[str, Any]]]:
    """The burst runs of these concurrencies as a results file keeps them."""
    return {
        f"c{c} {n}": [{m: getattr(r, m) for m in (*METRICS, "digests")} for r in burst_runs]
        for (c, n), burst_runs in runs.items()
        if c in concurrency
    }


def checkpoint(
    args: argparse.Namespace,
    done: dict[int, int],
    runs: dict[tuple[int, str], list[BurstRun]],
    described: str,
) -> None:
    """The concurrencies finished so far (`done`: their burst counts) as a results file
    beside `--out` (`.partial.json`) that `--summarise-only` reads."""
    part = {**_jsonable(vars(args)), "concurrency": list(done), "bursts": list(done.values())}
    body = {"command": " ".join(sys.argv), "model": described, "bursts": _raw(runs, list(done))}
    path = args.out.with_suffix(".partial.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**body, "args": part}, indent=1) + "\n")


def report(
    runs: dict[tuple[int, str], list[BurstRun]],
    plans: dict[int, list[Plan]],
    names: Sequence[str],
    log: Callable[[str], None],
    profile: dict[str, Totals] | None = None,
    against: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """The summary rows and the family rows, both tables logged; with `against`, those
    variants against the static depths and the outputs' identity (`bench.floor_versus`);
    with timer totals, the attribution table per concurrency and phase."""
    rows = summarise(runs, list(plans), names)
    families = by_family(runs, plans, names)
    for line in [*table(rows), "", *family_table(families)]:
        log(line)
    extra: dict[str, Any] = {}
    if against:
        extra["versus"] = [row for label in against for row in versus(runs, plans, names, label)]
        extra["identity"] = identity(runs, list(plans), names)
        for line in ["", *versus_table(extra["versus"], extra["identity"])]:
            log(line)
    for conc in plans if profile else ():
        cases = [Case(n, (profile or {}).get(f"c{conc} {n}", {})) for n in names]
        for phase in PHASES:
            log(f"\nconcurrency {conc}, {phase} steps")
            log(timer_table(cases, phase))
    return rows, families, extra


def from_results(
    path: Path,
) -> tuple[dict[tuple[int, str], list[BurstRun]], dict[int, list[Plan]], list[str], dict[str, Any]]:
    """A results file's burst runs, with the plans its arguments rebuild (the same seeds),
    the variants' names and the timer totals (empty where not profiled)."""
    body = json.loads(path.read_text())
    args = body["args"]
    labels = [parse_variant(v)[0] for v in args.get("variant") or []]
    names = list(variants(args["depths"], args["null"], labels, args.get("variant_depths")))
    # `main` writes one burst count per concurrency (a single count already expanded).
    plans = {
        c: burst_plans(c, n, args["max_tokens"], seed=c)
        for c, n in zip(args["concurrency"], args["bursts"], strict=True)
    }
    runs = {
        (c, n): [BurstRun(**burst) for burst in body["bursts"][f"c{c} {n}"]]
        for c in plans
        for n in names
    }
    return runs, plans, names, body.get("profile", {})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument(
        "--bursts", type=int, nargs="+", default=[80, 48, 32], help="per concurrency"
    )
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--no-null", dest="null", action="store_false", help="skip A'")
    parser.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=[],
        metavar="LABEL=JSON",
        help="one more speculative engine with these extra engine arguments (repeatable)",
    )
    parser.add_argument(
        "--variant-depths",
        type=int,
        nargs="+",
        help="the depths the --variant engines run at (default: --depths)",
    )
    parser.add_argument(
        "--versus",
        action="append",
        default=[],
        metavar="VARIANT",
        help="print this variant (e.g. 'budget k = 4') against the best static depth and "
        "per-class depths of the same bursts (bench.floor_versus; repeatable)",
    )
    parser.add_argument(
        "--compare-outputs",
        action="store_true",
        help="the same prompts on every engine (prefix cache reset after each burst) and "
        "each output compared with k = 0's",
    )
    parser.add_argument(
        "--profile", action="store_true", help="load the per-component step timers too"
    )
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--gap", type=float, default=1.2, help="idle seconds before a burst")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("bench/results/floor_interleaved.json"))
    add_model_options(parser)
    parser.add_argument(
        "--summarise-only",
        type=Path,
        help="print the tables (prompt families included) from a results file; run nothing",
    )
    parser.add_argument(
        "--plot-only",
        type=Path,
        nargs="+",
        help="draw the PNG (--out with .png) from these results files; run nothing",
    )
    args = parser.parse_args()
    if args.summarise_only:
        runs, plans, names, profile = from_results(args.summarise_only)
        report(runs, plans, names, print_now, profile, args.versus)
        return
    if args.plot_only:
        rows = [row for f in args.plot_only for row in json.loads(f.read_text())["rows"]]
        print(f"wrote {plot(rows, args.out.with_suffix('.png'))}")
        return
    if len(args.bursts) == 1:
        args.bursts = args.bursts * len(args.concurrency)
    if len(args.bursts) != len(args.concurrency):
        parser.error("--bursts: one count, or one per --concurrency")
    body = asyncio.run(run(args, print_now))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    body["args"] = _jsonable(vars(args))
    args.out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {args.out} and {plot(body['rows'], args.out.with_suffix('.png'))}")


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """The arguments as a results file keeps them: paths as text, each variant as the
    `LABEL=JSON` it was given."""
    out = {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}
    out["variant"] = [f"{label}={json.dumps(extra)}" for label, extra in values["variant"]]
    return out


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
