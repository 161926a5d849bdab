"""Means of the batch over a request's life: what the cost model files a step under."""

from __future__ import annotations

import pytest

from gateway.control.batch_load import BatchLoad


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_request_alone_reports_its_own_k_and_size_one() -> None:
    clock = Clock()
    load = BatchLoad(clock)
    ticket = load.enter(3)
    clock.now += 2.0
    means = load.leave(ticket)
    assert means.size == pytest.approx(1.0)
    assert means.depth == pytest.approx(3.0)
    assert load.in_flight == 0


def test_a_probe_among_deep_requests_reports_their_depth() -> None:
    """One k = 0 request in a batch of three k = 4 ones, for its whole life."""
    clock = Clock()
    load = BatchLoad(clock)
    deep = [load.enter(4) for _ in range(3)]
    clock.now += 1.0
    probe = load.enter(0)
    clock.now += 4.0
    means = load.leave(probe)
    assert means.size == pytest.approx(4.0)
    assert means.depth == pytest.approx(4.0)  # the drafter drafted 4 deep for it too
    for t in deep:
        load.leave(t)
    assert load.in_flight == 0


def test_means_weight_time_not_events() -> None:
    """A batch that was 4 deep for 1 s and 0 deep for 3 s averages to the shallow side."""
    clock = Clock()
    load = BatchLoad(clock)
    mine = load.enter(0)
    other = load.enter(4)
    clock.now += 1.0
    load.leave(other)
    clock.now += 3.0
    means = load.leave(mine)
    assert means.depth == pytest.approx((4.0 * 1.0 + 0.0 * 3.0) / 4.0)
    assert means.size == pytest.approx((2.0 * 1.0 + 1.0 * 3.0) / 4.0)


def test_the_depth_follows_the_requests_still_in_flight() -> None:
    clock = Clock()
    load = BatchLoad(clock)
    low, high = load.enter(1), load.enter(4)
    load.leave(high)
    clock.now += 1.0
    mid = load.enter(2)
    clock.now += 1.0
    assert load.leave(mid).depth == pytest.approx(2.0)  # 1 and 2 in flight
    assert load.leave(low).depth == pytest.approx(1.5)  # 1 alone for 1 s, beside 2 for 1 s


def test_a_request_that_took_no_time_reports_the_batch_as_it_stands() -> None:
    clock = Clock()
    load = BatchLoad(clock)
    load.enter(2)
    ticket = load.enter(1)
    means = load.leave(ticket)
    assert means.size == pytest.approx(2.0)
    assert means.depth == pytest.approx(2.0)


def test_gains_sum_the_requests_in_flight_at_each_batch_depth() -> None:
    """Each request adds what it would yield per step at batch depth D (its last value
    beyond its tuple; one token at every depth without one) and takes it out on leaving."""
    load = BatchLoad(Clock())
    deep = load.enter(3, (1.0, 1.8, 2.4, 2.9))
    sampled = load.enter(0)
    assert load.gains[:6] == pytest.approx([2.0, 2.8, 3.4, 3.9, 3.9, 3.9])
    load.leave(deep)
    assert load.gains[:3] == pytest.approx([1.0, 1.0, 1.0])
    load.leave(sampled)
    assert load.gains == [0.0] * len(load.gains)


def test_prefill_counts_the_prompts_that_entered_during_a_life() -> None:
    """Chunked prefill of requests that arrive later runs in this request's steps; its
    own prompt and those already in the engine before it do not count."""
    clock = Clock()
    load = BatchLoad(clock)
    early = load.enter(0, prompt_tokens=500)
    mine = load.enter(0, prompt_tokens=40)
    later = [load.enter(1, prompt_tokens=n) for n in (300, 20)]
    assert load.leave(mine).prefill == 320
    assert load.leave(early).prefill == 360
    assert [load.leave(t).prefill for t in later] == [20, 0]


CHAT = (1.0, 1.8, 2.4, 2.9, 3.3)


def test_requests_with_a_floor_are_guarded_while_in_flight() -> None:
    """Only requests whose class has a `batch_floor` are filed, by (gains, floor), and
    each leaves with its own ticket."""
    load = BatchLoad(Clock())
    tool = (1.0, 1.2, 1.25)
    a = load.enter(2, tool, 300, floor=0.98)
    b = load.enter(2, tool, 300, floor=0.98)
    chat = load.enter(4, CHAT, 40)  # no floor: not guarded
    assert load.guarded == {(tool, 0.98): 2}
    load.leave(a)
    assert load.guarded == {(tool, 0.98): 1}
    load.leave(chat)
    load.leave(b)
    assert load.guarded == {}


