"""The Page-Hinkley detectors of a class: alarms, excursions short of them, resets."""

from __future__ import annotations

import random

from gateway.control.drift import EXCURSION, DriftMonitor, PageHinkley


def learned(seed: int = 1, sd: float = 0.2, samples: int = 20) -> PageHinkley:
    """A detector (delta 0.5 sigma, lambda 5 sigma) past its noise-learning phase."""
    rng = random.Random(seed)
    detector = PageHinkley(0.5, 5.0, samples)
    for _ in range(samples):
        assert detector.update(rng.gauss(0.0, sd)) == 0
    return detector


def test_no_alarm_while_the_residuals_stay_noise() -> None:
    """The two-sided CUSUM at delta 0.5, lambda 5 runs about 465 samples in control on
    average: no alarm in 100 of them."""
    detector = learned()
    rng = random.Random(2)
    assert all(detector.update(rng.gauss(0.0, 0.2)) == 0 for _ in range(100))


def test_a_shift_of_two_sigma_alarms_within_a_handful_in_its_direction() -> None:
    up, down = learned(), learned()
    rng = random.Random(3)
    first_up = next(i for i in range(20) if up.update(0.4 + rng.gauss(0.0, 0.2)) == 1)
    first_down = next(i for i in range(20) if down.update(-0.4 + rng.gauss(0.0, 0.2)) == -1)
    assert first_up < 8
    assert first_down < 8


def test_one_surprising_residual_is_an_excursion_not_an_alarm() -> None:
    """One residual of 3 sigma lifts the upward sum by 2.5 sigma: past `EXCURSION`,
    short of the alarm; the monitor says `rising` until residuals at the estimate
    (each minus the tolerance) bring the sum back under it."""
    monitor = DriftMonitor(learned(), learned())
    sd = monitor.length.var**0.5
    assert not monitor.rising
    assert monitor.update(3.0 * sd, None) == 0
    assert monitor.rising
    assert EXCURSION <= monitor.length.up < monitor.length.threshold
    for _ in range(6):
        monitor.update(0.0, None)
    assert not monitor.rising


def test_a_downward_excursion_is_not_rising_and_an_alarm_resets_both_detectors() -> None:
    monitor = DriftMonitor(learned(), learned(seed=4))
    sd = monitor.first.var**0.5
    monitor.update(None, -3.0 * sd)
    assert monitor.statistic >= EXCURSION
    assert not monitor.rising
    direction = 0
    for _ in range(10):
        direction = monitor.update(None, -3.0 * sd)
        if direction:
            break
    assert direction == -1
    assert monitor.drifts == 1
    assert monitor.statistic == 0.0
    assert monitor.length.samples == monitor.first.samples == 0


def test_after_an_upward_alarm_it_rises_until_the_noise_is_learned_anew() -> None:
    """An alarm resets both detectors, which then learn the noise for `min_samples`
    residuals and cannot see the change going on: after an upward alarm the monitor
    says `rising` through that phase, after a downward one it does not."""
    monitor = DriftMonitor(learned(), learned(seed=5))
    sd = monitor.length.var**0.5
    direction = 0
    while not direction:
        direction = monitor.update(4.0 * sd, None)
    assert (direction, monitor.last) == (1, 1)
    assert monitor.rising
    for _ in range(monitor.length.min_samples):
        assert monitor.rising
        monitor.update(0.0, None)
    assert not monitor.rising
    while monitor.update(-4.0 * sd, None) != -1:
        pass
    assert monitor.last == -1
    assert not monitor.rising
