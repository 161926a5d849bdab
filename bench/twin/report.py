"""`report.md` of a twin run, rendered from `summary.json` alone.

Per profile: tokens/s by mode and arrival (median over seeds), the ratios the
claims read with their spread over seeds, the oracle's ceiling over the best
static depth, each arrival's worst class against no speculation, how many
requests each class took to settle after each shift, and the checks; then the
validation against the committed real-engine run, where the summary has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.twin.markdown import fmt, table
from bench.twin.metrics import NEAR_SHARE
from bench.twin.modes import (
    ADAPTIVE,
    ADAPTIVE_FLOOR,
    ADAPTIVE_STEP,
    ADAPTIVE_STEP_FREE,
    BASELINES,
    NOSPEC,
    ORACLE,
    UPPER_BOUND,
)
from bench.twin.summary import CLASS_FLOOR, both_met, target_figures, trade_off_modes
from bench.twin.verify_report import lead

INTRO = (
    "Simulation, not a measurement: the engine twin replays each workload in virtual "
    "time on a cost profile (published or measured step costs, cited per profile) and "
    "drives the gateway's real control plane (`gateway.control.plane.ControlPlane`, "
    "calibrated by `gateway.calibration.calibrate` on the twin). Every mode replays the "
    "same requests with the same acceptance draws (common random numbers). Figures are "
    "medians over seeds; `min-max` is their spread. `best static`: the speculative engine "
    "at the best fixed k in hindsight, k = 0 included (no speculation, an engine without "
    "the drafter, has its own row)."
)
UPPER_BOUND_NOTE = (
    "`upper-bound`: a clairvoyant engine that at every step knows each request's actual "
    "acceptance draws and runs the batch at the depth maximising that step's tokens per "
    "second (greedy per step, on the speculative engine's costs): a yardstick no online "
    "controller can reach, not a strict bound."
)
STEP_NOTE = (
    "`adaptive-step`: the gateway with its `step_rule` on (the default, `auto`, where the "
    "engine verifies one depth per step, as vLLM's CUDA engine does): the real control "
    "plane learns each class's acceptance online as in `adaptive`, and each request sends "
    "its class's estimates and the controller's step costs to the engine, whose scheduler "
    "sets each step's depth with `engine.step_rule.vote_step_depth` (the same code runs "
    "here), with the guard that no request's tokens per unit time fall below the same "
    "step at depth 0; `adaptive-step-free`: the same rule without the guard. No "
    "hindsight. Their settling figure is each class's own vote (the depth the rule gives "
    "the class alone at its load)."
)
NEAR_NOTE = (
    "Settling is counted on the depth each class chose at the request's load (what the "
    "batch rules held it below or let it ride above, and what a probe replaced, follow "
    "its batch-mates request by request, not the class's learning), two ways after each "
    'phase start or shift: until it stays at its final one ("settle", 90 % of the '
    'class\'s requests from then on), and until it stays near-best ("until near-best": '
    "90 % of its requests at a depth whose steady goodput E[tokens | k] / step cost(k, "
    "load), on the request's true acceptance and the profile's median costs, is within "
    f"the controller's hysteresis ({NEAR_SHARE:.0%}) of the class's best: the least gain "
    "for which it leaves a depth). Where a class's best depths lie that close, the "
    "controller moves between them on its estimates' noise, which the first counts as "
    "unsettled and the second does not."
)


def _ratio(cell: Mapping[str, Any], name: str) -> str:
    s = cell["ratios"].get(name)
    if s is None:
        return "-"
    if s["min"] == s["max"]:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"


def _throughput(arrivals: Mapping[str, Any]) -> list[str]:
    labels = list(arrivals)
    modes = list(next(iter(arrivals.values()))["tokens_per_s"]) if arrivals else []
    first = next(iter(arrivals.values()))["seeds"] if arrivals else {}
    order = list(next(iter(first.values()))) if first else modes
    rows = [
        [m, *(fmt(arrivals[a]["tokens_per_s"].get(m, {}).get("median"), 1) for a in labels)]
        for m in order
    ]
    return table(["mode", *(f"{a} tokens/s" for a in labels)], rows)


RATIO_ROWS = (
    (f"{ADAPTIVE}/best-static", "adaptive / best static"),
    (f"{ADAPTIVE_FLOOR}/best-static", "adaptive-floor / best static"),
    (f"{ADAPTIVE}/{ORACLE}", "adaptive / oracle"),
    (f"{ADAPTIVE}/{NOSPEC}", "adaptive / no spec"),
    (f"{ORACLE}/best-static", "oracle ceiling (oracle / best static)"),
    (f"{UPPER_BOUND}/best-static", "upper-bound / best static"),
    *((f"{ADAPTIVE}/{b}", f"adaptive / {b}") for b in BASELINES),
    (f"worst-class:{ADAPTIVE}", "adaptive: worst class / no spec"),
    (f"worst-class:{ADAPTIVE_FLOOR}", "adaptive-floor: worst class / no spec"),
    *(
        row
        for step in (ADAPTIVE_STEP, ADAPTIVE_STEP_FREE)
        for row in (
            (f"{step}/best-static", f"{step} / best static"),
            (f"{step}/{ADAPTIVE}", f"{step} / adaptive"),
            (f"{step}/{ORACLE}", f"{step} / oracle"),
            *((f"{step}/{b}", f"{step} / {b}") for b in BASELINES),
            (f"worst-class:{step}", f"{step}: worst class / no spec"),
        )
    ),
)


def _ratios(arrivals: Mapping[str, Any]) -> list[str]:
    labels = list(arrivals)
    rows = [[title, *(_ratio(arrivals[a], name) for a in labels)] for name, title in RATIO_ROWS]
    best = [
        "best static (first seed)",
        *(next(iter(arrivals[a]["best_static"].values()), "-") for a in labels),
    ]
    worst = [
        "adaptive's worst class (first seed)",
        *(_first_seed(arrivals[a]["worst_class"]).get(ADAPTIVE, "-") for a in labels),
    ]
    return table(["ratio", *labels], [*rows, best, worst])


TRADE_OFF_NOTE = (
    "The two targets together: each mode's tokens/s over the best static depth · its worst "
    "class's speed over that class's with no speculation (medians over seeds). A class "
    "shares its batch's step time, so a class that gains less from drafting than the step "
    "costs loses to no speculation at any depth its batch-mates gain from; where no row "
    "reaches both (>= 1.00 · >= {floor:.2f}), the targets conflict in that cell for every "
    "policy here, the clairvoyant one included."
)


def _trade_off(arrivals: Mapping[str, Any]) -> list[str]:
    labels = list(arrivals)
    modes = trade_off_modes(name for a in labels for name in arrivals[a]["ratios"])
    rows: list[list[str]] = []
    met: dict[str, list[str]] = {a: [] for a in labels}
    for mode in modes:
        row = [mode]
        for a in labels:
            ratios = arrivals[a]["ratios"]
            best, worst = target_figures(ratios, mode)
            row.append("-" if best is None else f"{fmt(best)} · {fmt(worst, 2)}")
            if both_met(best, worst):
                met[a].append(mode)
        rows.append(row)
    both = ["both met by", *(", ".join(met[a]) or "none" for a in labels)]
    return [
        TRADE_OFF_NOTE.format(floor=CLASS_FLOOR),
        "",
        *table(["mode", *labels], [*rows, both]),
    ]


def _first_seed(by_seed: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(iter(by_seed.values()), {})


def _settle(arrivals: Mapping[str, Any], mode: str = ADAPTIVE, key: str = "settle") -> list[str]:
    """Requests each class took to settle after each phase start or shift (`mode`,
    first seed; its slowest batch bucket), per arrival. A per-step mode's figure is
    its class's own vote (the depth the rule gives the class alone). `key`
    "near_settle": until its depths stayed near-best (`bench.twin.metrics`)."""
    labels = list(arrivals)
    counts: dict[str, dict[str, str]] = {}
    marked = False
    for label in labels:
        stretches = _first_seed(arrivals[label].get(key, {})).get(mode, [])
        for stretch in stretches:
            if stretch["start"] == 0:
                continue
            idle = stretch.get("undrafted", ())
            for cls, n in stretch["classes"].items():
                mark = "*" if cls in idle else ""
                marked = marked or bool(mark)
                counts.setdefault(f"{stretch['stretch']} / {cls}", {})[label] = f"{n}{mark}"
    rows = [[key, *(v.get(a, "-") for a in labels)] for key, v in counts.items()]
    what = "to settle" if key == "settle" else "until near-best"
    out = table([f"{mode}: requests {what} (first seed)", *labels], rows)
    if marked:
        out += ["", UNDRAFTED_NOTE]
    return out


UNDRAFTED_NOTE = (
    "\\* None of the class's requests off its best depth there ran a draft (their batch held "
    "them at k = 0, or the class chose 0): nothing there could move its estimate, so its "
    "choice rests on what it learnt before the stretch, or on its prior."
)


def _checks(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = [
        [
            c["claim"],
            fmt(c["value"]) if isinstance(c["value"], float) else str(c["value"]),
            c["target"],
            "pass" if c["pass"] else "FAIL",
        ]
        for c in checks
    ]
    return table(
        [
            "claim (ratios: median over seeds; settling: the slowest seed)",
            "value",
            "target",
            "result",
        ],
        rows,
    )


def _profile(name: str, p: Mapping[str, Any]) -> list[str]:
    arrivals = p["arrivals"]
    lines = [
        f"## {name} (workload `{p['workload']}`, K = {p['max_k']}, "
        f"{p['requests_per_run']} requests per run)",
        "",
        f"Costs: {p['profile_source']}",
        "",
        f"Acceptance: {p['workload_source']}",
        "",
        *_throughput(arrivals),
        "",
        *_ratios(arrivals),
        "",
        *_trade_off(arrivals),
        "",
        *_settle(arrivals),
        "",
        *_settle(arrivals, ADAPTIVE_STEP),
        "",
        *_settle(arrivals, ADAPTIVE, "near_settle"),
        "",
        *_settle(arrivals, ADAPTIVE_STEP, "near_settle"),
        "",
        *_checks(p["checks"]),
        "",
    ]
    return lines


def _validation(v: Mapping[str, Any]) -> list[str]:
    rows = [
        [
            r["arrival"],
            r["mode"],
            fmt(r["real"]),
            fmt(r["twin"]),
            fmt(r["difference"], 2),
            "yes" if abs(r["difference"]) > v["tolerance"] else "",
        ]
        for r in v["rows"]
    ]
    agreement = [
        [a, fmt(x["kendall_tau"], 2), x["real_best"], x["twin_best"]]
        for a, x in v["ranking"].items()
    ]
    return [
        "## Validation against the real engine",
        "",
        v["what"],
        "",
        *table(
            [
                "arrival",
                "mode",
                "real / no spec",
                "twin / no spec",
                "twin - real (share)",
                f"> {v['tolerance']:.0%}",
            ],
            rows,
        ),
        "",
        *table(["arrival", "Kendall tau", "real best mode", "twin best mode"], agreement),
        "",
        *_verify_validation(v.get("budget")),
    ]


def _interval(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return "-"
    low, high = cell["ci95"]
    return f"{fmt(cell['ratio'])} ({fmt(low)}-{fmt(high)})"


def _verify_validation(v: Mapping[str, Any] | None) -> list[str]:
    """The gateway-steered verify budget against the real engine's (`validation.compare_budget`)."""
    if v is None:
        return []
    rows = [
        [
            r["arrival"],
            fmt(r["twin_vs_best_static"]),
            _interval(r["real_vs_best_static"]),
            fmt(r["twin_vs_per_class"]),
            _interval(r["real_vs_per_class"]),
        ]
        for r in v["rows"]
    ]
    header = [
        "arrival",
        "twin / best static",
        "real / best static (95 %)",
        "twin / per-class (oracle)",
        "real / per-class (95 %)",
    ]
    return [v["what"], f"Real-engine figures: {v['source']}.", "", *table(header, rows), ""]


