"""The EAGLE-3 draft head in plain torch, computing exactly what vLLM's drafter computes.

vLLM's `llama_eagle3.py` runs, per position: `fc` over the target's three aux
hidden states (each RMS-normed first when `fc_norm`), then one decoder layer
whose attention reads `[input_layernorm(embed(next token)), hidden_norm(h)]`
(2 x hidden wide), then the final norm; the next draft step is fed the normed
output when `norm_output` (EAGLE 3.1) and the pre-norm sum otherwise (EAGLE-3).
Training must match that forward, or the trained weights would mean something
else once loaded. Parameter names are the original EAGLE-3 layout (`midlayer.*`,
which vLLM maps to `layers.0.*`); embeddings are shared with the target.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, slots=True)
class DrafterShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    aux_layers: tuple[int, int, int]
    fc_norm: bool
    norm_output: bool
    rope_theta: float = 10000.0
    eps: float = 1e-6


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (Llama's), x: (B, heads, T, head_dim)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return (x * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


class Eagle3Drafter(nn.Module):
    """One EAGLE-3 decoder layer with `fc`, optional `fc_norm`, `norm` and its own LM head."""

    def __init__(self, s: DrafterShape) -> None:
        super().__init__()
        self.shape = s
        h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.fc_norm = nn.ModuleList([RMSNorm(h, s.eps) for _ in range(3)]) if s.fc_norm else None
        self.input_layernorm = RMSNorm(h, s.eps)
        self.hidden_norm = RMSNorm(h, s.eps)
        self.post_attention_layernorm = RMSNorm(h, s.eps)
        self.norm = RMSNorm(h, s.eps)
        self.q_proj = nn.Linear(2 * h, q, bias=False)
        self.k_proj = nn.Linear(2 * h, kv, bias=False)
        self.v_proj = nn.Linear(2 * h, kv, bias=False)
        self.o_proj = nn.Linear(q, h, bias=False)
        self.gate_proj = nn.Linear(h, s.intermediate, bias=False)
        self.up_proj = nn.Linear(h, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, h, bias=False)
        self.lm_head = nn.Linear(h, s.vocab, bias=False)

    def combine(self, aux: list[torch.Tensor]) -> torch.Tensor:
        """vLLM's `combine_hidden_states`: per-chunk RMSNorm (EAGLE 3.1), then `fc`."""
        if self.fc_norm is not None:
            aux = [norm(a) for norm, a in zip(self.fc_norm, aux, strict=True)]
        combined: torch.Tensor = self.fc(torch.cat(aux, -1))
        return combined

    def qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Layer input, residual and rotated q, k, v for one draft step."""
        s = self.shape
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        return hidden, rope(q, positions, s.rope_theta), rope(k, positions, s.rope_theta), v

    def finish(
        self, attn: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """After attention: MLP and final norm; returns (logits, hidden for the next step)."""
        b, _, t, _ = attn.shape
        residual = self.o_proj(attn.transpose(1, 2).reshape(b, t, -1)) + residual
        x = self.post_attention_layernorm(residual)
        out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        prenorm = out + residual
        normed = self.norm(prenorm)
        return self.lm_head(normed), (normed if self.shape.norm_output else prenorm)


def ttt_mask(t: int, step: int) -> torch.Tensor:
    """Which keys query position p may read at draft step `step` (training-time test).

    Keys are the concatenation over steps 0..step: step 0's keys up to p - step
    (the accepted context) and, from each later step i, only the key at
    p - step + i (the drafts made so far along this query's own chain).
    """
    pos = torch.arange(t)
    blocks = [pos[None, :] <= (pos[:, None] - step)]
    blocks += [pos[None, :] == (pos[:, None] - step + i) for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


def ttt_forward(
    model: Eagle3Drafter, embeds: torch.Tensor, aux: list[torch.Tensor], steps: int
) -> list[torch.Tensor]:
    """Logits of every draft step; step j's input hidden is step j-1's output shifted by one."""
    s = model.shape
    t = embeds.shape[1]
    positions = torch.arange(t)
    hidden = model.combine(aux)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits: list[torch.Tensor] = []
    rep = s.heads // s.kv_heads
    for step in range(steps):
        residual, q, k, v = model.qkv(embeds, hidden, positions)
        keys.append(k.repeat_interleave(rep, dim=1))
        values.append(v.repeat_interleave(rep, dim=1))
        attn = F.scaled_dot_product_attention(
            q, torch.cat(keys, 2), torch.cat(values, 2), attn_mask=ttt_mask(t, step)
        )
        out_logits, nxt = model.finish(attn, residual)
        logits.append(out_logits)
        hidden = torch.cat([torch.zeros_like(nxt[:, :1]), nxt[:, :-1]], dim=1)
    return logits


def save_drafter(model: Eagle3Drafter, out: Path, max_positions: int) -> None:
    """Write `model.safetensors` + `config.json` in the layout vLLM's `eagle3` method loads."""
    from safetensors.torch import save_file

    s = model.shape
    names = {
        "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
        "v_proj": "self_attn.v_proj", "o_proj": "self_attn.o_proj",
        "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "down_proj": "mlp.down_proj",
        "input_layernorm": "input_layernorm", "hidden_norm": "hidden_norm",
        "post_attention_layernorm": "post_attention_layernorm",
    }  # fmt: skip
    weights: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        mod = key.split(".")[0]
        name = f"midlayer.{names[mod]}.weight" if mod in names else key
        weights[name] = tensor.detach().to(torch.bfloat16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(drafter_config(s, max_positions), indent=2) + "\n")


def drafter_config(s: DrafterShape, max_positions: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": 1,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": s.eps,
        "vocab_size": s.vocab,
        "draft_vocab_size": s.vocab,
        "target_hidden_size": s.hidden,
        "max_position_embeddings": max_positions,
        "rope_theta": s.rope_theta,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "fc_norm": s.fc_norm,
        "norm_output": s.norm_output,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(s.aux_layers),
            "use_aux_hidden_state": True,
        },
    }
