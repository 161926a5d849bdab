"""The value objects of the decision path: load, ops overrides, the decision.

`ControlOverrides` is what the ops flags say for one class (`gateway.planner`
fills it from `gateway.flags.FlagValues`); `None` means "no flags", i.e. adaptive with
the settings' exploration share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

ControlMode = Literal["adaptive", "static", "shadow"]


class LoadSnapshot(NamedTuple):
    """Load at decision time. `running` excludes the request being decided.

    A NamedTuple, not a frozen dataclass: one is built per request, and a frozen
    dataclass's __init__ costs about a microsecond more of the decision path's 20 us
    (`bench/decision_latency.py`).
    """

    running: int = 0
    queued: int = 0
    #: The largest k in a finished request's batch, averaged over its life
    #: (`BatchLoad`); None at decision time, and where no one tracks it (the cost
    #: model then uses the request's own k).
    depth: float | None = None
    #: The requests in flight (this one excluded): their summed expected tokens per
    #: step were the batch to run at depth D = 0, 1, ... (`BatchLoad.gains`); None
    #: where no one tracks the batch.
    mates: Sequence[float] | None = None
    #: Prompt tokens that entered the engine during a finished request's life
    #: (`BatchMeans.prefill`); None at decision time and where no one tracks it.
    prefill: int | None = None
    #: The requests in flight whose class has a `batch_floor`: (their gains per
    #: batch depth at their own k, the floor) -> how many (`BatchLoad.guarded`); None
    #: or empty: none.
    guarded: Mapping[tuple[tuple[float, ...], float], int] | None = None
    #: The largest k among the requests in flight at decision time (`BatchLoad.deepest`);
    #: 0 where no one tracks the batch.
    deepest: int = 0
    #: The largest depth a request in flight chose for its class, riders not counted
    #: (`BatchLoad.anchored`); 0 where no one tracks the batch.
    anchored: int = 0
    #: Requests in flight whose k an operator set (`SpeculationDecision.fixed`): while
    #: any is, no newcomer lowers the batch for the batch's sake (`BatchLoad.fixed`).
    fixed: int = 0

    @property
    def batch(self) -> int:
        """The batch this request will join: the running requests plus itself."""
        return max(1, self.running + 1)


@dataclass(frozen=True, slots=True)
class ControlOverrides:
    """Ops flags resolved for one class (kill switch, mode, pin, bounds, exploration)."""

    enabled: bool = True
    mode: ControlMode = "adaptive"
    #: Fixed k for this class (0 = no speculation); wins over the bounds.
    pin_k: int | None = None
    k_min: int = 0
    k_max: int = 64
    #: None = the controller's configured share.
    exploration_share: float | None = None
    #: A request whose class chose less than the batch's depth runs at that depth
    #: (it pays for it anyway); False: at its class's k.
    batch_ride: bool = True
    #: A request entering a batch deeper than it runs lowers the requests in flight to
    #: the depth where the batch's tokens per unit of step cost are highest (False:
    #: they keep their depth until they finish); ignored where `batch_floor` is set.
    batch_lower: bool = True
    #: This class's requests in flight may not be slowed below this share of their
    #: speed at k = 0 by a deeper request joining their batch (0 = off).
    batch_floor: float = 0.0


NO_OVERRIDES = ControlOverrides()


@dataclass(frozen=True, slots=True)
class SpeculationDecision:
    """The k for one request and why; passed back to `Controller.observe`."""

    k: int
    reason: str
    explored: bool
    class_id: str
    label: str
    #: The batch bucket the decision was made for (load awareness).
    bucket: int = 1
    #: In shadow mode: what the adaptive policy would have chosen.
    shadow_k: int | None = None
    #: Expected tokens per step of this request were its batch to run at depth D = 0..K:
    #: E[tokens | min(k the class chose, D)] (empty: one token per step at any depth).
    gains: tuple[float, ...] = ()
    #: Lower the requests already in flight to at most this depth as this one enters
    #: (its class's `batch_floor` cannot afford the batch's depth); None: leave them.
    batch_cap: int | None = None
    #: Where the request rides deeper than its class chose (`BatchLoad.anchored`): the
    #: depth its class chose, which is what it anchors in the batch; None: k.
    anchor: int | None = None
    #: Its k is an operator's (a pin, static or shadow mode): no newcomer lowers it
    #: for the batch's sake (`batch_lower`).
    fixed: bool = False
