"""The drafter's confidence per draft, drawn jointly with the acceptance draw.

vLLM 0.33's adaptive verification scores each draft by the log-odds of its draft
distribution's top token, f = logit(max q) (`engine.acceptance_estimator`). The twin
draws f per (request, output position, draft position) from the acceptance draw it
goes with (`bench.twin.requests`: draft d is accepted given its prefix when
u < p_d), on a bi-normal model:

    f | accepted ~ N(SPREAD d', SPREAD^2),   f | rejected ~ N(0, SPREAD^2),
    d' = sqrt(2) Phi^-1(AUC)

so that the ROC curve of f for telling the two apart has area AUC (the bi-normal
model's AUC = Phi(d' / sqrt 2)), and P(accepted | f) is exactly logistic in f with
slope d' / SPREAD: the family vLLM's estimator fits. SPREAD = 2 log-odds is an
assumption (about the spread of a drafter's top-token log-odds). A class's AUC is
`Workload.confidence_auc`; `scale` multiplies every d' (the sensitivity run:
0 no signal, below 1 weaker, above 1 stronger).

The draws come from their own stream keyed by (seed, request index), apart from the
acceptance draws, so every mode meets the same (confidence, accepted) pairs and the
modes that read no confidence keep their results.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

#: Standard deviation of the feature given the outcome, in log-odds (an assumption).
SPREAD = 2.0
#: The stream's key beside (seed, request index).
STREAM = 0xC0F1


def separation(auc: float, scale: float = 1.0) -> float:
    """d' of the bi-normal model with area `auc` under its ROC curve, times `scale`."""
    return math.sqrt(2.0) * NormalDist().inv_cdf(auc) * scale


def auc_of(separation_: float) -> float:
    """The area under the ROC curve of a bi-normal model of separation d'."""
    return NormalDist().cdf(separation_ / math.sqrt(2.0))


def draw_features(accepted: np.ndarray, d_prime: float, seed: int, index: int) -> np.ndarray:
    """float32 features of the shape of `accepted` (each draft's own acceptance given its
    prefix), from the stream (seed, index, STREAM)."""
    rng = np.random.default_rng([seed, index, STREAM])
    z = rng.standard_normal(accepted.shape)
    return (SPREAD * (z + d_prime * accepted)).astype(np.float32)
