"""The pure parts of `bench.floor_resident`: the median's interval, the turn order, the
process accounting from /proc and the ratio summary. No engine starts here."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

from bench.floor_resident import (
    BASE,
    NULL,
    Cell,
    Turn,
    cpu_seconds,
    descendants,
    median_interval,
    summarise,
    turn_order,
    variants,
)


def test_the_medians_interval_is_the_sign_tests_order_statistics() -> None:
    values = [float(v) for v in range(1, 21)]  # n = 20: ranks 6 and 15 (95.9 % coverage)
    assert median_interval(values) == (10.5, 6.0, 15.0)
    values = [float(v) for v in range(1, 31)]  # n = 30: ranks 10 and 21
    assert median_interval(values)[1:] == (10.0, 21.0)
    # Five values cannot reach 95 % (the range covers 93.75 %): the range is returned.
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)


def test_the_interval_covers_the_true_median_about_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, hits = 2000, 0
    for _ in range(trials):
        sample = [rng.lognormvariate(0.0, 0.3) for _ in range(20)]
        _, low, high = median_interval(sample)
        hits += low <= 1.0 <= high  # the lognormal's median is exp(0) = 1
    assert 0.94 <= hits / trials <= 0.98  # 95.9 % by construction at n = 20


def test_turns_run_in_a_seeded_random_order_that_favours_no_place() -> None:
    names = variants([0, 4], null=True)
    assert names == [BASE, NULL, "k = 0", "k = 4"]
    assert variants([0], null=False) == [BASE, "k = 0"]
    orders = [turn_order(a, names) for a in range(400)]
    assert orders[:5] == [turn_order(a, names) for a in range(5)]  # seeded: the same again
    assert all(sorted(o) == sorted(names) for o in orders)
    for name in names:  # each place about a quarter of the time
        for place in range(4):
            share = sum(o[place] == name for o in orders) / len(orders)
            assert 0.18 <= share <= 0.32, (name, place, share)


def test_child_processes_and_their_cpu_are_read_from_proc() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)",
        ]
    )
    try:
        assert child.pid in descendants(os.getpid())
        deadline = time.monotonic() + 20
        while cpu_seconds({child.pid}) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.25 <= cpu_seconds({child.pid}) < 5.0
    finally:
        child.kill()
        child.wait()
    assert cpu_seconds({child.pid}) == 0.0  # gone: nothing to read


def test_ratios_pair_each_alternations_turns() -> None:
    cells = {
        (4, BASE): Cell([Turn(0.020, 0.010, 0.004), Turn(0.030, 0.020, 0.004)]),
        (4, "k = 0"): Cell([Turn(0.021, 0.011, 0.004), Turn(0.030, 0.019, 0.005)]),
    }
    (row,) = summarise(cells, [4], [BASE, "k = 0"])
    assert row["variant"] == "k = 0"
    assert row["alternations"] == 2
    assert row["tpot"]["ratio"] == round((1.1 + 0.95) / 2, 4)
    assert row["ttft"]["ratio"] == round((1.05 + 1.0) / 2, 4)
    assert row["cpu_per_token"]["ci95"] == [1.0, 1.25]
    assert row["tpot"]["a_ms"] == 15.0
    assert row["tpot"]["b_ms"] == 15.0
