"""One acceptance estimator per request class, on the device: vLLM 0.33's fit, grouped.

vLLM 0.33's `OnlineAcceptanceEstimator`
(`vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`) predicts a draft's acceptance
as `p = sigmoid(w f + beta_k)` from its feature f = logit(max q) with one slope and one
intercept per position, refitted every `REFIT_INTERVAL` steps by one damped Newton step
on the IRLS normal equations (`engine.acceptance_estimator` states the arithmetic and is
its pure-Python transcription). vLLM keeps one such fit per worker, pooled over every
request (vLLM issue 57533). `ClassAcceptanceEstimators` keeps one per class group: a
`[groups]` slope, `[groups, K]` intercepts and `[groups, K]` round statistics, each
request's rows indexed by its slot's group. The arithmetic is the kernels', row for row
(`_accumulate_kernel`, `_refit_kernel`), in float32 torch ops on whatever device the
estimator it replaces lives on, without host synchronisation (a step's statistics are
summed by group in one matrix product; the refit solves every group's arrowhead system at once).
Deterministic, as the kernels are: every tensor-parallel rank fits alike, and so trims alike.

`ClassGroups` maps class ids (`SPEC_CLASS_ARG`, None for unclassified) to group indices:
group 0 is the unclassified requests' and the fold-over for classes past `capacity`;
a class gone from every live slot gives its group up to a newcomer, cold again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

#: Groups kept by default: the gateway's default class limit (`control.max_classes`, 64)
#: plus the unclassified group.
DEFAULT_GROUPS = 65


class ClassAcceptanceEstimators:
    """Per-group coefficients and IRLS round statistics (module docstring)."""

    def __init__(
        self,
        groups: int,
        positions: int,
        *,
        slope: float,
        intercepts: Iterable[float],
        refit_interval: int,
        damping: float,
        l2: float,
        device: torch.device | str = "cpu",
    ) -> None:
        bias = torch.tensor(list(intercepts), dtype=torch.float32, device=device)
        if bias.shape != (positions,):
            raise ValueError(f"{positions} intercepts expected, got {tuple(bias.shape)}")
        self.positions = positions
        self.refit_interval = refit_interval
        self.damping = damping
        self.l2 = l2
        self.refits = 0
        self._steps = 0
        self._cold = (float(slope), bias.clone())
        self.slope = torch.full((groups,), float(slope), dtype=torch.float32, device=device)
        self.intercepts = bias.repeat(groups, 1)
        #: Per group and position: [a_k, b_k, c_k] of X'WX and [g0_k, g1_k] of X'(y - p).
        self.info = torch.zeros(groups, positions, 3, dtype=torch.float32, device=device)
        self.grad = torch.zeros(groups, positions, 2, dtype=torch.float32, device=device)
        self.counts = torch.zeros(groups, positions, dtype=torch.float32, device=device)

    @property
    def groups(self) -> int:
        return int(self.slope.shape[0])

    def reset(self, group: int) -> None:
        """Back to the cold start (a group handed to a new class)."""
        self.slope[group] = self._cold[0]
        self.intercepts[group] = self._cold[1]
        self.info[group] = 0.0
        self.grad[group] = 0.0
        self.counts[group] = 0.0

    def predict(self, features: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
        """`sigmoid(w_g f + beta_{g,k})` for rows `[R, K]` of features, row r in group
        `groups[r]` (`_predict_kernel`'s last line; the features are already clamped)."""
        g = groups.long()
        logits = self.slope[g].unsqueeze(1) * features + self.intercepts[g, : features.shape[1]]
        return torch.sigmoid(logits)

    def accumulate(
        self,
        features: torch.Tensor,
        predictions: torch.Tensor,
        groups: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
    ) -> None:
        """Fold one step's graded drafts into their groups' round (`_accumulate_kernel`):
        per row, positions k <= accepted with k < admitted, labelled k < accepted, each
        with IRLS weight p (1 - p) on the prediction made when it was drafted."""
        accepted = (num_sampled.long() - 1).clamp_min(0).unsqueeze(1)
        admitted = accepted + num_rejected.long().unsqueeze(1)
        k = torch.arange(features.shape[1], device=features.device).unsqueeze(0)
        observed = (k <= accepted) & (k < admitted)
        label = (k < accepted).to(torch.float32)
        f = features.to(torch.float32)
        p = predictions.to(torch.float32)
        w = torch.where(observed, p * (1.0 - p), 0.0)
        resid = torch.where(observed, label - p, 0.0)
        rows = torch.stack((w * f * f, w * f, w, resid * f, resid, observed.to(w.dtype)), -1)
        # Summed per group by one product with the rows' one-hot groups, not `index_add_`:
        # atomics would add rows in a different order on each tensor-parallel rank, and the
        # ranks must fit alike (cuBLAS gives bit-identical results on the same GPU model).
        onehot = (
            groups.long().unsqueeze(0) == torch.arange(self.groups, device=rows.device)[:, None]
        )
        per_group = (onehot.to(rows.dtype) @ rows.flatten(1)).view(self.groups, -1, 6)
        self.info += per_group[..., 0:3]
        self.grad += per_group[..., 3:5]
        self.counts += per_group[..., 5]

    def end_step(self) -> bool:
        """One engine step done; every `refit_interval`-th refits every group (`step`).
        Whether this one refitted."""
        self._steps += 1
        if self._steps < self.refit_interval:
            return False
        self._steps = 0
        self._refit()
        self.refits += 1
        return True

    def _refit(self) -> None:
        """One damped Newton step per group on its arrowhead system (`_refit_kernel`)."""
        a_k, b, c = self.info.unbind(-1)
        c = c + self.l2
        a = a_k.sum(1) + self.l2
        g0 = self.grad[..., 0].sum(1)
        g1 = self.grad[..., 1]
        n = self.counts
        shrink = (b * b / c).sum(1)
        coupling = (b * g1 / c).sum(1)
        step_w = (g0 - coupling) / (a - shrink)
        total = n.sum(1)
        step_w = step_w * (total / (total + self.damping))
        keep = (step_w == step_w) & (self.slope + step_w >= 0.0)
        step_w = torch.where(keep, step_w, 0.0)
        self.slope += step_w
        step_bias = (g1 - b * step_w.unsqueeze(1)) / c * (n / (n + self.damping))
        self.intercepts += torch.where(step_bias == step_bias, step_bias, 0.0)
        self.info.zero_()
        self.grad.zero_()
        self.counts.zero_()

    def coefficients(self, group: int) -> tuple[float, list[float]]:
        """(slope, intercepts) of one group, read to the host (tests, logs)."""
        return float(self.slope[group]), [float(x) for x in self.intercepts[group]]


class ClassGroups:
    """Class id -> estimator group (module docstring)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("at least the unclassified group")
        self.capacity = capacity
        self._group: dict[str, int] = {}
        #: Classes folded into group 0 because every group was in use.
        self.folded = 0

    def group_of(
        self, class_id: Any, live: Callable[[], Iterable[int]] = tuple
    ) -> tuple[int, bool]:
        """(the class's group, whether that group must be reset first). `live`: the
        groups some running request still predicts with (only called when full)."""
        if not isinstance(class_id, str):
            return 0, False
        found = self._group.pop(class_id, None)
        if found is not None:
            self._group[class_id] = found  # most recently seen last: reuse takes the oldest
            return found, False
        taken = set(self._group.values())
        free = next((g for g in range(1, self.capacity) if g not in taken), None)
        if free is not None:
            self._group[class_id] = free
            return free, False
        busy = set(live())
        for old, group in list(self._group.items()):
            if group not in busy:
                del self._group[old]
                self._group[class_id] = group
                return group, True
        self.folded += 1
        return 0, False

    def known(self) -> dict[str, int]:
        return dict(self._group)


__all__ = ["DEFAULT_GROUPS", "ClassAcceptanceEstimators", "ClassGroups"]
