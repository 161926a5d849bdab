"""Exploration's rule as a table: the share a request probes at, and the depths it may probe."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, TypeVar

import pytest

from gateway.control.cost_model import CostModel
from gateway.control.decision import LoadSnapshot
from gateway.control.exploration import Exploration, Floor
from gateway.control.settings import ControllerSettings

if TYPE_CHECKING:
    from _typeshed import SupportsLenAndGetItem

T = TypeVar("T")
SETTINGS = ControllerSettings()  # shares: exploration 0.05, zero-probe 0.2, cost-probe 0.2;
# watch-probe scale 0.5


class ScriptedRandom(random.Random):
    """Draws a fixed number; `choice` takes the last option and records what it was offered."""

    def __init__(self, draw: float) -> None:
        super().__init__(0)
        self.draw = draw
        self.offered: list[object] = []

    def random(self) -> float:
        return self.draw

    def choice(self, seq: SupportsLenAndGetItem[T]) -> T:
        self.offered = [seq[i] for i in range(len(seq))]
        return seq[len(seq) - 1]


def calibrated_model() -> CostModel:
    """Every depth run three times at batches 1 and 16; batch 4 never seen."""
    model = CostModel(5, 0.02, 0.08, 16.0, 2.0, 0.01)
    for batch in (1, 16):
        for _ in range(3):
            for k in range(6):
                model.observe(k, batch, 0.02 * (1 + 0.1 * k), depth=k)
    return model


def scripted_probe(
    draw: float,
    floor: Floor | None,
    k: int,
    hopeful: bool,
    bounds: tuple[int, int],
    bucket: int,
    load: LoadSnapshot,
    flag: float | None,
    reach: int | None = None,
) -> tuple[int | None, list[object]]:
    """One request's probe on the calibrated model with a fixed draw, and the depths
    the draw chose among."""
    rng = ScriptedRandom(draw)
    explore = Exploration(calibrated_model(), SETTINGS, rng, floor)
    return explore.probe(k, hopeful, bounds, bucket, load, flag, reach), rng.offered


GUARDED = LoadSnapshot(running=1, guarded={((1.0,) * 6, 0.9): 1})

CASES = [
    # name, k, hopeful, bounds, bucket, flag share, load, share, depths offered, probe
    ("k +- 1 at batch 1", 3, True, (0, 5), 1, None, LoadSnapshot(), 0.05, [2, 4], 4),
    ("per batch at 16", 3, True, (0, 5), 16, None, LoadSnapshot(), 0.05 / 16, [2, 4], 4),
    ("k at the upper bound", 5, True, (0, 5), 1, None, LoadSnapshot(), 0.05, [], 4),
    ("the class's flag", 3, True, (0, 5), 1, 0.3, LoadSnapshot(), 0.3, [2, 4], 4),
    ("k = 0 while k = 1 may pay", 0, True, (0, 5), 1, None, LoadSnapshot(), 0.2, [], 1),
    ("k = 0 may pay, batch 16", 0, True, (0, 5), 16, None, LoadSnapshot(), 0.2 / 16, [], 1),
    # Its probes only watch for a drift up: half the share (`watch_probe_scale`).
    ("k = 0 cannot pay, batch 1", 0, False, (0, 5), 1, None, LoadSnapshot(), 0.025, [], 1),
    ("k = 0 cannot pay, its flag", 0, False, (0, 5), 1, 0.3, LoadSnapshot(), 0.15, [], 1),
    ("k = 0 cannot pay, batch 16", 0, False, (0, 5), 16, None, LoadSnapshot(), 0.0, [], None),
    (
        # Under load, thin depths up to k + 1 only: deeper, the whole batch drafts deep.
        "unmeasured load: thin depths",
        3,
        True,
        (0, 5),
        4,
        None,
        LoadSnapshot(),
        0.2,
        [0, 1, 2, 4],
        4,
    ),
    ("thin depths within bounds", 3, True, (2, 4), 4, None, LoadSnapshot(), 0.2, [2, 4], 4),
    ("flag at 0: no calibration either", 3, True, (0, 5), 4, 0.0, LoadSnapshot(), 0.0, [], None),
    ("not past a guarded floor", 3, True, (0, 5), 1, None, GUARDED, 0.05, [2, 4], None),
]


@pytest.mark.parametrize(
    ("name", "k", "hopeful", "bounds", "bucket", "flag", "load", "share", "offered", "probe"),
    CASES,
    ids=[case[0] for case in CASES],
)
def test_exploration_table(
    name: str,
    k: int,
    hopeful: bool,
    bounds: tuple[int, int],
    bucket: int,
    flag: float | None,
    load: LoadSnapshot,
    share: float,
    offered: list[object],
    probe: int | None,
) -> None:
    def floor(load: LoadSnapshot, bucket: int, depth: int, k_min: int) -> int:
        return min(depth, k)  # guarded mates afford no deeper than this class's k

    def probe_at(draw: float) -> tuple[int | None, list[object]]:
        return scripted_probe(draw, floor, k, hopeful, bounds, bucket, load, flag)

    below, seen = probe_at(share * (1 - 1e-9))
    assert below == probe, name
    assert seen == offered, name
    assert probe_at(share)[0] is None  # a draw at the share does not probe


REACH_CASES = [
    # name, k, reach, bounds, bucket, flag share, share, depths offered, probe
    ("a held deeper depth at batch 1", 3, 5, (0, 5), 1, None, 0.2, [], 5),
    ("under load no further than k + 1", 3, 5, (0, 5), 16, None, 0.2 / 16, [], 4),
    ("within the flags' bounds", 3, 5, (0, 4), 1, None, 0.2, [], 4),
    ("thin depths first", 3, 4, (0, 5), 4, None, 0.2, [0, 1, 2, 4], 4),
    ("a reach not above k is none", 3, 3, (0, 5), 1, None, 0.05, [2, 4], 4),
    ("flag at 0: no probe", 3, 5, (0, 5), 1, 0.0, 0.0, [], None),
]


@pytest.mark.parametrize(
    ("name", "k", "reach", "bounds", "bucket", "flag", "share", "offered", "probe"),
    REACH_CASES,
    ids=[case[0] for case in REACH_CASES],
)
def test_a_held_deeper_depth_is_probed_at_the_zero_probe_share(
    name: str,
    k: int,
    reach: int,
    bounds: tuple[int, int],
    bucket: int,
    flag: float | None,
    share: float,
    offered: list[object],
    probe: int | None,
) -> None:
    def probe_at(draw: float) -> tuple[int | None, list[object]]:
        return scripted_probe(draw, None, k, True, bounds, bucket, LoadSnapshot(), flag, reach)

    below, seen = probe_at(share * (1 - 1e-9))
    assert below == probe, name
    assert seen == offered, name
    assert probe_at(share)[0] is None  # a draw at the share does not probe


def test_a_calibrated_bucket_stays_calibrated_and_a_stricter_ask_rechecks() -> None:
    model = calibrated_model()
    explore = Exploration(model, SETTINGS, random.Random(0))
    assert explore.thin_depths(1, 3) == []
    assert explore.thin_depths(1, 3) == []  # asking again changes nothing
    assert explore.thin_depths(1, 4) == [0, 1, 2, 3, 4, 5]  # a stricter bound is checked again
    assert explore.thin_depths(4, 3) == [0, 1, 2, 3, 4, 5]  # another load is its own bucket
    model.observe(2, 4, 0.02)
    assert explore.thin_depths(4, 1) == [0, 1, 3, 4, 5]  # runs at the own k count


def test_probes_are_drawn_from_the_injected_random() -> None:
    """The same seed gives the same probes; the measured share is the configured one."""
    model = calibrated_model()

    def run(seed: int) -> list[int | None]:
        explore = Exploration(model, SETTINGS, random.Random(seed))
        return [explore.probe(3, True, (0, 5), 1, LoadSnapshot()) for _ in range(4000)]

    first = run(7)
    assert first == run(7)
    probes = [p for p in first if p is not None]
    assert 0.6 * 4000 * 0.05 < len(probes) < 1.4 * 4000 * 0.05
    assert set(probes) == {2, 4}


@pytest.mark.parametrize(
    ("loss", "flag", "share"),
    [
        (1.0, None, 0.025),  # unknown or dear: half the class's share
        (0.3, None, 0.025),  # 0.25 % / 30 % = 0.8 %: the half share is the floor
        (0.05, None, 0.05),  # 0.25 % / 5 %
        (0.02, None, 0.125),  # 0.25 % / 2 %
        (0.01, None, 0.2),  # 0.25 % / 1 %, capped at `zero_probe_share`
        (0.0, None, 0.2),  # a free probe: at most `zero_probe_share`
        (0.02, 0.3, 0.15),  # the class's flag: half of it, above the budget's share
    ],
)
def test_a_watch_probe_runs_as_often_as_its_budget_affords(
    loss: float, flag: float | None, share: float
) -> None:
    """A class at k = 0 where k = 1 cannot pay watches for a drift up at batch 1 at
    `watch_probe_budget` (0.25 % of its goodput) over what a probe costs its request,
    within [`watch_probe_scale` x its share, `zero_probe_share`]; under load not at all."""

    def probes(draw: float, bucket: int = 1) -> bool:
        explore = Exploration(calibrated_model(), SETTINGS, ScriptedRandom(draw))
        probe = explore.probe(0, False, (0, 5), bucket, LoadSnapshot(), flag, None, loss)
        return probe == 1

    assert probes(share * 0.999)
    assert not probes(share * 1.001)
    assert not probes(0.0, bucket=16)


def test_without_a_watch_budget_the_scale_alone_sets_the_share() -> None:
    settings = ControllerSettings(watch_probe_budget=0.0)
    explore = Exploration(calibrated_model(), settings, ScriptedRandom(0.024))
    assert explore.watch_share(0.05, 0.01) == pytest.approx(0.025)
    assert explore.probe(0, False, (0, 5), 1, LoadSnapshot(), None, None, 0.01) == 1


@pytest.mark.parametrize("loss", [0.3, 0.02])
def test_a_rising_class_at_zero_watches_at_the_short_interval(loss: float) -> None:
    """While a probe's acceptance has put the class's upward drift statistic in its
    excursion, a class at k = 0 that cannot pay at k = 1 probes at `zero_probe_share`
    (0.2) at batch 1, whatever its watch budget gives; under load still not at all."""

    def probes(draw: float, bucket: int = 1, rising: bool = True) -> bool:
        explore = Exploration(calibrated_model(), SETTINGS, ScriptedRandom(draw))
        return (
            explore.probe(0, False, (0, 5), bucket, LoadSnapshot(), None, None, loss, rising) == 1
        )

    assert probes(0.199)
    assert not probes(0.201)
    assert not probes(0.0, bucket=16)
    quiet = Exploration(calibrated_model(), SETTINGS, ScriptedRandom(0.0)).watch_share(0.05, loss)
    assert quiet < 0.2
    assert not probes(quiet * 1.001, rising=False)
