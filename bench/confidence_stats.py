"""Draft confidence against acceptance: the labels, reliability bins, AUC and logistic fits.

Input: the engine's graded drafts (`engine.vllm.draft_confidence.VerifiedDrafts`), one
per request and verify step: the drafter's log-odds f_j of each drafted position j
(0 = the first draft), how many drafts were verified and how many accepted.

Two labels (the hook's docstring):

* conditional acceptance at j, given drafts 0..j-1 accepted: observed where
  j <= accepted and j < verified, label j < accepted. vLLM 0.33's acceptance estimator
  fits exactly this (`acceptance_estimator._accumulate_kernel`: the accepted drafts and
  the first rejected one are observed), with the link

      P(accept_j | f_j) = sigmoid(slope * f_j + bias_j);

* survival to j (draft j accepted): every verified j, label j < accepted, scored by the
  running product prod_{i <= j} q_i with q_i = sigmoid(f_i), the drafter's own
  probability of its drafted token (what 0.33 ranks slots by, with fitted q's instead).

Statistics: reliability in equal-width bins of q (count, mean q, observed rate, Wilson
95 % interval); AUC as the Mann-Whitney probability that an accepted draft scores above a
rejected one (ties count one half); its bi-normal equivalent d' = sqrt(2) * Phi^-1(AUC)
(Green and Swets 1966: two unit-variance normals d' apart have that AUC); the logistic
fit by Newton-IRLS with a small ridge, as vLLM 0.33 refits it (`_refit_kernel`, L2 1e-3).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from engine.vllm.draft_confidence import VerifiedDrafts

#: Reliability bins over q in [0, 1].
BINS = 10
#: vLLM 0.33's ridge on the Newton solve (`OnlineAcceptanceEstimator.L2`).
RIDGE = 1e-3
#: Newton steps; a two-parameter logistic converges in well under this.
NEWTON_STEPS = 50
#: z for a two-sided 95 % interval.
Z95 = 1.959964


def sigmoid(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-x))
    return out


@dataclass(frozen=True, slots=True)
class Labelled:
    """Observations of one label: feature (or score), draft position, outcome."""

    score: np.ndarray
    position: np.ndarray
    label: np.ndarray

    def at(self, position: int) -> Labelled:
        keep = self.position == position
        return Labelled(self.score[keep], self.position[keep], self.label[keep])

    def __len__(self) -> int:
        return int(self.label.size)


def conditional(records: Iterable[VerifiedDrafts]) -> Labelled:
    """Conditional acceptance: (f_j, j, accepted) for j <= accepted, j < verified."""
    f: list[float] = []
    pos: list[int] = []
    lab: list[bool] = []
    for r in records:
        for j in range(min(r.verified, r.accepted + 1, len(r.log_odds))):
            f.append(r.log_odds[j])
            pos.append(j)
            lab.append(j < r.accepted)
    return _labelled(f, pos, lab)


def survival(records: Iterable[VerifiedDrafts]) -> Labelled:
    """Survival: (prod_{i <= j} q_i, j, survived) for every verified j."""
    s: list[float] = []
    pos: list[int] = []
    lab: list[bool] = []
    for r in records:
        q = sigmoid(np.asarray(r.log_odds[: r.verified], dtype=np.float64))
        for j, p in enumerate(np.cumprod(q)):
            s.append(float(p))
            pos.append(j)
            lab.append(j < r.accepted)
    return _labelled(s, pos, lab)


def _labelled(score: list[float], pos: list[int], lab: list[bool]) -> Labelled:
    return Labelled(
        np.asarray(score, dtype=np.float64),
        np.asarray(pos, dtype=np.int64),
        np.asarray(lab, dtype=bool),
    )


def auc(score: np.ndarray, label: np.ndarray) -> float | None:
    """P(score of an accepted > score of a rejected), ties one half; None without both."""
    positives = int(label.sum())
    negatives = int(label.size) - positives
    if positives == 0 or negatives == 0:
        return None
    ranks = _midranks(score)
    return float((ranks[label].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing their mean rank."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(x.size, dtype=np.float64)
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]
    for s, e in zip(starts, ends, strict=True):
        ranks[order[s:e]] = (s + 1 + e) / 2
    return ranks


def binormal_d(area: float | None) -> float | None:
    """d' of the equal-variance bi-normal model with this AUC."""
    if area is None:
        return None
    clipped = min(max(area, 1e-6), 1 - 1e-6)
    return math.sqrt(2.0) * NormalDist().inv_cdf(clipped)