@pytest.mark.parametrize(
    ("k", "weighed"),
    [
        (4, CHAT),
        (2, (1.0, 1.8, 2.4, 2.4, 2.4)),
        # Held at 0 for its batch: one token a step, however deep the batch drafts.
        (0, (1.0, 1.0, 1.0, 1.0, 1.0)),
    ],
)
def test_a_guarded_request_is_weighed_at_the_depth_it_runs_at(
    k: int, weighed: tuple[float, ...]
) -> None:
    """A request verifies at most its own k whatever the batch drafts, so one held below
    its class's choice yields E[tokens | min(k, D)] at batch depth D, not its class's
    gains (`own_gains`)."""
    load = BatchLoad(Clock())
    ticket = load.enter(k, CHAT, 40, floor=0.98)
    assert load.guarded == {(weighed, 0.98): 1}
    assert load.gains == pytest.approx([*CHAT, *[CHAT[-1]] * (17 - len(CHAT))])  # the class's
    load.leave(ticket)
    assert load.guarded == {}


def test_a_cap_lowers_what_the_guarded_requests_in_flight_are_weighed_at() -> None:
    """After the engine lowers the batch to a cap, the guarded requests it lowered yield
    tokens at the cap; one that enters later is weighed at its own k, and each leaves
    with the key it is filed under."""
    load = BatchLoad(Clock())
    deep = load.enter(4, CHAT, 40, floor=0.98)
    two = load.enter(2, CHAT, 40, floor=0.98)
    load.cap(1)
    at_one = (1.0, 1.8, 1.8, 1.8, 1.8)
    assert load.guarded == {(at_one, 0.98): 2}
    late = load.enter(3, CHAT, 40, floor=0.98)
    assert load.guarded == {(at_one, 0.98): 2, ((1.0, 1.8, 2.4, 2.9, 2.9), 0.98): 1}
    load.leave(deep)
    assert load.guarded == {(at_one, 0.98): 1, ((1.0, 1.8, 2.4, 2.9, 2.9), 0.98): 1}
    load.leave(late)
    load.leave(two)
    assert load.guarded == {}


def test_a_cap_lowers_the_requests_in_flight_and_each_leaves_at_its_lowered_depth() -> None:
    """The engine lowers every request in flight to a newcomer's cap (`engine.vllm.scheduler`);
    the batch follows: its deepest k drops at once, a request that entered deep leaves
    at the cap, one that entered after the cap keeps its own k."""
    clock = Clock()
    load = BatchLoad(clock)
    deep = load.enter(4)
    two = load.enter(2)
    clock.now += 1.0
    load.cap(1)
    assert load.deepest == 1
    late = load.enter(3)
    assert load.deepest == 3
    load.cap(5)  # above every k: nothing moves
    assert load.deepest == 3
    clock.now += 1.0
    means = load.leave(deep)
    assert means.depth == pytest.approx((4.0 + 3.0) / 2)  # 4 for a second, then 1 then 3
    assert load.deepest == 3
    load.leave(late)
    assert load.deepest == 1  # "two", lowered to 1
    load.leave(two)
    assert (load.deepest, load.in_flight) == (0, 0)
    again = load.enter(4)  # the cap log went with the batch
    assert load.leave(again).depth == pytest.approx(4.0)


def test_riders_follow_the_depth_a_request_chose_and_never_anchor_it() -> None:
    """A request whose class chose k = 3 anchors the batch at 3; a rider (class k = 0,
    running at 3) keeps the batch's depth while it runs but not the anchor, so once the
    anchor has left the next newcomer is told 0; a cap lowers anchors with the depths."""
    load = BatchLoad(Clock())
    anchor = load.enter(3)
    rider = load.enter(3, anchor=0)
    assert (load.deepest, load.anchored) == (3, 3)
    load.leave(anchor)
    assert (load.deepest, load.anchored) == (3, 0)
    load.leave(rider)
    assert (load.deepest, load.anchored) == (0, 0)
    deep = load.enter(4)
    riding = load.enter(4, anchor=1)
    load.cap(2)
    assert (load.deepest, load.anchored) == (2, 2)
    later = load.enter(1)
    load.leave(deep)
    assert load.anchored == 1  # the rider's class chose 1, the newcomer 1
    load.leave(riding)
    load.leave(later)
    assert (load.deepest, load.anchored, load.in_flight) == (0, 0, 0)


def test_step_tokens_count_one_plus_k_for_each_request_in_flight() -> None:
    load = BatchLoad(clock=lambda: 0.0)
    assert load.step_tokens() == 0
    first = load.enter(3)
    load.enter(0)
    load.enter(1)
    assert load.step_tokens() == 4 + 1 + 2
    load.cap(1)  # the engine lowered the k = 3 request for a newcomer
    assert load.step_tokens() == 2 + 1 + 2
    load.leave(first)
    assert load.step_tokens() == 1 + 2


def test_requests_whose_k_an_operator_set_are_counted_while_in_flight() -> None:
    """A pinned (or static-mode) request is counted in `fixed`, which keeps newcomers
    from lowering the batch (`Controller.decide`), until it leaves."""
    load = BatchLoad(Clock())
    pinned = load.enter(4, fixed=True)
    chat = load.enter(2, (1.0, 1.8, 2.4))
    assert load.fixed == 1
    load.leave(chat)
    assert load.fixed == 1
    load.leave(pinned)
    assert load.fixed == 0
