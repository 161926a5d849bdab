"""Sampled requests on the real engine: classed apart from greedy ones, speculating where
that is exact, at k = 0 where the engine is set not to (`sampled_speculation: off`)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gateway.conftest import (
    ADMIN_KEY,
    NO_CALIBRATION,
    GatewayProcess,
    start_gateway,
    stop_gateway,
)
from tests.gateway.flag_files import write_flags
from tests.spec_report import vllm_block

pytestmark = pytest.mark.engine
MODEL = "specgw-default"
MESSAGES = [
    {"role": "system", "content": "You answer questions about sampling fidelity."},
    {"role": "user", "content": "What does the json module do?"},
]
#: Step costs fixed where a draft is cheap, not calibrated, and no probes: whether a new
#: class speculates at all follows the host's prices (a calibration on a loaded host can
#: price k = 0 above every depth at cold start, and the policy steps a cold class down at
#: once), and with no calibration every depth is thin, so a probe may run any request at
#: k = 0 (`gateway.control.exploration`). What is tested below is what the engine's setting
#: does to a class that speculates, so its class must speculate: a prior of 0.02 of a step
#: per draft, weighted far above the live steps, and no exploration.
CHEAP_DRAFTS = {
    **NO_CALIBRATION,
    "SPECGW_CONTROL_PRIOR_K_COST": "0.02",
    "SPECGW_CONTROL_COST_PRIOR_WEIGHT": "1e6",
    "SPECGW_CONTROL_EXPLORATION_SHARE": "0",
}


@pytest.fixture(scope="module")
def sampling_auto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # A gateway of its own: on the session's shared one, a class another test taught
    # (k = 0 included) seeds a similar new class (`cold start: like ...`).
    gw = start_gateway(tmp_path_factory.mktemp("gw-sampling-auto"), CHEAP_DRAFTS)
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="module")
def sampling_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # `batch-lower` off: the batch-depth test below needs the k = 0 request to run in
    # its mates' deep batch; a newcomer may otherwise lower the batch under it
    # (whether it does follows the start-up calibration's prices).
    tmp = tmp_path_factory.mktemp("gw-sampling-off")
    flags = tmp / "flags"
    flags.mkdir()
    write_flags(flags, {"batch-lower": False})
    gw = start_gateway(
        tmp,
        {
            "SPECGW_ENGINE_SAMPLED_SPECULATION": "off",
            "SPECGW_FLAGS_DIR": str(flags),
            **CHEAP_DRAFTS,
        },
    )
    yield gw
    stop_gateway(gw)


def _classes(gateway: GatewayProcess) -> dict[str, dict[str, object]]:
    with gateway.http(ADMIN_KEY) as http:
        return {r["label"]: r for r in http.get("/admin/classes").json()["data"]}


def test_sampled_requests_speculate_in_a_class_of_their_own(
    sampling_auto: GatewayProcess,
) -> None:
    """With the CPU sampler's expand kernel fixed (`engine.vllm.expand_fix`) sampled
    speculation is exact on this build (`sampled_speculation: auto`), so a sampled
    request speculates; it accepts drafts less often than a greedy one of the same
    prompt, so it is classed by its temperature's bucket, apart from the greedy class."""
    gateway = sampling_auto
    client = gateway.client()
    greedy = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0
    )
    label = greedy.headers["x-specgw-class"]
    assert int(greedy.headers["x-specgw-k"]) > 0  # a new class starts at the default k
    # The first request of each sampled class (cold start: the default k); a second one
    # of a class may already run at the k its first outcome chose (0 included).
    for temperature, bucket in ((0.8, "t1"), (0.3, "t0.5"), (None, "t1")):
        # None: vLLM's default, the model's generation config or 1.0.
        extra = {} if temperature is None else {"temperature": temperature}
        sampled = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=16, **extra
        )
        assert sampled.headers["x-specgw-class"] == f"{label}/{bucket}"
        k = int(sampled.headers["x-specgw-k"])
        extra = sampled.parse().model_extra
        assert extra["speculation"]["k"] == k
        if temperature is not None:
            assert k > 0
            assert vllm_block(extra)["num_draft_tokens"] > 0
    classes = _classes(gateway)
    assert {label, f"{label}/t1", f"{label}/t0.5"} <= set(classes)