def reliability(q: np.ndarray, label: np.ndarray, bins: int = BINS) -> list[dict[str, Any]]:
    """Equal-width bins of predicted q: count, mean q, observed rate and its Wilson 95 %
    interval (empty bins left out)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.clip(np.searchsorted(edges, q, side="right") - 1, 0, bins - 1)
    out = []
    for b in range(bins):
        keep = index == b
        n = int(keep.sum())
        if n == 0:
            continue
        hits = int(label[keep].sum())
        lo, hi = wilson(hits, n)
        out.append(
            {
                "lo": round(float(edges[b]), 3),
                "hi": round(float(edges[b + 1]), 3),
                "n": n,
                "predicted": round(float(q[keep].mean()), 4),
                "observed": round(hits / n, 4),
                "observed_95": [round(lo, 4), round(hi, 4)],
            }
        )
    return out


def wilson(hits: int, n: int) -> tuple[float, float]:
    """Wilson score interval for a binomial rate (Wilson 1927)."""
    p = hits / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def calibration_error(bins: Sequence[dict[str, Any]]) -> float | None:
    """Expected calibration error: sum over bins of n_b / n * |observed - predicted|."""
    total = sum(b["n"] for b in bins)
    if not total:
        return None
    return float(sum(b["n"] * abs(b["observed"] - b["predicted"]) for b in bins) / total)


def fit_logistic(design: np.ndarray, label: np.ndarray, ridge: float = RIDGE) -> np.ndarray:
    """Coefficients beta of P(y = 1) = sigmoid(design @ beta), by Newton-IRLS on the
    ridge-penalised log-likelihood, started at 0."""
    y = label.astype(np.float64)
    beta = np.zeros(design.shape[1])
    penalty = ridge * np.eye(design.shape[1])
    for _ in range(NEWTON_STEPS):
        p = sigmoid(design @ beta)
        w = p * (1 - p)
        hessian = design.T @ (design * w[:, None]) + penalty
        gradient = design.T @ (y - p) - ridge * beta
        step = np.linalg.solve(hessian, gradient)
        beta = beta + step
        if float(np.max(np.abs(step))) < 1e-9:
            break
    return beta


def position_fit(obs: Labelled) -> tuple[float, float] | None:
    """(slope, bias) of sigmoid(slope * f + bias) on one position's observations."""
    if len(obs) < 2:
        return None
    design = np.column_stack([obs.score, np.ones(len(obs))])
    slope, bias = fit_logistic(design, obs.label)
    return float(slope), float(bias)


def shared_fit(obs: Labelled, positions: int) -> tuple[float, list[float]] | None:
    """vLLM 0.33's form: one slope for every position, an intercept per position."""
    if len(obs) < 2:
        return None
    onehot = (obs.position[:, None] == np.arange(positions)[None, :]).astype(np.float64)
    beta = fit_logistic(np.column_stack([obs.score, onehot]), obs.label)
    return float(beta[0]), [float(b) for b in beta[1:]]


def moments(x: np.ndarray) -> tuple[float | None, float | None]:
    """(mean, standard deviation) of a sample, None where it has too few values."""
    if x.size == 0:
        return None, None
    sd = float(x.std(ddof=1)) if x.size > 1 else None
    return float(x.mean()), sd


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def position_row(j: int, cond: Labelled, surv: Labelled) -> dict[str, Any]:
    """One draft position's figures: conditional acceptance (count, rate, AUC, d', the
    logistic fit, the feature's moments by outcome, reliability) and survival (count,
    rate, AUC of the running product)."""
    fit = position_fit(cond)
    area = auc(cond.score, cond.label)
    acc_mean, acc_sd = moments(cond.score[cond.label])
    rej_mean, rej_sd = moments(cond.score[~cond.label])
    return {
        "position": j,
        "n": len(cond),
        "accepted": int(cond.label.sum()),
        "accept_rate": _r(float(cond.label.mean()) if len(cond) else None),
        "auc": _r(area),
        "binormal_d": _r(binormal_d(area)),
        "slope": _r(fit[0] if fit else None),
        "bias": _r(fit[1] if fit else None),
        "log_odds_accepted": {"mean": _r(acc_mean), "sd": _r(acc_sd)},
        "log_odds_rejected": {"mean": _r(rej_mean), "sd": _r(rej_sd)},
        "reliability": reliability(sigmoid(cond.score), cond.label),
        "survival_n": len(surv),
        "survival_rate": _r(float(surv.label.mean()) if len(surv) else None),
        "survival_auc": _r(auc(surv.score, surv.label)),
    }


def summarise(records: Sequence[VerifiedDrafts], positions: int) -> dict[str, Any]:
    """Every figure of one set of graded drafts (a family, or several pooled)."""
    cond = conditional(records)
    surv = survival(records)
    steps = len(records)
    accepted = sum(r.accepted for r in records)
    bins = reliability(sigmoid(cond.score), cond.label)
    area = auc(cond.score, cond.label)
    shared = shared_fit(cond, positions)
    return {
        "verify_steps": steps,
        "drafted": sum(len(r.log_odds) for r in records),
        "verified": sum(r.verified for r in records),
        "accepted": accepted,
        "acceptance_length": _r(1 + accepted / steps if steps else None, 3),
        "conditional": {
            "n": len(cond),
            "accept_rate": _r(float(cond.label.mean()) if len(cond) else None),
            "auc": _r(area),
            "binormal_d": _r(binormal_d(area)),
            "calibration_error": _r(calibration_error(bins)),
            "reliability": bins,
        },
        "survival": {"n": len(surv), "auc": _r(auc(surv.score, surv.label))},
        "shared_fit": {
            "slope": _r(shared[0]) if shared else None,
            "bias": [_r(b) for b in shared[1]] if shared else None,
        },
        "positions": [position_row(j, cond.at(j), surv.at(j)) for j in range(positions)],
    }


#: The calibration file's schema name (`calibration_entry`'s fields).
CALIBRATION_SCHEMA = "specgw.draft_calibration.v1"


def calibration_entry(summary: dict[str, Any]) -> dict[str, Any]:
    """What the twin reads for one class: per position the count, acceptance rate, AUC,
    d', logistic slope / bias and the feature's normal moments by outcome; the shared
    fit; the pooled AUCs."""
    keep = (
        "position",
        "n",
        "accept_rate",
        "auc",
        "binormal_d",
        "slope",
        "bias",
        "log_odds_accepted",
        "log_odds_rejected",
    )
    return {
        "acceptance_length": summary["acceptance_length"],
        "auc": summary["conditional"]["auc"],
        "binormal_d": summary["conditional"]["binormal_d"],
        "survival_auc": summary["survival"]["auc"],
        "shared_fit": summary["shared_fit"],
        "positions": [{k: row[k] for k in keep} for row in summary["positions"]],
    }
