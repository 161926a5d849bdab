"""Predicted acceptance of each draft from its confidence: vLLM 0.33's online logistic fit.

A pure-Python transcription of `OnlineAcceptanceEstimator`
(`vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`, vLLM PR 52228) for the
engine's scheduler and the twin. The feature of draft position k is the draft
distribution's log-odds f = logit(max q), clamped to +-40 (`_predict_kernel`), and

    p = sigmoid(w f + beta_k)        one slope w, one intercept per position

cold-started at w = 0.5, beta_k = -0.2 (`_INIT_SLOPE`, `_INIT_BIAS`). Each step
grades the previous step's drafts (`_accumulate_kernel`): the accepted ones (label
1) and the first rejected one (label 0) are observed, each with IRLS weight
p (1 - p) on the prediction made when it was drafted, into the normal equations
of the design row [f, e_k]. Every `REFIT_INTERVAL` steps one damped Newton step
solves the arrowhead system (X'WX + lambda I) dtheta = X'(y - p) (`_refit_kernel`):

    dw      = (g0 - sum_k b_k g1_k / c_k) / (a - sum_k b_k^2 / c_k),  c_k += lambda, a += lambda
    dw     *= N / (N + D)             (N the round's observations; kept only if w + dw >= 0)
    dbeta_k = (g1_k - b_k dw) / c_k * n_k / (n_k + D)

with lambda = 1e-3 and D = 50 observations; the round's statistics then clear.

vLLM keeps one estimator per worker, pooled over every request (vLLM issue 57533:
one kind of traffic skews another's predictions); the gateway keeps one per class
(`ClassEstimators`). Arithmetic is in float64 here, float32 in vLLM's kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: `_MAX_LOG_ODDS`: the feature's clamp.
MAX_LOG_ODDS = 40.0
#: `_INIT_SLOPE`, `_INIT_BIAS`: vLLM's cold-start coefficients.
INIT_SLOPE = 0.5
INIT_BIAS = -0.2
#: `REFIT_INTERVAL`: steps between refits.
REFIT_INTERVAL = 100
#: `DAMPING_OBSERVATIONS`: a round with this many observations moves a parameter half a step.
DAMPING_OBSERVATIONS = 50.0
#: `L2`: ridge on the Newton solve.
L2 = 1e-3


def clamp_feature(feature: float) -> float:
    return min(max(feature, -MAX_LOG_ODDS), MAX_LOG_ODDS)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


class AcceptanceEstimator:
    """One online logistic fit of acceptance on the draft's log-odds (module docstring)."""

    __slots__ = ("_a", "_b", "_c", "_g0", "_g1", "_n", "_steps", "intercepts", "refits", "slope")

    def __init__(self, positions: int) -> None:
        self.slope = INIT_SLOPE
        self.intercepts = [INIT_BIAS] * positions
        self.refits = 0
        self._steps = 0
        self._clear()

    def _clear(self) -> None:
        k = len(self.intercepts)
        self._a = [0.0] * k
        self._b = [0.0] * k
        self._c = [0.0] * k
        self._g0 = [0.0] * k
        self._g1 = [0.0] * k
        self._n = [0.0] * k

    def predict(self, features: Sequence[float]) -> list[float]:
        """Conditional acceptance of positions 0..len(features)-1 (`_predict_kernel`)."""
        w, bias = self.slope, self.intercepts
        out = []
        for k, f in enumerate(features):
            if f > MAX_LOG_ODDS:
                f = MAX_LOG_ODDS
            elif f < -MAX_LOG_ODDS:
                f = -MAX_LOG_ODDS
            out.append(_sigmoid(w * f + bias[k]))
        return out

    def observe(
        self, features: Sequence[float], predictions: Sequence[float], accepted: int, admitted: int
    ) -> None:
        """Fold one request's graded drafts into the round (`_accumulate_kernel`):
        positions k <= accepted with k < admitted, labelled k < accepted."""
        a, b, c, g0, g1, n = self._a, self._b, self._c, self._g0, self._g1, self._n
        for k in range(min(accepted + 1, admitted)):
            f = features[k]
            if f > MAX_LOG_ODDS:
                f = MAX_LOG_ODDS
            elif f < -MAX_LOG_ODDS:
                f = -MAX_LOG_ODDS
            p = predictions[k]
            w = p * (1.0 - p)
            resid = (1.0 if k < accepted else 0.0) - p
            a[k] += w * f * f
            b[k] += w * f
            c[k] += w
            g0[k] += resid * f
            g1[k] += resid
            n[k] += 1.0

    def end_step(self) -> None:
        """One engine step done; every `REFIT_INTERVAL`-th refits (`step`)."""
        self._steps += 1
        if self._steps < REFIT_INTERVAL:
            return
        self._steps = 0
        self._refit()
        self.refits += 1

    def _refit(self) -> None:
        """One damped Newton step on the arrowhead system (`_refit_kernel`)."""
        c = [ck + L2 for ck in self._c]
        b, g1, n = self._b, self._g1, self._n
        a = sum(self._a) + L2
        shrink = sum(bk * bk / ck for bk, ck in zip(b, c, strict=True))
        coupling = sum(bk * gk / ck for bk, gk, ck in zip(b, g1, c, strict=True))
        denominator = a - shrink
        step_w = (sum(self._g0) - coupling) / denominator if denominator != 0 else math.nan
        total = sum(n)
        step_w *= total / (total + DAMPING_OBSERVATIONS)
        if math.isnan(step_w) or self.slope + step_w < 0.0:
            step_w = 0.0
        self.slope += step_w
        for k, ck in enumerate(c):
            step_bias = (g1[k] - b[k] * step_w) / ck * (n[k] / (n[k] + DAMPING_OBSERVATIONS))
            if not math.isnan(step_bias):
                self.intercepts[k] += step_bias
        self._clear()


class ClassEstimators:
    """One estimator per request class (the gateway's answer to vLLM issue 57533), or
    one shared by every class (`pooled`: vLLM as shipped); `end_step` steps them all."""

    __slots__ = ("_by_class", "_positions", "pooled")

    def __init__(self, positions: int, pooled: bool) -> None:
        self._positions = positions
        self.pooled = pooled
        self._by_class: dict[object, AcceptanceEstimator] = {}

    def of(self, class_key: object) -> AcceptanceEstimator:
        key = None if self.pooled else class_key
        found = self._by_class.get(key)
        if found is None:
            found = self._by_class[key] = AcceptanceEstimator(self._positions)
        return found

    @property
    def count(self) -> int:
        return len(self._by_class)

    def end_step(self) -> None:
        for estimator in self._by_class.values():
            estimator.end_step()
