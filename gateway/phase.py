"""The replica's phase: what it is doing now, for `/ready`, `/health`, `specgw_phase` and the log.

The port is bound before the engine exists (`gateway.server`), so an operator can watch a
start-up of minutes instead of a closed port::

    loading ──> calibrating ──> ready <──> restarting
       └─────────────────────────┴───────────┴──> draining

* `loading`: the engine (model weights, the engine core, the serving layer) and the
  control plane are being built.
* `calibrating`: the start-up calibration times the engine at every depth
  (`gateway.calibration`); `progress` counts its rounds done of the total.
* `ready`: the runtime serves (whether it is ready *now* is `/ready`'s engine detail).
* `restarting`: the supervisor replaces a dead engine core in process.
* `draining`: SIGTERM, a fatal engine or a start-up cut short; nothing leaves it.

One log line per transition (`phase loading -> calibrating after 41.2 s`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from gateway.errors import ErrorKind, GatewayError

log = logging.getLogger("specgw")


class Phase(enum.StrEnum):
    LOADING = "loading"
    CALIBRATING = "calibrating"
    READY = "ready"
    RESTARTING = "restarting"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Progress:
    """`done` of `total` units of the phase's work (`unit`: what is counted)."""

    done: int
    total: int
    unit: str

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "unit": self.unit}


#: Transitions kept for `PhaseBoard.history` (a replica changes phase a handful of times).
HISTORY = 32


class PhaseBoard:
    """The current phase, its progress and when it began, by `clock` (monotonic seconds).

    Every method runs on the event loop: the board is plain state, read at request and
    scrape time.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.phase = Phase.LOADING
        self.progress: Progress | None = None
        self.since = clock()
        self._announced = False
        #: (phase, entered at) for each transition, oldest first.
        self.history: deque[tuple[Phase, float]] = deque([(self.phase, self.since)], HISTORY)

    def begin(self, why: str = "") -> None:
        """A start-up begins (an app's lifespan entered again starts from `loading`)."""
        if self.phase is Phase.DRAINING:
            self.phase, self.progress, self._announced = Phase.LOADING, None, False
            self.since = self._clock()
            self.history.append((self.phase, self.since))
        self.enter(Phase.LOADING, why)

    def enter(self, phase: Phase, why: str = "") -> None:
        """Move to `phase` (once: re-entering the current one only announces it); nothing
        leaves `draining`."""
        if self.phase is Phase.DRAINING or (phase is self.phase and self._announced):
            return
        now = self._clock()
        if phase is self.phase:
            log.info("phase %s%s", phase, f": {why}" if why else "")
        else:
            log.info(
                "phase %s -> %s after %.1f s%s",
                self.phase,
                phase,
                now - self.since,
                f": {why}" if why else "",
            )
            self.phase, self.since, self.progress = phase, now, None
            self.history.append((phase, now))
        self._announced = True

    def advance(self, done: int, total: int, unit: str) -> None:
        """The current phase's progress (no log line: the phase's own work logs)."""
        self.progress = Progress(done, total, unit)

    def seconds_in_phase(self) -> float:
        return self._clock() - self.since

    def report(self) -> dict[str, Any]:
        """`/ready`'s and `/health`'s phase fields."""
        return {
            "phase": self.phase.value,
            "progress": None if self.progress is None else self.progress.to_dict(),
        }


#: `retry-after` of an OpenAI route's 503 while the replica is not ready.
RETRY_AFTER_S = 5

_WHAT = {
    Phase.LOADING: "the engine is loading",
    Phase.CALIBRATING: "the engine is being calibrated",
    Phase.READY: "the engine is not ready",
    Phase.RESTARTING: "the engine is restarting",
    Phase.DRAINING: "the replica is shutting down",
}


def not_ready(board: PhaseBoard) -> GatewayError:
    """The OpenAI routes' answer while the replica cannot serve (503 `not_ready`)."""
    done = board.progress
    so_far = f" ({done.done}/{done.total} {done.unit})" if done is not None else ""
    return GatewayError(
        ErrorKind.NOT_READY,
        f"Not ready: {_WHAT[board.phase]}{so_far}; retry later.",
        retry_after_s=RETRY_AFTER_S,
    )


#: The board of the start-up running in this context: the app's lifespan sets it around
#: the runtime factory, whose signature every backend and test implements, so that the
#: control plane it builds (`gateway.runtime`) reports the calibration without a new
#: parameter on each factory (a context variable, as the log's request id is).
_STARTING: ContextVar[PhaseBoard | None] = ContextVar("specgw_starting_phases", default=None)


@contextmanager
def starting(board: PhaseBoard) -> Iterator[PhaseBoard]:
    """Within: `start_up_board()` is `board`."""
    token = _STARTING.set(board)
    try:
        yield board
    finally:
        _STARTING.reset(token)


def start_up_board() -> PhaseBoard:
    """The board of the start-up in progress; a board of its own for a runtime built
    outside an app (a bench harness, a test of the factory alone)."""
    return _STARTING.get() or PhaseBoard()
