"""What `make gpu-smoke` recorded, and the verdict on it: pure functions, no engine.

A smoke run is a list of `RunResult`s, one per pass of the request families through
one of two engines: the speculative one (target + drafter) and one started without a
drafter. `failures` turns them into one line per failure; `report` into the tables
an operator reads. Everything here is tested on recorded results
(`tests/bench/test_gpu_smoke.py`).

Why greedy text must match at concurrency 1 only (at any concurrency in vLLM's
batch-invariant mode): speculative decoding is lossless, the target verifies every
token, but in bf16 a row's logits depend on the step it is computed in (how many
rows the GEMMs split, which graph or attention kernel runs), so two greedy runs whose
steps differ can flip a near-tie and go their own ways from there. Two requests in
flight make every step of one run differ from the other's; at concurrency 1 only the
verify width is left (1 + K rows against 1), a rare source of flips; with
`VLLM_BATCH_INVARIANT=1` a row's result does not depend on the rest of its step, so a
difference there is a bug.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.gpu_smoke_facts import NO_GRAPH_COUNTS, PLAN_LINES

SPECULATIVE = "speculative"
NO_DRAFTER = "no-drafter"
ENGINES = (SPECULATIVE, NO_DRAFTER)

#: What a pass is for: throughput and acceptance (`families`), greedy identity only
#: (`greedy`, the greedy prompts at concurrency 1), or the tool-calling check (`tools`).
RunKind = Literal["families", "greedy", "tools"]
#: How many tool requests must come back as tool calls: `every` (a real model),
#: `any` (the embedded 3.4 M-parameter model calls a tool on some of its own
#: prompts), `none` (random weights or the fake backend: nothing to expect).
ToolExpectation = Literal["every", "any", "none"]

#: Text by which a model's tool call shows through a parser that did not take it:
#: Hermes / Qwen, Llama 3.x (`<|python_tag|>` and its JSON object), Mistral, Llama 4.
CALL_MARKERS = ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "<function=")
_CALL_JSON = re.compile(r'\{\s*"name"\s*:\s*"[^"]+"\s*,\s*"(?:arguments|parameters)"\s*:')


@dataclass(frozen=True, slots=True)
class Run:
    """One pass of requests through one engine, with the flags it runs under."""

    name: str
    engine: str
    concurrency: int
    flags: dict[str, Any] = field(default_factory=dict)
    kind: RunKind = "families"

    @property
    def label(self) -> str:
        return f"{self.name} c{self.concurrency}"


@dataclass(slots=True)
class SmokeRecord:
    """One request of one run: what it returned and how it ended."""

    run: str
    index: int
    family: str
    greedy: bool
    content: str = ""
    #: (name, arguments) of each tool call, as the parser returned them.
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    finish_reason: str | None = None
    output_tokens: int = 0
    gw_class: str | None = None
    k: int | None = None
    acceptance_length: float | None = None
    error: str | None = None
    #: The tool-calling check: the tools offered, and whether the answer streamed.
    offered: tuple[str, ...] = ()
    streamed: bool = True

    @property
    def text(self) -> str:
        """Everything the model wrote: content, then each call's name and arguments."""
        return self.content + "".join(name + args for name, args in self.tool_calls)


@dataclass(slots=True)
class RunResult:
    """A run's records and wall time, and the engine's step counts over it (deltas of
    `/metrics`): by CUDA-graph mode (None: the gateway exports none) and by depth."""

    run: Run
    wall_s: float
    records: list[SmokeRecord] = field(default_factory=list)
    graph_steps: dict[str, float] | None = None
    step_depths: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(r.output_tokens for r in self.records)
        return tokens / self.wall_s if self.wall_s > 0 else 0.0


def smoke_runs(max_depth: int, concurrency: int) -> list[Run]:
    """Every run, speculative engine first: adaptive, static k = K and the kill switch
    (every request at k = 0) at `concurrency`; static K again at concurrency 1 for the
    greedy check; the same two passes without a drafter; a tool check on each."""
    static = {"controller-mode": "static", "pin-k": max_depth}
    runs = [
        Run("adaptive", SPECULATIVE, concurrency, {"controller-mode": "adaptive", "pin-k": -1}),
        Run(f"static-k{max_depth}", SPECULATIVE, concurrency, static),
        Run("k0", SPECULATIVE, concurrency, {"speculation-enabled": False}),
    ]
    if concurrency > 1:
        runs.append(Run(f"static-k{max_depth}", SPECULATIVE, 1, static, "greedy"))
    runs += [
        Run("tools", SPECULATIVE, 1, static, "tools"),
        Run(NO_DRAFTER, NO_DRAFTER, concurrency),
    ]
    if concurrency > 1:
        runs.append(Run(NO_DRAFTER, NO_DRAFTER, 1, kind="greedy"))
    runs.append(Run("tools", NO_DRAFTER, 1, kind="tools"))
    return runs


