"""The k = 0 prefix-cache namespace, driven through vLLM's own KV-cache manager: a k = 0
request hits whole blocks of another k = 0 request's prompt (no EAGLE last-block drop),
a k > 0 request does not reuse them (they hold no drafter KV). Both tiers: vLLM 0.32
reads `eagle_group_ids` and 0.33 `drop_eagle_group_ids`, with another lookup signature."""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from engine.interface import SPEC_CAP_ARG, SPEC_DEPTH_ARG
from engine.step_rule import SPEC_VOTE_ARG, StepVote
from engine.vllm.scheduler import DEPTH_ZERO_SALT, SpecDepthScheduler
from tools.model.testing_models import TinyModels

BLOCK = 16
PROMPT = list(range(100, 164))  # 4 full blocks


def _scheduler(tiny: TinyModels) -> Any:
    config = EngineArgs(
        model=str(tiny.target),
        speculative_config={
            "method": "eagle3",
            "model": str(tiny.drafter),
            "num_speculative_tokens": 2,
        },
        max_model_len=512,
        max_num_seqs=8,
        enforce_eager=True,
        dtype="float32",
        enable_prefix_caching=True,
        block_size=BLOCK,
    ).create_engine_config()
    config.cache_config.num_gpu_blocks = 200
    config.scheduler_config.async_scheduling = False
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=32, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=200, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    return SpecDepthScheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=False,
    )


def _request(rid: str, k: int) -> Request:
    init_none_hash(sha256)
    params = SamplingParams(max_tokens=2, temperature=0.0, extra_args={SPEC_DEPTH_ARG: k})
    return Request(
        rid, list(PROMPT), params, None, block_hasher=get_request_block_hasher(BLOCK, sha256)
    )


def _finish(sched: Any) -> None:
    """Run the scheduler until every request is done (1 sampled token per step)."""
    for _ in range(8):
        out = sched.schedule()
        req_ids = list(out.num_scheduled_tokens)
        if not req_ids:
            return
        runner = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[[7] for _ in req_ids],
        )
        sched.update_from_output(out, runner)


def test_depth_zero_hits_whole_blocks_and_stays_apart(tiny: TinyModels) -> None:
    sched = _scheduler(tiny)
    first = _request("first", 0)
    sched.add_request(first)
    assert first.cache_salt == DEPTH_ZERO_SALT
    _finish(sched)
    again, drafting = _request("again", 0), _request("drafting", 2)
    sched.add_request(again)
    sched.add_request(drafting)
    assert drafting.cache_salt is None
    # Through vLLM's own lookup (0.33 passes max_cache_hit_length): of 64 prompt tokens
    # 63 may hit (the last is recomputed for its logits), so 3 whole blocks, none dropped;
    # the drafting request reuses none (the k = 0 blocks hold no drafter KV).
    scheduled = sched.schedule().num_scheduled_tokens
    assert scheduled["again"] == len(PROMPT) - 3 * BLOCK
    assert scheduled["drafting"] == len(PROMPT)


def test_a_riders_blocks_stay_in_the_depth_zero_namespace(tiny: TinyModels) -> None:
    """A rider keeps no drafter running (`engine.vllm.step_votes`), so its prompt's blocks
    may lack drafter KV: they go to the k = 0 namespace, and a drafting request with the
    same prompt reuses none of them."""
    sched = _scheduler(tiny)
    rider = _request("rider", 2)
    vote = StepVote((0.5, 0.3), class_id="tools", rides=True)
    assert rider.sampling_params is not None
    assert rider.sampling_params.extra_args is not None
    rider.sampling_params.extra_args[SPEC_VOTE_ARG] = vote.to_arg()
    sched.add_request(rider)
    assert rider.cache_salt == DEPTH_ZERO_SALT
    # A newcomer's cap to 0 before the rider's first step keeps it there, salted once.
    capping = _request("capping", 0)
    assert capping.sampling_params is not None
    assert capping.sampling_params.extra_args is not None
    capping.sampling_params.extra_args[SPEC_CAP_ARG] = 0
    sched.add_request(capping)
    assert sched._depth(rider) == 0
    assert rider.cache_salt == DEPTH_ZERO_SALT
    _finish(sched)
    drafting = _request("drafting", 2)
    sched.add_request(drafting)
    assert drafting.cache_salt is None
    assert sched.schedule().num_scheduled_tokens["drafting"] == len(PROMPT)