def _spread(summary: Mapping[str, Any]) -> list[str]:
    """adaptive / best static, adaptive / oracle and adaptive-step / best static over seeds,
    every profile and arrival."""
    rows = []
    for name, profile in summary["profiles"].items():
        for label, cell in profile["arrivals"].items():
            row = [name, label]
            for ratio in (
                f"{ADAPTIVE}/best-static",
                f"{ADAPTIVE}/{ORACLE}",
                f"{ADAPTIVE_STEP}/best-static",
            ):
                s = cell["ratios"].get(ratio)
                row += ["-"] * 3 if s is None else [fmt(s["min"]), fmt(s["median"]), fmt(s["max"])]
            rows.append(row)
    seeds = ", ".join(str(s) for s in summary["meta"]["seeds"])
    header = [
        "profile",
        "arrival",
        *(f"adaptive / best static {q}" for q in ("min", "median", "max")),
    ]
    header += [f"adaptive / oracle {q}" for q in ("min", "median", "max")]
    header += [f"{ADAPTIVE_STEP} / best static {q}" for q in ("min", "median", "max")]
    return [f"## Spread over seeds ({seeds})", "", *table(header, rows), ""]


def _run(info: Mapping[str, Any]) -> list[str]:
    return [
        "## Size and time",
        "",
        f"{info['runs']} runs of {info['requests']} requests in all ({info['per_run']}); "
        f"simulated in {info['simulation_cpu_s']} s of CPU time on one core, "
        f"{info['simulation_wall_s']} s of wall time ({info['total_wall_s']} s with the "
        "summary, report and plots; wall above CPU = other work shared the cores).",
        "",
    ]


def render(summary: Mapping[str, Any], run_info: Mapping[str, Any] | None = None) -> str:
    lines = [
        "# Engine twin report",
        "",
        INTRO,
        "",
        *lead(summary),
        UPPER_BOUND_NOTE,
        "",
        STEP_NOTE,
        "",
        NEAR_NOTE,
        "",
    ]
    noise = summary["meta"].get("step_noise", 0.0)
    lines += [
        f"Step-time noise: each step's time is its profile's median times a lognormal jitter "
        f"of sigma {noise:g} (seeded; every mode meets the same jitter at its i-th step)."
        if noise
        else "Step-time noise: none (every step takes its profile's median time).",
        "",
    ]
    drift = summary["meta"].get("host_drift", 0.0)
    if drift:
        lines += [
            f"Host drift: the host's speed wanders with a log-spread of {drift:g}, "
            "correlated over about 10,000 steps (`StepCosts.with_noise`).",
            "",
        ]
    for name, profile in summary["profiles"].items():
        lines += _profile(name, profile)
    lines += _spread(summary)
    if "validation" in summary:
        lines += _validation(summary["validation"])
    if run_info is not None:
        lines += _run(run_info)
    return "\n".join(lines)