# ---- the verdict -----------------------------------------------------------------------


def failures(
    results: list[RunResult], tools: ToolExpectation, batch_invariant: bool = False
) -> list[str]:
    """One line per failure: an error, a stream without a finish reason, greedy text
    that differs from the no-drafter engine's (at concurrency 1; at any concurrency
    in batch-invariant mode), a tool call that did not come back as one."""
    found = [
        f"{result.run.engine} {result.run.label} #{r.index} {r.family}: "
        f"{r.error or 'stream ended without a finish reason'}"
        for result in results
        for r in result.records
        if r.error or not r.finish_reason
    ]
    for spec, plain in greedy_pairs(results):
        if batch_invariant:
            found += differences(spec, plain)
        elif spec.run.concurrency == 1:
            hint = " (a rerun with --batch-invariant tells numerics from a bug)"
            found += [line + hint for line in differences(spec, plain)]
    for result in results:
        if result.run.kind == "tools":
            found += tool_failures(result, tools)
    return found


def notes(results: list[RunResult], batch_invariant: bool = False) -> list[str]:
    """Greedy differences at concurrency > 1 outside batch-invariant mode: reported,
    not failed (bf16 batch-shape numerics, the module docstring)."""
    if batch_invariant:
        return []
    return [
        f"{line} (batch shape, not a failure: rerun with --batch-invariant to check it)"
        for spec, plain in greedy_pairs(results)
        if spec.run.concurrency > 1
        for line in differences(spec, plain)
    ]


def greedy_pairs(results: list[RunResult]) -> list[tuple[RunResult, RunResult]]:
    """(static k = K, no drafter) at each concurrency both engines ran."""
    static = {
        r.run.concurrency: r
        for r in results
        if r.run.engine == SPECULATIVE and r.run.name.startswith("static-k")
    }
    plain = {
        r.run.concurrency: r
        for r in results
        if r.run.engine == NO_DRAFTER and r.run.kind != "tools"
    }
    return [(static[c], plain[c]) for c in sorted(static) if c in plain]


def differences(spec: RunResult, plain: RunResult) -> list[str]:
    """Greedy requests whose text or token count differ between the two runs."""
    by_index = {r.index: r for r in plain.records}
    found = []
    for r in spec.records:
        other = by_index.get(r.index)
        if other is None or not r.greedy or r.error or other.error:
            continue
        if r.text == other.text and r.output_tokens == other.output_tokens:
            continue
        at = first_divergence(r.text, other.text)
        line = (
            f"greedy output of #{r.index} {r.family} differs at character {at} between "
            f"{spec.run.engine} {spec.run.label} and {plain.run.engine} {plain.run.label}: "
            f"{r.text[at : at + 24]!r} against {other.text[at : at + 24]!r}"
        )
        if r.text == other.text:  # same text, another tokenisation of it
            line += f" ({r.output_tokens} against {other.output_tokens} tokens)"
        found.append(line)
    return found


def first_divergence(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def looks_like_call(text: str) -> bool:
    """Whether plain text carries a tool call a parser should have taken."""
    return any(m in text for m in CALL_MARKERS) or _CALL_JSON.search(text) is not None


def tool_failures(result: RunResult, expect: ToolExpectation) -> list[str]:
    """Requests with tools and `tool_choice=auto` that did not come back as tool calls.

    `every`: each request a call, to an offered tool, with a JSON object for arguments,
    ending `tool_calls`. `any`: one such call at least (a 3.4 M-parameter model also
    writes broken JSON, which a streamed parser passes on as it comes)."""
    if expect == "none":
        return []
    where = f"{result.run.engine} tools"
    answered = [r for r in result.records if not r.error and r.finish_reason]
    if expect == "every":
        return [line for r in answered for line in _not_a_call(r, where)]
    if not answered or any(_json_object(args) for r in answered for _, args in r.tool_calls):
        return []
    broken = sum(bool(r.tool_calls) for r in answered)
    as_text = sum(not r.tool_calls and looks_like_call(r.content) for r in answered)
    return [
        f"{where}: none of {len(answered)} requests came back as a tool call with JSON "
        f"arguments ({broken} with broken ones, {as_text} as text that looks like one)"
    ]


def _not_a_call(r: SmokeRecord, where: str) -> list[str]:
    """Why a real model's answer to a tool request is not the tool call it should be."""
    at = f"{where} #{r.index} ({'streamed' if r.streamed else 'not streamed'})"
    if not r.tool_calls:
        why = "a tool call returned as text" if looks_like_call(r.content) else "plain text"
        return [f"{at}: {why}, not a tool call: {r.content[:80]!r}"]
    found = []
    for name, args in r.tool_calls:
        if not _json_object(args):
            found.append(f"{at}: {name} called with {args[:60]!r}")
        elif name not in r.offered:
            found.append(f"{at}: called {name!r}, not an offered tool")
    if r.finish_reason != "tool_calls":
        found.append(f"{at}: finish reason {r.finish_reason}")
    return found


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text or "{}"), dict)
    except json.JSONDecodeError:
        return False