def test_sampled_requests_run_at_k0_where_the_engine_is_set_not_to_speculate_them(
    sampling_off: GatewayProcess,
) -> None:
    """`sampled_speculation: off` (for a build whose sampled speculation is not exact): a
    sampled request runs at k = 0 whatever its class's k, and a greedy request still
    speculates."""
    client = sampling_off.client()
    greedy = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0
    )
    label = greedy.headers["x-specgw-class"]
    assert int(greedy.headers["x-specgw-k"]) > 0
    assert vllm_block(greedy.parse().model_extra)["num_draft_tokens"] > 0
    sampled = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0.8
    )
    assert sampled.headers["x-specgw-class"] == f"{label}/t1"
    assert sampled.headers["x-specgw-k"] == "0"
    extra = sampled.parse().model_extra
    assert (extra["speculation"]["k"], vllm_block(extra)["num_draft_tokens"]) == (0, 0)
    classes = _classes(sampling_off)
    assert int(str(classes[f"{label}/t1"]["k"])) > 0  # the class's own k stands


def _bucket(gateway: GatewayProcess, batch: int) -> dict[str, list[float]]:
    """The cost model's counts at one batch bucket; none before anything reached it (with
    no start-up calibration, traffic opens the bucket)."""
    with gateway.http(ADMIN_KEY) as http:
        buckets = http.get("/admin/costs").json()["buckets"]
    return next((b for b in buckets if b["batch_bucket"] == batch), {})


def _count(bucket: dict[str, list[float]], key: str, k: int) -> float:
    values = bucket.get(key, [])
    return values[k] if k < len(values) else 0.0


def test_a_request_is_costed_at_the_depth_of_the_batch_it_ran_in(
    sampling_off: GatewayProcess,
) -> None:
    """A k = 0 request (sampled, on a gateway set not to speculate those) running beside
    three speculating ones paid steps at their depth: the cost model files the engine's
    timed steps of that batch at the largest k in it, never at k = 0, so k = 0 does not
    look dear and speculation cheap (`gateway.control.batch_load`,
    `InferenceService.observe_step`). The request still counts as a run at k = 0
    (`samples`), and its own mean step time is not filed on top of its steps."""
    gateway = sampling_off
    messages = [
        {"role": "system", "content": "You write long lists about rivers for the batch test."},
        {"role": "user", "content": "List rivers of Europe, one per line."},
    ]
    client = gateway.client()

    def deep() -> int:
        reply = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=400,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return int(reply.headers["x-specgw-k"])

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(deep) for _ in range(3)]
        deadline = time.monotonic() + 30
        while gateway.engine_requests() < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = _bucket(gateway, 4)
        sampled = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=24, temperature=0.8
        )
        after = _bucket(gateway, 4)
        # Only the sampled request finished in between, in a batch of four throughout.
        assert gateway.engine_requests() >= 3
        ks = [f.result() for f in futures]
    assert sampled.headers["x-specgw-k"] == "0"
    depth = max(ks)
    assert depth > 0
    # A run at k = 0 ...
    assert _count(after, "samples", 0) == _count(before, "samples", 0) + 1
    # ... not costed as a k = 0 step.
    assert _count(after, "filed", 0) <= _count(before, "filed", 0)
    # Its ~24 steps at the batch's depth, each one sample (a request's own mean would
    # have added one sample, less the forgetting of the ones before).
    assert _count(after, "filed", depth) > _count(before, "filed", depth) + 1
    with gateway.http() as http:
        exposition = http.get("/metrics").text
    filed = re.search(r'^specgw_engine_steps_total\{filed="true"\} (\S+)$', exposition, re.M)
    assert filed is not None
    assert float(filed.group(1)) > 1
