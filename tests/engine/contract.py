"""The `Engine` contract: every implementation (VLLMEngine, FakeEngine) passes these.

Each check is an async function of a started engine; the test modules
parametrise over them. Prompts are unique per check so checks do not share
prefix-cache state in a way that matters.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from engine.interface import Engine, GenerateRequest, GenerationChunk, RequestOutcome
from tests.clock import until

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"


def _req(k: int, max_tokens: int = 24, prompt: str = PROMPT, **kw: Any) -> GenerateRequest:
    return GenerateRequest(
        request_id=f"contract-{uuid.uuid4().hex[:10]}",
        prompt=prompt,
        max_tokens=max_tokens,
        k=k,
        **kw,
    )


async def collect(
    engine: Engine, request: GenerateRequest
) -> tuple[list[GenerationChunk], RequestOutcome]:
    chunks = [c async for c in engine.generate(request)]
    final = chunks[-1]
    assert final.finished
    assert final.outcome is not None
    assert all(not c.finished and c.outcome is None for c in chunks[:-1])
    return chunks, final.outcome


async def stream_ends_with_one_outcome(engine: Engine) -> None:
    chunks, outcome = await collect(engine, _req(engine.max_depth, max_tokens=20))
    tokens = [t for c in chunks for t in c.token_ids_delta]
    assert outcome.output_tokens == len(tokens) <= 20
    assert outcome.finish_reason in {"length", "stop"}
    assert outcome.prompt_tokens > 0
    assert outcome.e2e_s >= outcome.ttft_s >= 0.0
    assert outcome.tpot_s >= 0.0


async def k_zero_reports_no_drafts(engine: Engine) -> None:
    _, outcome = await collect(engine, _req(0, max_tokens=16))
    spec = outcome.speculation
    assert spec.k == 0
    assert (spec.verify_steps, spec.draft_tokens, spec.accepted_tokens) == (0, 0, 0)
    assert spec.acceptance_length == 1.0


async def concurrent_depths_respect_k(engine: Engine) -> None:
    """Concurrent k = 0, 1, 2, K: at most k drafts per verify step, greedy output equal."""
    depths = sorted({0, 1, 2, engine.max_depth})
    results = await asyncio.gather(*(collect(engine, _req(k, max_tokens=32)) for k in depths))
    outputs = []
    for k, (chunks, outcome) in zip(depths, results, strict=True):
        spec = outcome.speculation
        assert spec.k == k
        assert spec.draft_tokens <= k * spec.verify_steps
        assert spec.accepted_tokens <= spec.draft_tokens
        assert len(spec.accepted_per_position) <= k
        assert sum(spec.accepted_per_position) == spec.accepted_tokens
        if k == 0:
            assert spec.draft_tokens == 0
            assert spec.acceptance_length == 1.0
        else:
            assert spec.verify_steps > 0  # speculation really ran for k > 0
        outputs.append([t for c in chunks for t in c.token_ids_delta])
    assert all(o == outputs[0] for o in outputs), "greedy output must not depend on k"


async def depth_above_k_is_clamped(engine: Engine) -> None:
    _, outcome = await collect(engine, _req(engine.max_depth + 5, max_tokens=12))
    assert outcome.speculation.k == engine.max_depth
    assert outcome.speculation.draft_tokens <= engine.max_depth * outcome.speculation.verify_steps


async def cancel_leaves_no_running_request(engine: Engine) -> None:
    """Cancelling the consumer mid-stream aborts the engine request within 1 s."""
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate(_req(engine.max_depth, max_tokens=2000)):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 60)
    cancelled_at = time.monotonic()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    counts = engine.request_counts  # type: ignore[attr-defined]

    def settled() -> bool:
        running, waiting, reported_at = counts()
        return reported_at >= cancelled_at and running == 0 and waiting == 0

    await until(settled, 1.0, f"the cancelled request gone from the counts {counts()}")
    assert (await engine.health()).ready


async def abort_ends_the_stream(engine: Engine) -> None:
    request = _req(engine.max_depth, max_tokens=2000)
    chunks: list[GenerationChunk] = []

    async def consume() -> None:
        async for chunk in engine.generate(request):
            chunks.append(chunk)
            if len(chunks) == 2:
                await engine.abort(request.request_id)

    await asyncio.wait_for(consume(), 30)
    assert chunks[-1].finished
    assert chunks[-1].finish_reason == "abort"


async def healthy_when_idle(engine: Engine) -> None:
    health = await engine.health()
    assert health.alive
    assert health.ready
    assert health.stalled_for_s == 0.0


CONTRACT: dict[str, Callable[[Engine], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        stream_ends_with_one_outcome,
        k_zero_reports_no_drafts,
        concurrent_depths_respect_k,
        depth_above_k_is_clamped,
        cancel_leaves_no_running_request,
        abort_ends_the_stream,
        healthy_when_idle,
    )
}