# ---- the report ------------------------------------------------------------------------


def report(results: list[RunResult], facts: dict[str, dict[str, str]]) -> str:
    """Per engine what it runs; per run tokens/s against no drafter, the FULL-graph
    share and the depths its steps verified; per class n, mean k and acceptance."""
    lines = [line for engine in ENGINES for line in engine_lines(engine, facts.get(engine, {}))]
    lines += run_table([r for r in results if r.run.kind != "tools"])
    for r in results:
        if r.run.engine == SPECULATIVE and r.run.kind == "families" and r.run.name != "k0":
            lines += class_table(r)
    lines += ["", *(tool_line(r) for r in results if r.run.kind == "tools")]
    return "\n".join(lines)


def run_table(measured: list[RunResult]) -> list[str]:
    """A row per run: tokens/s, against no drafter at the same concurrency, the share
    of steps that replayed a FULL CUDA graph, the depths the steps verified."""
    if not measured:
        return []
    plain = {r.run.concurrency: r.tokens_per_s for r in measured if r.run.engine == NO_DRAFTER}
    head = f"{'run':<22} {'engine':<12} {'tokens/s':>9}  {'vs no-drafter':>13}  {'FULL graphs':>11}"
    lines = ["", f"{head}  steps by depth"]
    for r in measured:
        base = plain.get(r.run.concurrency, 0.0)
        ratio = f"{r.tokens_per_s / base:.2f}x" if base > 0 else "n/a"
        lines.append(
            f"{r.run.label:<22} {r.run.engine:<12} {r.tokens_per_s:>9.1f}  {ratio:>13}  "
            f"{graph_share(r.graph_steps):>11}  {depth_mix(r.step_depths)}"
        )
    if any(r.graph_steps is None for r in measured):
        lines.append(f"FULL graphs n/a: {NO_GRAPH_COUNTS}")
    return lines


def engine_lines(engine: str, facts: dict[str, str]) -> list[str]:
    """What one engine runs: the gateway's build labels, vLLM's resolved graph config and
    capture summary (its log), the batch-depth rule and FULL-graph widths (the plan)."""
    if not facts:
        return [f"{engine} engine: did not run"]
    build = f"vLLM {facts.get('vllm_version', '?')}, K={facts.get('max_depth', '?')}"
    build += f", step rule {facts.get('step_rule', '?')}"
    graphs = "; ".join(
        f"{key.replace('_', ' ')} {facts.get(key, 'n/a')}"
        for key in ("enforce_eager", "cudagraph_mode", "capture_sizes", "graph_capture")
    )
    lines = [f"{engine} engine: {build}; {graphs}"]
    for key, prefix in PLAN_LINES.items():
        lines.append(f"  plan: {prefix} {facts.get(key, 'n/a (spec-gateway plan gave none)')}")
    return lines


def graph_share(steps: dict[str, float] | None) -> str:
    total = sum(steps.values()) if steps else 0.0
    if steps is None or total <= 0:
        return "n/a"
    return f"{steps.get('FULL', 0.0) / total:.0%}"


def depth_mix(depths: dict[str, float]) -> str:
    total = sum(depths.values())
    if total <= 0:
        return "n/a"
    ranked = sorted(depths.items(), key=lambda kv: -kv[1])
    return " ".join(f"{d}:{n / total:.0%}" for d, n in ranked if n > 0)


def class_table(result: RunResult) -> list[str]:
    lines = [f"\n{result.run.label}: class                     n   mean k   acceptance length"]
    classes: dict[str, list[SmokeRecord]] = {}
    for r in result.records:
        classes.setdefault(r.gw_class or "?", []).append(r)
    for name, recs in sorted(classes.items()):
        lines.append(f"  {name:<30} {len(recs):>3}   {_mean(r.k for r in recs):>6.2f}   "
                     f"{_mean(r.acceptance_length for r in recs):>8.2f}")  # fmt: skip
    return lines


def tool_line(result: RunResult) -> str:
    calls = [args for r in result.records for _, args in r.tool_calls[:1]]
    as_text = sum(not r.tool_calls and looks_like_call(r.content) for r in result.records)
    return (
        f"tools ({result.run.engine}): {len(calls)} of {len(result.records)} requests with "
        f"tool_choice=auto came back as tool calls ({sum(map(_json_object, calls))} with "
        f"JSON arguments), {as_text} as text that looks like one"
    )


def _mean(values: Iterable[float | int | None]) -> float:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else float("nan")
