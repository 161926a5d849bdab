"""Settings of the speculation controller, read once by the composition root.

Every field has a default, bounds and a description (the `--help` text). The
environment is read only when `ControllerSettings()` is built, never at import;
variables are `SPECGW_CONTROL_<FIELD>`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.control.policies import POLICIES

#: The largest batch size start-up calibration may time (`calibrate_batches`).
MAX_CALIBRATE_BATCH = 256
#: `batch_floor = auto` where each request verifies its own depth: the `adaptive-floor`
#: mode of `make bench`, which kept every class nearer its speed without speculation and
#: gave more tokens/s than `adaptive` at c1, c4 and c16 on the embedded CPU engine.
AUTO_BATCH_FLOOR = 0.98


class ControllerSettings(BaseSettings):
    """Classification bounds, estimator windows, decision and drift parameters."""

    model_config = SettingsConfigDict(env_prefix="SPECGW_CONTROL_", extra="forbid", frozen=True)

    # ---- classes ----------------------------------------------------------------------
    max_classes: int = Field(
        64, ge=1, le=10_000, description="Most live classes; beyond it new ones fold into `other`."
    )
    class_idle_s: float = Field(
        300.0,
        ge=0,
        description="A live class idle this long may be evicted (LRU) to admit a new one.",
    )
    classify_cache_size: int = Field(
        4096, ge=16, le=1_000_000, description="Cached feature tuples -> class (hot-path cache)."
    )

    # ---- decision ---------------------------------------------------------------------
    max_k: int = Field(
        5, ge=0, le=16, description="K: the deepest speculation the policy may pick."
    )
    default_k: int = Field(
        3,
        ge=0,
        le=16,
        description="k of the `controller-mode: static` flag, and of a new class with no "
        "similar class where `cold_start` is `default`.",
    )
    step_rule: Literal["auto", "on", "off"] = Field(
        "auto",
        description="`on`: send each request's class acceptance and the step costs to the "
        "engine, whose scheduler then sets one depth per step for the whole batch (the "
        "step-depth rule, `engine.step_rule`): the most expected tokens per unit of step "
        "cost, no request slower than at depth 0; the request's k becomes a bound (K, or "
        "the flags' k_max; an operator's pin stays its depth). `auto`: on where the engine "
        "verifies one depth per step anyway (CUDA with FULL decode graphs, "
        "`Engine.one_depth_per_step`), off elsewhere. `python -m bench twin` compares it "
        "(`adaptive-step`) with per-request depths (`adaptive`).",
    )
    batch_floor: float | Literal["auto"] = Field(
        "auto",
        description="Default of the `batch-floor` flag where no flags file or override sets "
        "it: each class's requests in flight keep at least this share of their speed at "
        "k = 0 when a deeper request joins their batch (0 = off). `auto`: "
        f"{AUTO_BATCH_FLOOR} where each request verifies its own depth (the CPU engine), "
        "where a draft costs a large share of a step and a batch-mate's depth can leave a "
        "class far below no speculation; 0 where the engine verifies one depth per step "
        "(there the step rule guards the voters). `python -m bench twin` (`adaptive` "
        "against `adaptive-floor`) and `make bench` measure both.",
    )
    cold_start: Literal["prior", "default"] = Field(
        "default",
        description="k of a new class with no similar class: `prior` = the policy's best k "
        "at its load under the prior acceptance (`prior_accept`, `depth_decay`) and the "
        "measured costs; `default` = `default_k`.",
    )
    policy: str = Field(
        "goodput",
        description=f"Policy by name, one of `gateway.control.policies.POLICIES` "
        f"({', '.join(POLICIES)}). A fixed k is the `controller-mode: static` flag.",
    )
    policy_params: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="The policy's own parameters, by name (JSON in the environment); a "
        "parameter that is also a field here (`hysteresis`, ...) is read from the field "
        "unless given here. Checked against the policy's parameter model.",
    )
    min_samples: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Requests a class needs before the policy leaves cold start.",
    )
    hysteresis: float = Field(
        0.03,
        ge=0,
        le=1,
        description="Relative goodput gain a new k must show over the current k to replace it.",
    )
    min_dwell: int = Field(
        4, ge=0, le=10_000, description="Requests of a class between two changes of its k."
    )
    exploration_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of requests that probe k-1 or k+1 at batch 1; divided by the "
        "batch size above it (a probe deeper than its batch makes the whole batch draft).",
    )
    zero_probe_share: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Share of requests of a class at k=0 that probe k=1, so it can recover, "
        "while k=1 could still pay at the upper bound of its acceptance (else "
        "`exploration_share` at batch 1 and no probe under load); at batch 1, divided by "
        "the batch size above it. Also the share at which a class probes a deeper depth "
        "its estimate favours but its evidence does not yet carry past the hysteresis.",
    )
    watch_probe_scale: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Scale of the share at which a class at k=0 probes k=1 at batch 1 where "
        "k=1 cannot pay even at the upper bound of its acceptance: such probes only watch for "
        "a drift up, and each costs its request the draft (1: the class's full share).",
    )
    watch_probe_budget: float = Field(
        0.0025,
        ge=0,
        le=1,
        description="Share of its goodput a class at k=0 spends at batch 1 on probes that watch "
        "for a drift up where k=1 cannot pay: it probes at this budget over what a probe costs "
        "its request, at least `watch_probe_scale` x its share, at most `zero_probe_share` "
        "(0: `watch_probe_scale` alone).",
    )
    prior_output_tokens: float = Field(
        128.0,
        ge=1,
        description="Reply length assumed for a class until it has finished a request "
        "(speculation's first-token cost is spread over the reply).",
    )
    similar_min_score: int = Field(
        3, ge=1, le=6, description="Matching features a known class needs to seed a new one."
    )

    # ---- estimation -------------------------------------------------------------------
    ewma_alpha: float = Field(
        0.08,
        gt=0,
        le=1,
        description="Per-request forgetting of the depth-profile counts (window ~ 1/alpha).",
    )
    window: int = Field(
        64, ge=2, le=100_000, description="Sliding window of per-request acceptance lengths."
    )
    prior_strength: float = Field(
        4.0, gt=0, description="Pseudo-steps of the Beta prior on each depth position."
    )
    prior_accept: float = Field(
        0.7, gt=0, lt=1, description="Prior P(accept position 1) of a class with no evidence."
    )
    depth_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Prior of an unseen position d: the estimate at d-1 times this factor "
        "(1: as likely as d-1; measured chat acceptance rises with depth, and a prior that "
        "falls keeps a class at the shallow k it was first run at).",
    )
    merge_cap_steps: float = Field(
        2000.0, gt=0, description="Most verify steps one remote merge may add to the live counts."
    )

    # ---- cost model -------------------------------------------------------------------
    prior_step_s: float = Field(
        0.02, gt=0, description="Prior seconds of one decode step at k=0 (before measurements)."
    )
    prior_k_cost: float = Field(
        0.08,
        ge=0,
        description="Prior relative cost of one more drafted token per step at batch 1.",
    )
    prior_batch_saturation: float = Field(
        16.0,
        gt=0,
        description="Batch size at which the prior per-k cost has doubled (verification "
        "becomes compute bound as batch x (k+1) grows).",
    )
    cost_prior_weight: float = Field(
        2.0, gt=0, description="Pseudo-observations of the cost prior per batch bucket."
    )
    cost_min_samples: float = Field(
        3.0,
        ge=0,
        description="Step-time samples a depth needs at a load bucket before exploration "
        "stops preferring it (depths without them are probed first, k = 0 included).",
    )
    cost_probe_share: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Exploration share while some depth lacks `cost_min_samples` at the "
        "current load (a short calibration per load bucket; 0 exploration turns it off).",
    )
    calibrate_batches: list[int] | None = Field(
        None,
        description="Batch sizes at which the gateway measures the step time of every depth "
        "at start-up, before it is ready (its time is logged: `step costs calibrated in`; "
        "`[]` = off: the cost model starts from its prior). Unset: 1, 2, 4, 8, 16 on an "
        "engine that verifies each request's own depth (vLLM on the CPU, where larger "
        "batches add minutes to start-up); powers of two up to `max_running` on one that "
        "verifies one depth per step (vLLM on CUDA), whose traffic at a large batch runs "
        "only the step rule's depths and leaves depth 0, the divisor of every relative "
        "price, and the deeper ones to the fitted shape.",
    )
    # Enough verify steps at the deepest k to average over: a 16-token greedy request at
    # k = 4 ends in about four, too few for its mean, and calibration then priced a step
    # at k = 4 below one at k = 3; with 48 the calibrated costs rise with k (`/admin/costs`).
    calibrate_tokens: int = Field(
        48, ge=4, le=512, description="Tokens each start-up calibration request generates."
    )
    cost_forgetting: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="Per-request forgetting of cost-model statistics (engines that do not "
        "time their steps).",
    )
    cost_step_forgetting: float = Field(
        0.002,
        ge=0,
        lt=1,
        description="Per-step forgetting of the engine's timed steps at one depth and load "
        "bucket (a memory of about 1 / this many steps).",
    )

    # ---- drift ------------------------------------------------------------------------
    drift_delta: float = Field(
        0.5, ge=0, description="Page-Hinkley tolerance per request, in residual sigmas."
    )
    drift_threshold: float = Field(
        7.0, gt=0, description="Page-Hinkley alarm threshold, in residual sigmas."
    )
    drift_min_samples: int = Field(
        10, ge=1, description="Requests a class needs before its drift detector may alarm."
    )
    drift_keep: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Share of the live counts kept after a drift (the rest is forgotten).",
    )

    @model_validator(mode="after")
    def _check(self) -> ControllerSettings:
        if self.default_k > self.max_k:
            raise ValueError("default_k must be <= max_k")
        spec = POLICIES.get(self.policy)
        if spec is None:
            hint = " (a fixed k is the `controller-mode: static` flag)" * (self.policy == "static")
            raise ValueError(f"policy must be one of {', '.join(sorted(POLICIES))}{hint}")
        spec.parameters(self)
        if any(not 1 <= b <= MAX_CALIBRATE_BATCH for b in self.calibrate_batches or ()):
            raise ValueError(f"calibrate_batches must be batch sizes in 1..{MAX_CALIBRATE_BATCH}")
        if self.batch_floor != "auto" and not 0.0 <= self.batch_floor <= 1.0:
            raise ValueError("batch_floor must be `auto` or a share in 0..1")
        return self

    def batch_floor_for(self, one_depth_per_step: bool) -> float:
        """`batch_floor` resolved for an engine (`Engine.one_depth_per_step`)."""
        if self.batch_floor == "auto":
            return 0.0 if one_depth_per_step else AUTO_BATCH_FLOOR
        return float(self.batch_floor)
