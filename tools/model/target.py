"""The target: a deep, narrow Llama trained from scratch with transformers on CPU.

Deep and narrow on purpose: on CPU each layer's fixed cost dominates a small
model's forward pass, so a one-layer drafter is cheap only next to a target with
many layers (see DESIGN.md's cost table). Training packs the token stream into
fixed-length rows, uses AdamW with warm-up and cosine decay, and bf16 autocast
(the CPU has AMX/AVX-512 bf16), with fixed seeds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class TargetShape:
    layers: int = 16
    hidden: int = 192
    heads: int = 3
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 512
    max_positions: int = 2048


@dataclass(frozen=True, slots=True)
class TrainBudget:
    """Optimiser settings and how long to train (whichever of steps/seconds ends first)."""

    steps: int = 1200
    max_seconds: float = 2100.0
    batch: int = 8
    seq_len: int = 512
    lr: float = 3e-3
    warmup: int = 40
    weight_decay: float = 0.01
    seed: int = 1234

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_target(shape: TargetShape, vocab_size: int, eos_id: int, pad_id: int, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)  # type: ignore[no-untyped-call]


def pack(token_docs: list[list[int]], seq_len: int) -> torch.Tensor:
    """Concatenate documents and cut into rows of `seq_len` (the tail is dropped)."""
    flat = [t for doc in token_docs for t in doc]
    rows = len(flat) // seq_len
    if rows == 0:
        raise ValueError(f"only {len(flat)} training tokens; need at least {seq_len}")
    return torch.tensor(flat[: rows * seq_len], dtype=torch.long).view(rows, seq_len)


def lr_at(step: int, budget: Any, total: int, elapsed: float = 0.0) -> float:
    """Linear warm-up, then cosine to 10 % over whichever of steps or seconds runs out first."""
    if step < budget.warmup:
        return float(budget.lr * (step + 1) / budget.warmup)
    frac = max((step - budget.warmup) / max(1, total - budget.warmup), elapsed / budget.max_seconds)
    return float(budget.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))))


def batches(data: torch.Tensor, batch: int, seed: int) -> Any:
    """Endless epochs over the rows, reshuffled by a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(data.shape[0], generator=gen)
        for i in range(0, len(order) - batch + 1, batch):
            yield data[order[i : i + batch]]


def train_target(
    model: Any,
    data: torch.Tensor,
    budget: TrainBudget,
    progress: Callable[[int, float], None] | None = None,
) -> dict[str, float]:
    """Train in place; returns final (smoothed) loss, steps and seconds."""
    torch.manual_seed(budget.seed)
    opt = torch.optim.AdamW(
        model.parameters(), lr=budget.lr, betas=(0.9, 0.95), weight_decay=budget.weight_decay
    )
    model.train()
    start, ema, step = time.monotonic(), float("nan"), 0
    for step, rows in enumerate(batches(data, budget.batch, budget.seed), start=1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step - 1, budget, budget.steps, time.monotonic() - start)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=rows, labels=rows).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = float(loss.detach())
        ema = value if math.isnan(ema) else 0.95 * ema + 0.05 * value
        if progress:
            progress(step, ema)
        if step >= budget.steps or time.monotonic() - start > budget.max_seconds:
            break
    model.eval()
    return {"final_loss": ema, "steps": step, "seconds": time.monotonic() - start}
