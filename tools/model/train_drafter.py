"""Training both EAGLE-3 heads on the target's hidden states and greedy outputs.

`speculators` is not used: it expects a GPU training stack; this loop is the
EAGLE-3 recipe on CPU. Per batch the frozen target runs once (three aux hidden
states + its own argmax next tokens as labels, i.e. self-distillation that
matches greedy decoding); every drafter then trains with training-time test
over `ttt_steps` draft steps, each step reading its own previous output,
shifted by one position, with the loss averaged over steps. Both drafters see
the same batches, so the EAGLE 3.1 / EAGLE-3 comparison differs only in the
architecture flags.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tools.model.drafter import Eagle3Drafter, ttt_forward
from tools.model.target import batches, lr_at


@dataclass(frozen=True, slots=True)
class DrafterBudget:
    steps: int = 600
    max_seconds: float = 660.0
    batch: int = 8
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 20
    ttt_steps: int = 3
    seed: int = 4321

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class DrafterStats:
    """Smoothed loss and per-draft-step accuracy against the target's greedy tokens."""

    loss: float = float("nan")
    step_acc: list[float] | None = None

    def update(self, loss: float, accs: list[float]) -> None:
        if math.isnan(self.loss) or self.step_acc is None:
            self.loss, self.step_acc = loss, accs
            return
        self.loss = 0.95 * self.loss + 0.05 * loss
        self.step_acc = [0.95 * a + 0.05 * b for a, b in zip(self.step_acc, accs, strict=True)]

    def expected_length(self) -> float:
        """1 + sum of cumulative products of step accuracies: a rough acceptance length."""
        total, run = 1.0, 1.0
        for a in self.step_acc or []:
            run *= a
            total += run
        return total


def init_drafter(drafter: Eagle3Drafter, target: Any) -> None:
    """LM head from the target's (avoids a very high initial loss); small random rest."""
    with torch.no_grad():
        drafter.lm_head.weight.copy_(target.get_output_embeddings().weight)


def train_drafters(
    target: Any,
    drafters: dict[str, Eagle3Drafter],
    data: torch.Tensor,
    budget: DrafterBudget,
    progress: Callable[[int, dict[str, DrafterStats]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Train every drafter in place on the same batches; returns final stats per drafter."""
    torch.manual_seed(budget.seed)
    target.eval()
    aux_ids = next(iter(drafters.values())).shape.aux_layers
    opts = {
        n: torch.optim.AdamW(d.parameters(), lr=budget.lr, betas=(0.9, 0.95))
        for n, d in drafters.items()
    }
    stats = {n: DrafterStats() for n in drafters}
    embed = target.get_input_embeddings().weight.detach()
    start, step = time.monotonic(), 0
    for step, rows in enumerate(batches(data, budget.batch, budget.seed), start=1):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = target(input_ids=rows, output_hidden_states=True)
        labels = out.logits.argmax(-1)[:, 1:]
        aux = [out.hidden_states[i][:, :-1].float() for i in aux_ids]
        embeds = F.embedding(rows[:, 1:], embed).float()
        for name, drafter in drafters.items():
            for group in opts[name].param_groups:
                group["lr"] = lr_at(step - 1, budget, budget.steps, time.monotonic() - start)
            loss, accs = _ttt_loss(drafter, embeds, aux, labels, budget.ttt_steps)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            opts[name].step()
            stats[name].update(float(loss.detach()), accs)
        if progress:
            progress(step, stats)
        if step >= budget.steps or time.monotonic() - start > budget.max_seconds:
            break
    seconds = time.monotonic() - start
    return {
        n: {
            "final_loss": s.loss,
            "final_step_accuracy": s.step_acc,
            "train_expected_acceptance_length": s.expected_length(),
            "steps": step,
            "seconds": seconds,
        }
        for n, s in stats.items()
    }


def _ttt_loss(
    drafter: Eagle3Drafter,
    embeds: torch.Tensor,
    aux: list[torch.Tensor],
    labels: torch.Tensor,
    steps: int,
) -> tuple[torch.Tensor, list[float]]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = ttt_forward(drafter, embeds, aux, steps)
    losses, accs = [], []
    for j, lg in enumerate(logits):
        lg, lab = lg[:, j:].float(), labels[:, j:]
        losses.append(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab.reshape(-1)))
        accs.append(float((lg.argmax(-1) == lab).float().mean()))
    return torch.stack(losses).mean(), accs
