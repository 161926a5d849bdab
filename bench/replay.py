"""Replay a workload against the gateway over HTTP with the official `openai` client.

Every request streams (`stream_options.include_usage`), so TTFT is the wall time
to the first content chunk as a user sees it, and the final usage chunk carries
the speculation report: vLLM's `metrics.speculative_decoding` (drafted / accepted
tokens, verify steps) and the gateway's `speculation` object (class, k). The
`x-specgw-k` / `x-specgw-class` headers are recorded too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import openai

from bench.workload import Arrival, ClosedLoop, WorkItem


@dataclass(slots=True)
class RequestRecord:
    """What one request measured; times in seconds, `start` relative to the run's start."""

    index: int
    phase: int
    family: str
    ok: bool
    start: float
    e2e: float
    ttft: float | None = None
    tpot: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    gw_class: str | None = None
    k: int | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    acceptance_length: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def request_kwargs(item: WorkItem, model: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": item.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if item.prompt.extra.get("temperature"):
        # Sampled: a seed per request, so every mode and repeat sends the same request.
        kwargs.update(item.prompt.extra)
        kwargs["seed"] = item.index
    if item.prompt.is_chat:
        kwargs["messages"] = item.prompt.messages
        if item.prompt.tools:
            kwargs["tools"] = item.prompt.tools
    else:
        kwargs["prompt"] = item.prompt.prompt
    return kwargs


def _has_content(chunk: Any) -> bool:
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        if delta is not None:
            if getattr(delta, "content", None) or getattr(delta, "tool_calls", None):
                return True
        elif getattr(choice, "text", None):
            return True
    return False


def _apply_final(rec: RequestRecord, chunk: Any) -> None:
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        rec.output_tokens = int(usage.completion_tokens or 0)
        rec.prompt_tokens = int(usage.prompt_tokens or 0)
    # The gateway's speculation report: its decision, and vLLM's block with the counts.
    extra = getattr(chunk, "model_extra", None) or {}
    spec = extra.get("speculation")
    if isinstance(spec, dict):
        rec.gw_class = str(spec.get("class", rec.gw_class))
        rec.k = int(spec.get("k", rec.k if rec.k is not None else -1))
    counts = (extra.get("metrics") or {}).get("speculative_decoding")
    if isinstance(counts, dict):
        rec.draft_tokens = int(counts.get("num_draft_tokens", 0))
        rec.accepted_tokens = int(counts.get("num_accepted_draft_tokens", 0))
        rec.verify_steps = int(counts.get("num_spec_steps", 0))
        rec.acceptance_length = float(counts.get("mean_acceptance_length", 1.0))


async def send_one(
    client: openai.AsyncOpenAI, item: WorkItem, model: str, t0: float
) -> RequestRecord:
    """One streamed request; failures are recorded, never raised (the run goes on)."""
    start = time.perf_counter()
    rec = RequestRecord(item.index, item.phase, item.family, False, start - t0, 0.0)
    first: float | None = None
    try:
        kwargs = request_kwargs(item, model)
        api = client.chat.completions if item.prompt.is_chat else client.completions
        raw = await api.with_raw_response.create(**kwargs)
        rec.gw_class = raw.headers.get("x-specgw-class")
        k_header = raw.headers.get("x-specgw-k")
        rec.k = int(k_header) if k_header is not None else None
        stream = raw.parse()
        async for chunk in stream:
            if first is None and _has_content(chunk):
                first = time.perf_counter()
            if getattr(chunk, "usage", None) is not None:
                _apply_final(rec, chunk)
        rec.ok = True
    except openai.OpenAIError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    end = time.perf_counter()
    rec.e2e = end - start
    if first is not None:
        rec.ttft = first - start
        if rec.output_tokens > 1:
            rec.tpot = (end - first) / (rec.output_tokens - 1)
    return rec


async def replay(
    client: openai.AsyncOpenAI,
    items: list[WorkItem],
    arrival: Arrival,
    model: str,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """(records in workload order, wall seconds of the whole replay)."""
    t0 = time.perf_counter()
    records: list[RequestRecord] = []

    def done(rec: RequestRecord) -> None:
        records.append(rec)
        if on_done is not None:
            on_done(rec)

    if isinstance(arrival, ClosedLoop):
        queue: asyncio.Queue[WorkItem] = asyncio.Queue()
        for item in items:
            queue.put_nowait(item)

        async def worker() -> None:
            while not queue.empty():
                done(await send_one(client, queue.get_nowait(), model, t0))

        await asyncio.gather(*(worker() for _ in range(arrival.concurrency)))
    else:

        async def at(item: WorkItem, offset: float) -> None:
            await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
            done(await send_one(client, item, model, t0))

        offsets = arrival.offsets(len(items))
        await asyncio.gather(*(at(i, o) for i, o in zip(items, offsets, strict=True)))
    wall = time.perf_counter() - t0
    records.sort(key=lambda r: r.index)
    return records, wall
