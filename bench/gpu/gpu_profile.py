"""Step-cost profile of EAGLE-3 speculative decoding on a GPU, for the engine twin.

    python bench/gpu/gpu_profile.py --out gpu_profile.json   # CUDA, about 1 to 2 minutes
    python bench/gpu/gpu_profile.py --tiny --out /tmp/p.json  # CPU, float32, seconds
    python bench/gpu/gpu_profile.py --moe --out moe.json      # Qwen3-30B-A3B shape (~70 GB)
    python bench/gpu/gpu_profile.py --mixed --batches 1,16,64 --out mixed.json  # newcomer steps

Needs only torch. The models are random bf16 weights in the shapes of Llama-3.1-8B (the target)
and of a one-layer EAGLE-3 head for it: these are the costs of the shapes, not of a trained
model, and acceptance is not measured here. With --moe the target is Qwen3-30B-A3B-shaped (48
layers, 128 experts of which 8 per token): its experts run as grouped GEMMs over the token-expert
pairs sorted by expert, so a step reads the weights of the experts its tokens chose, and
verifying k + 1 tokens per sequence touches more experts than decoding one; that is what makes
verification dear for MoE targets under load (vllm-project/recipes issue 923).

A step at batch B and depth k is what vLLM runs per decode step: the target verifies k + 1 new
tokens per sequence against a KV cache of C tokens, and for k > 0 the drafter runs once over the
k + 1 tokens (fc of the three captured target states, its layer, the 32k draft lm_head at the
last position) and then k - 1 times over one token (vLLM's EAGLE propose loop). k = 0 without a
drafter is plain decoding (`no_spec_step_ms`); the profile's k = 0 adds one drafter pass over one
token, which an engine that keeps the head running pays (+6.6 %, vLLM issue 49986).

Steps are captured in CUDA graphs, as vLLM runs decode, and timed with CUDA events: the median
and p10/p90 of --replays replays after the warm-ups. Attention is SDPA with an explicit mask over
a static cache; the 4 query heads that share a KV head are folded into the query length, so the
cache is read once per KV head, as decode kernels do, instead of being repeated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]
ATTENTION = "SDPA with an explicit mask, the query heads of each KV head folded into one"


@dataclass(frozen=True)
class Shape:
    """Model dimensions; the defaults are Llama-3.1-8B's and its EAGLE-3 head's."""

    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 128256
    draft_vocab: int = 32000
    context: int = 1024
    rope_theta: float = 500000.0
    eps: float = 1e-5
    #: experts per MoE layer (0: dense MLP), experts per token, and each expert's width; the
    #: drafter's layer stays dense at `intermediate`.
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0

    @property
    def aux_layers(self) -> tuple[int, ...]:
        """EAGLE-3 reads the target's hidden states at layers (2, L // 2, L - 3)."""
        picks = (2, self.layers // 2, self.layers - 3)
        return tuple(min(max(i, 0), self.layers - 1) for i in picks)


TINY = Shape(64, 2, 4, 2, 16, 128, 1000, 500, 32)
#: Qwen3-30B-A3B (its config.json; q/k norms left out) with a one-layer EAGLE-3 head whose dense
#: layer has the config's intermediate_size.
MOE = Shape(
    2048,
    48,
    32,
    4,
    128,
    6144,
    151936,
    32000,
    rope_theta=1000000.0,
    experts=128,
    top_k=8,
    moe_intermediate=768,
)
TINY_MOE = replace(TINY, experts=8, top_k=2, moe_intermediate=32)


@dataclass
class Layer:
    in_norm: Tensor
    qkv: Tensor
    o: Tensor
    post_norm: Tensor
    gate_up: Tensor  # [2I, H]; an MoE layer's experts: [E, 2I, H]
    down: Tensor  # [H, I]; [E, H, I]
    router: Tensor | None = None  # [E, H] in an MoE layer


@dataclass
class Drafter:
    fc: Tensor
    embed_norm: Tensor
    hidden_norm: Tensor
    layer: Layer
    norm: Tensor
    lm_head: Tensor
    d2t: Tensor


@dataclass
class Stat:
    median: float
    p10: float
    p90: float


@dataclass
class Results:
    steps: dict[int, dict[str, Stat]] = field(default_factory=dict)
    prefill: dict[int, dict[str, float]] = field(default_factory=dict)
    first_extra: dict[int, float] = field(default_factory=lambda: {0: 0.0})
    #: an MoE target's grouped experts against the per-expert loop: largest difference, and the
    #: largest output it was measured against
    moe_check: dict[str, float] = field(default_factory=dict)
    complete: bool = False


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def rope(x: Tensor, rot: Tensor) -> Tensor:
    """Rotate-half RoPE; x is [B, T, H, D], rot is [cos, sin] of shape [2, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * rot[0, :, None, :] + rotated * rot[1, :, None, :]


def rope_table(shape: Shape, length: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    inv = shape.rope_theta ** -(torch.arange(0, shape.head_dim, 2, device=device) / shape.head_dim)
    angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return torch.stack((angles.cos(), angles.sin())).to(dtype)


def fold_mask(groups: int, t: int, start: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Additive mask [groups * t, start + t] for t new tokens after `start` cached ones.

    Row g * t + i is new token i of query group g: it sees cache slots <= start + i. The storage
    row is padded to a multiple of 16 so that the memory-efficient kernel takes the mask as is.
    """
    length = start + t
    cols = torch.arange(-(-length // 16) * 16, device=device)
    rows = torch.arange(groups * t, device=device) % t
    hidden = cols[None, :] > start + rows[:, None]
    mask = torch.zeros(hidden.shape, device=device, dtype=dtype).masked_fill_(hidden, -torch.inf)
    return mask[:, :length]


def attend_cached(
    q: Tensor, k: Tensor, v: Tensor, cache: tuple[Tensor, Tensor], start: int, mask: Tensor
) -> Tensor:
    """Write the new K/V at `start` and attend over the cache: q [B, T, Hq, D] -> [B, T, Hq * D]."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    cache_k, cache_v = cache
    cache_k[:b, :, start : start + t].copy_(k.transpose(1, 2))
    cache_v[:b, :, start : start + t].copy_(v.transpose(1, 2))
    folded = q.view(b, t, hkv, hq // hkv, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, -1, d)
    out = F.scaled_dot_product_attention(
        folded, cache_k[:b, :, : start + t], cache_v[:b, :, : start + t], attn_mask=mask
    )
    return out.view(b, hkv, hq // hkv, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, hq * d)


def attend_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Prefill attention, causal over the prompt (flash SDPA on CUDA)."""
    b, t, hq, d = q.shape
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    try:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:  # torch < 2.5 has no enable_gqa
        groups = hq // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, t, hq * d)


def decoder_layer(
    layer: Layer, normed: Tensor, residual: Tensor, s: Shape, rot: Tensor, attend: Attend
) -> Tensor:
    """One Llama decoder layer whose attention reads `normed` (2H wide in the EAGLE-3 head)."""
    b, t, _ = normed.shape
    q_size, kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
    q, k, v = torch.split(F.linear(normed, layer.qkv), [q_size, kv_size, kv_size], dim=-1)
    q = rope(q.reshape(b, t, s.heads, s.head_dim), rot)
    k = rope(k.reshape(b, t, s.kv_heads, s.head_dim), rot)
    x = residual + F.linear(attend(q, k, v.reshape(b, t, s.kv_heads, s.head_dim)), layer.o)
    return feed_forward(layer, x, s)


def feed_forward(layer: Layer, x: Tensor, s: Shape) -> Tensor:
    """A layer's second half on x [..., H]: the post-attention norm and the MLP (or the
    experts), with its residual."""
    normed = rms_norm(x, layer.post_norm, s.eps)
    if layer.router is not None:
        return x + moe(normed.reshape(-1, x.shape[-1]), layer, s.top_k).view(x.shape)
    gate, up = F.linear(normed, layer.gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, layer.down)


#: A part of a flattened batch: (sequences, tokens each, RoPE rows, attention).
Part = tuple[int, int, Tensor, Attend]


def mixed_layer(layer: Layer, x: Tensor, s: Shape, parts: list[Part]) -> Tensor:
    """One target layer over the flattened tokens of several parts (decoding sequences, a
    prompt prefilling): each linear layer runs once over all rows, as vLLM's flattened
    batches do, attention part by part."""
    q_size, kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
    normed = rms_norm(x, layer.in_norm, s.eps)
    q, k, v = torch.split(F.linear(normed, layer.qkv), [q_size, kv_size, kv_size], dim=-1)
    outs, row = [], 0
    for b, t, rot, attend in parts:
        rows = slice(row, row + b * t)
        qp = rope(q[rows].reshape(b, t, s.heads, s.head_dim), rot)
        kp = rope(k[rows].reshape(b, t, s.kv_heads, s.head_dim), rot)
        vp = v[rows].reshape(b, t, s.kv_heads, s.head_dim)
        outs.append(attend(qp, kp, vp).reshape(b * t, -1))
        row += b * t
    return feed_forward(layer, x + F.linear(torch.cat(outs), layer.o), s)


def route(x: Tensor, router: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """Qwen3-MoE routing: softmax over the experts, the top k, renormalised (norm_topk_prob)."""
    weights, ids = F.linear(x, router).float().softmax(-1).topk(top_k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)).to(x.dtype), ids


def grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """Rows of `a` grouped by `offs` (cumulative ends) times the group's matrix of `b` [G, K, N]:
    torch's CUTLASS grouped GEMM on CUDA, an empty group reading nothing."""
    fn = getattr(F, "grouped_mm", None) or torch._grouped_mm
    return fn(a, b, offs=offs)


def moe(x: Tensor, layer: Layer, top_k: int) -> Tensor:
    """The experts of one MoE layer over x [N, H]: the N * top_k token-expert pairs sorted by
    expert, two grouped GEMMs (gate/up, down), weighted and summed back per token. Sort, gather
    and scatter keep static shapes, so the layer is captured in a CUDA graph like the rest."""
    assert layer.router is not None
    experts = layer.router.shape[0]
    weights, ids = route(x, layer.router, top_k)
    flat = ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.zeros(experts, device=x.device, dtype=torch.int32)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = counts.cumsum(0, dtype=torch.int32)
    tokens = order // top_k
    gate, up = grouped_mm(x[tokens], layer.gate_up.transpose(-2, -1), offs).chunk(2, dim=-1)
    out = grouped_mm(F.silu(gate) * up, layer.down.transpose(-2, -1), offs)
    out = out * weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add_(0, tokens, out)


def moe_reference(x: Tensor, layer: Layer, top_k: int) -> Tensor:
    """The same layer one expert at a time (the check that `moe` computes what it should)."""
    assert layer.router is not None
    weights, ids = route(x, layer.router, top_k)
    out = torch.zeros_like(x)
    for expert in range(layer.router.shape[0]):
        rows, slot = (ids == expert).nonzero(as_tuple=True)
        if rows.numel():
            gate, up = F.linear(x[rows], layer.gate_up[expert]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, layer.down[expert])
            out.index_add_(0, rows, y * weights[rows, slot, None])
    return out


class Twin:
    """The target, its EAGLE-3 head and their static KV caches (sized for the largest batch)."""

    def __init__(
        self, shape: Shape, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
    ) -> None:
        self.shape, self.device, self.dtype = shape, device, dtype
        h = shape.hidden
        self.embed = self._weight(shape.vocab, h)
        self.layers = [self._layer(h, shape.experts) for _ in range(shape.layers)]
        self.norm = torch.ones(h, device=self.device, dtype=dtype)
        self.lm_head = self._weight(shape.vocab, h)
        offsets = torch.randint(0, shape.vocab - shape.draft_vocab, (shape.draft_vocab,))
        self.drafter = Drafter(
            fc=self._weight(h, 3 * h),
            embed_norm=self.norm.clone(),
            hidden_norm=self.norm.clone(),
            layer=self._layer(2 * h),
            norm=self.norm.clone(),
            lm_head=self._weight(shape.draft_vocab, h),
            d2t=offsets.to(self.device),
        )
        slots, draft_slots = shape.context + args.max_k + 1, shape.context + 2 * args.max_k + 2
        self.caches = [self._cache(max(args.batches), slots) for _ in self.layers]
        self.draft_cache = self._cache(max(args.batches), draft_slots)
        self.rot = rope_table(shape, max(draft_slots, *args.prefill), self.device, dtype)

    def _weight(self, rows: int, cols: int, *lead: int) -> Tensor:
        """N(0, 0.02) drawn on the device itself: the 16 GB target never passes through the host."""
        return torch.randn(*lead, rows, cols, device=self.device, dtype=self.dtype).mul_(0.02)

    def _layer(self, attn_in: int, experts: int = 0) -> Layer:
        s = self.shape
        ones = torch.ones(s.hidden, device=self.device, dtype=self.dtype)
        attention = {
            "in_norm": ones,
            "qkv": self._weight((s.heads + 2 * s.kv_heads) * s.head_dim, attn_in),
            "o": self._weight(s.hidden, s.heads * s.head_dim),
            "post_norm": ones.clone(),
        }
        if not experts:
            gate_up = self._weight(2 * s.intermediate, s.hidden)
            return Layer(**attention, gate_up=gate_up, down=self._weight(s.hidden, s.intermediate))
        width = s.moe_intermediate
        return Layer(
            **attention,
            gate_up=self._weight(2 * width, s.hidden, experts),
            down=self._weight(s.hidden, width, experts),
            router=self._weight(experts, s.hidden),
        )

    def _cache(self, batch: int, slots: int) -> tuple[Tensor, Tensor]:
        size = (batch, self.shape.kv_heads, slots, self.shape.head_dim)
        new = partial(torch.zeros, size, device=self.device, dtype=self.dtype)
        return new(), new()

    def _cached(self, start: int, t: int, cache: tuple[Tensor, Tensor]) -> Attend:
        groups = self.shape.heads // self.shape.kv_heads
        mask = fold_mask(groups, t, start, self.device, self.dtype)
        return partial(attend_cached, cache=cache, start=start, mask=mask)

    def target(
        self, ids: Tensor, start: int, attends: list[Attend], all_logits: bool
    ) -> tuple[Tensor, Tensor]:
        """Greedy tokens and the three captured hidden states, concatenated (3H wide)."""
        s, t = self.shape, ids.shape[1]
        x = F.embedding(ids, self.embed)
        aux: list[Tensor] = []
        for index, (layer, attend) in enumerate(zip(self.layers, attends, strict=True)):
            aux.extend(x for a in s.aux_layers if a == index)
            normed = rms_norm(x, layer.in_norm, s.eps)
            x = decoder_layer(layer, normed, x, s, self.rot[:, start : start + t], attend)
        x = rms_norm(x if all_logits else x[:, -1:], self.norm, s.eps)
        return F.linear(x, self.lm_head).argmax(-1), torch.cat(aux, dim=-1)

    def draft(
        self, ids: Tensor, hidden: Tensor, start: int, attend: Attend, fuse: bool
    ) -> tuple[Tensor, Tensor]:
        """One EAGLE-3 pass (vLLM llama_eagle3): fc on the first pass only, the layer on
        [norm(embed), norm(hidden)], the draft lm_head at the last position mapped to target ids
        by d2t; returns the draft token and the pre-norm hidden state for the next pass."""
        s, d, t = self.shape, self.drafter, ids.shape[1]
        if fuse:
            hidden = F.linear(hidden, d.fc)
        embeds = rms_norm(F.embedding(ids, self.embed), d.embed_norm, s.eps)
        normed = torch.cat((embeds, rms_norm(hidden, d.hidden_norm, s.eps)), dim=-1)
        h = decoder_layer(d.layer, normed, hidden, s, self.rot[:, start : start + t], attend)
        index = F.linear(rms_norm(h[:, -1:], d.norm, s.eps), d.lm_head).argmax(-1)
        return index + d.d2t[index], h[:, -1:]

    def draft_chain(self, t: int, passes: int) -> Callable[[Tensor, Tensor], Tensor]:
        """The drafter's work in one step: a pass over t tokens, then passes - 1 over one."""
        c = self.shape.context
        starts = [c] + [c + t + j for j in range(passes - 1)]
        widths = [t] + [1] * (passes - 1)
        attends = [
            self._cached(a, w, self.draft_cache) for a, w in zip(starts, widths, strict=True)
        ]

        def run(ids: Tensor, aux: Tensor) -> Tensor:
            token, hidden = self.draft(ids, aux, starts[0], attends[0], fuse=True)
            for start, attend in zip(starts[1:], attends[1:], strict=True):
                token, hidden = self.draft(token, hidden, start, attend, fuse=False)
            return token

        return run

    def step(self, batch: int, k: int, head_at_k0: bool) -> Callable[[], Tensor]:
        """One decode/verify step at (batch, k), as a closure over static buffers."""
        t, c = k + 1, self.shape.context
        ids = torch.randint(0, self.shape.vocab, (batch, t), device=self.device)
        attends = [self._cached(c, t, cache) for cache in self.caches]
        passes = max(k, 1) if k > 0 or head_at_k0 else 0
        drafter = self.draft_chain(t, passes) if passes else None

        def run() -> Tensor:
            tokens, aux = self.target(ids, c, attends, all_logits=True)
            return tokens if drafter is None else drafter(tokens, aux)

        return run

    def mixed_step(self, batch: int, k: int, prompt: int) -> Callable[[], Tensor]:
        """The target's part of a step in which `batch` sequences verify k + 1 tokens each
        against the cache and one newcomer prefills `prompt` tokens (either may be 0), its
        logits at every decoding row and the prompt's last, as vLLM computes them."""
        s, t, c = self.shape, k + 1, self.shape.context
        ids: list[Tensor] = []
        parts: list[tuple[int, int, Tensor, list[Attend]]] = []
        if batch:
            ids.append(torch.randint(0, s.vocab, (batch * t,), device=self.device))
            attends = [self._cached(c, t, cache) for cache in self.caches]
            parts.append((batch, t, self.rot[:, c : c + t], attends))
        if prompt:
            ids.append(torch.randint(0, s.vocab, (prompt,), device=self.device))
            parts.append((1, prompt, self.rot[:, :prompt], [attend_causal] * s.layers))
        flat = torch.cat(ids)
        logit_rows = torch.tensor(
            list(range(batch * t)) + ([batch * t + prompt - 1] if prompt else []),
            device=self.device,
        )

        def run() -> Tensor:
            x = F.embedding(flat, self.embed)
            for index, layer in enumerate(self.layers):
                x = mixed_layer(layer, x, s, [(b, n, r, a[index]) for b, n, r, a in parts])
            return F.linear(rms_norm(x[logit_rows], self.norm, s.eps), self.lm_head).argmax(-1)

        return run


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class Clock:
    """Times steps: captured in a CUDA graph and timed by CUDA events on a GPU, as vLLM replays
    decode graphs; eager with perf_counter on the CPU, or on a GPU where capture fails."""

    def __init__(self, device: torch.device, graphs: bool, warmups: int, replays: int) -> None:
        self.device, self.graphs = device, graphs and device.type == "cuda"
        self.warmups, self.replays = warmups, replays
        self.started = time.monotonic()
        # One side stream for every warm-up: torch keeps a cuBLAS workspace per stream.
        self.side = torch.cuda.Stream() if self.graphs else None  # type: ignore[no-untyped-call]

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {message}", file=sys.stderr, flush=True)

    def measure(self, fn: Callable[[], Tensor], graph: bool = True, replays: int = 0) -> Stat:
        graph_or_none = self._capture(fn) if graph and self.graphs else None
        run = fn if graph_or_none is None else graph_or_none.replay
        times = self._times(run, replays or self.replays)
        return Stat(statistics.median(times), percentile(times, 0.1), percentile(times, 0.9))

    def _capture(self, fn: Callable[[], Tensor]) -> torch.cuda.CUDAGraph | None:
        """Warm up on a side stream, then capture (the order torch.cuda.graph documents)."""
        assert self.side is not None
        try:
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                for _ in range(self.warmups):
                    fn()
            torch.cuda.current_stream().wait_stream(self.side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return graph
        except RuntimeError as exc:
            self.log(f"CUDA graph capture failed, timing eagerly from here on: {exc}")
            self.graphs = False
            torch.cuda.synchronize()
            return None

    def _times(self, run: Callable[[], object], replays: int) -> list[float]:
        for _ in range(self.warmups):
            run()
        if self.device.type != "cuda":
            times = []
            for _ in range(replays):
                began = time.perf_counter()
                run()
                times.append((time.perf_counter() - began) * 1000.0)
            return times
        timed = partial(torch.cuda.Event, enable_timing=True)
        events = [(timed(), timed()) for _ in range(replays)]
        for begin, end in events:
            begin.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return [begin.elapsed_time(end) for begin, end in events]


def measure_prefill(twin: Twin, clock: Clock, length: int) -> dict[str, float]:
    """Eager batch-1 prefill of one prompt: the target (logits at the last token only, as vLLM
    computes them), then the drafter's pass over the same prompt (fc + layer + draft lm_head)."""
    ids = torch.randint(0, twin.shape.vocab, (1, length), device=twin.device)
    attends: list[Attend] = [attend_causal] * twin.shape.layers
    aux = twin.target(ids, 0, attends, all_logits=False)[1]
    replays = max(2, clock.replays // 4)
    target = clock.measure(lambda: twin.target(ids, 0, attends, False)[0], False, replays)
    drafter = clock.measure(lambda: twin.draft(ids, aux, 0, attend_causal, True)[0], False, replays)
    return {"target": target.median, "drafter": drafter.median}


def check_moe(twin: Twin, tokens: int = 256) -> dict[str, float]:
    """Layer 0's experts over random inputs, grouped and one expert at a time."""
    layer = twin.layers[0]
    x = torch.randn(tokens, twin.shape.hidden, device=twin.device, dtype=twin.dtype)
    grouped = moe(x, layer, twin.shape.top_k).float()
    reference = moe_reference(x, layer, twin.shape.top_k).float()
    return {
        "max_abs_error": float((grouped - reference).abs().max()),
        "max_abs_output": float(reference.abs().max()),
    }


def measure_first_drafts(twin: Twin, clock: Clock, k: int) -> float:
    """Drafts for the first verify step after prefill, batch 1: one drafter pass over the
    prompt's last token, then k - 1 single-token passes (graph-captured like a step)."""
    ids = torch.randint(0, twin.shape.vocab, (1, 1), device=twin.device)
    aux = torch.randn(1, 1, 3 * twin.shape.hidden, device=twin.device, dtype=twin.dtype)
    chain = twin.draft_chain(1, k)
    return clock.measure(lambda: chain(ids, aux)).median


def sweep_batch(
    twin: Twin, clock: Clock, batch: int, args: argparse.Namespace
) -> dict[str, Stat] | None:
    """Every variant at one batch size, or None when the deadline cuts the batch short."""
    variants = [("no_spec", 0, False), ("0", 0, True)]
    variants += [(str(k), k, True) for k in range(1, args.max_k + 1)]
    row: dict[str, Stat] = {}
    for name, k, head in variants:
        if clock.elapsed() > args.deadline_s:
            return None
        row[name] = stat = clock.measure(twin.step(batch, k, head))
        clock.log(f"batch {batch} {name}: {stat.median:.3f} ms [{stat.p10:.3f}, {stat.p90:.3f}]")
    return row


def measure_mixed(twin: Twin, clock: Clock, args: argparse.Namespace) -> list[dict[str, float]]:
    """Each (batch, k, prompt): the mixed step, the decode step alone and the prefill alone,
    the target only, each captured like a decode step. The twin prices a step with a
    newcomer as the sum of the last two (`bench/twin/engine.py`)."""
    rows: list[dict[str, float]] = []
    alone = {p: clock.measure(twin.mixed_step(0, 0, p)).median for p in args.prompts}
    for batch in args.batches:
        for k in args.ks:
            decode = clock.measure(twin.mixed_step(batch, k, 0)).median
            for prompt in args.prompts:
                if clock.elapsed() > args.deadline_s:
                    return rows
                mixed = clock.measure(twin.mixed_step(batch, k, prompt)).median
                total = decode + alone[prompt]
                rows.append(
                    {
                        "batch": batch,
                        "k": k,
                        "prompt": prompt,
                        "mixed_ms": ms(mixed),
                        "decode_ms": ms(decode),
                        "prefill_ms": ms(alone[prompt]),
                        "mixed_over_sum": round(mixed / total, 4),
                    }
                )
                clock.log(
                    f"batch {batch} k {k} prompt {prompt}: mixed {mixed:.3f} ms, decode "
                    f"{decode:.3f} + prefill {alone[prompt]:.3f} = {total:.3f} ms"
                )
    return rows


def ms(value: float) -> float:
    return round(value, 4)


def profile_json(
    args: argparse.Namespace, twin: Twin, graphs: bool, res: Results
) -> dict[str, object]:
    """The profile in the engine twin's format (vLLM dynamic-SD's `batch_stats` shape)."""
    shape, ks = twin.shape, [str(k) for k in range(args.max_k + 1)]
    device = torch.cuda.get_device_name() if twin.device.type == "cuda" else "cpu"
    model = "tiny test shape" if args.tiny else "Llama-3.1-8B shape"
    if shape.experts:
        model = ("tiny MoE test shape" if args.tiny else "Qwen3-30B-A3B shape") + (
            f" ({shape.experts} experts, {shape.top_k} per token, grouped GEMMs)"
        )
    dtype = "bf16" if twin.dtype == torch.bfloat16 else str(twin.dtype).removeprefix("torch.")
    longest = max(res.prefill, default=0)
    return {
        "name": args.name,
        "source": f"measured by bench/gpu/gpu_profile.py on {device}, torch {torch.__version__}, "
        f"random {dtype} weights, {model}, one-layer EAGLE-3 head, context {shape.context}, "
        f"CUDA graphs {'yes' if graphs else 'no'}",
        "device": device,
        "torch": torch.__version__,
        "complete": res.complete,
        "graphs": graphs,
        "max_k": args.max_k,
        "batch_stats": {str(b): {k: ms(row[k].median) for k in ks} for b, row in res.steps.items()},
        "no_spec_step_ms": {str(b): ms(row["no_spec"].median) for b, row in res.steps.items()},
        "spread": {
            str(b): {k: [ms(row[k].p10), ms(row[k].p90)] for k in ks}
            for b, row in res.steps.items()
        },
        "prefill_ms_per_token": {
            part: ms(v / longest) for part, v in res.prefill.get(longest, {}).items()
        },
        "prefill_ms": {
            str(n): {part: ms(v) for part, v in parts.items()} for n, parts in res.prefill.items()
        },
        "first_token_extra_ms": {str(k): ms(v) for k, v in res.first_extra.items()},
        **({"moe_check": res.moe_check} if res.moe_check else {}),
        "shape": asdict(shape)
        | {"aux_layers": list(shape.aux_layers), "dtype": dtype, "attention": ATTENTION},
    }


def profile(args: argparse.Namespace, twin: Twin, clock: Clock) -> None:
    """Prefill and first drafts first (seconds), then batch by batch; the JSON is rewritten
    after each part, so that a run cut short still leaves what it measured."""
    results = Results()

    def save() -> None:
        document = profile_json(args, twin, clock.graphs, results)
        partial_path = args.out.with_name(args.out.name + ".tmp")
        partial_path.write_text(json.dumps(document, indent=2) + "\n")
        partial_path.replace(args.out)

    if twin.shape.experts:
        results.moe_check = check_moe(twin)
        clock.log(f"grouped experts against the per-expert loop: {results.moe_check}")
    for length in args.prefill:
        results.prefill[length] = measure_prefill(twin, clock, length)
        clock.log(f"prefill {length}: {results.prefill[length]}")
    for k in range(1, args.max_k + 1):
        results.first_extra[k] = measure_first_drafts(twin, clock, k)
    clock.log(f"first-token extra ms: {results.first_extra}")
    save()
    for batch in args.batches:
        row = sweep_batch(twin, clock, batch, args)
        if row is None:
            clock.log(f"deadline {args.deadline_s} s reached during batch {batch}: incomplete")
            return
        results.steps[batch] = row
        save()
    results.complete = True
    save()
    clock.log(f"wrote {args.out}")


def int_list(text: str) -> list[int]:
    return [int(b) for b in text.split(",")]


OPTIONS: dict[str, tuple[Callable[[str], object], str, str, str]] = {
    # name: (type, default, default with --tiny, help)
    "context": (int, "1024", "32", "cached tokens per sequence"),
    "batches": (int_list, "1,2,4,8,16,32,64", "1,2", "batch sizes, comma-separated"),
    "prefill": (int_list, "512,2048", "64,256", "prompt lengths to prefill at batch 1"),
    "max_k": (int, "7", "3", "deepest speculation depth"),
    "replays": (int, "20", "2", "timed replays per step"),
    "warmups": (int, "3", "1", "untimed runs before the timed replays"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_profile.json"))
    parser.add_argument("--name", default="measured-llama8b-eagle3")
    for name, (kind, full, tiny, text) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=kind, help=f"{text} ({full}; with --tiny {tiny})")
    parser.add_argument(
        "--deadline-s", type=float, default=200.0, help="start no measurement after this (200)"
    )
    parser.add_argument("--eager", action="store_true", help="time eagerly, without CUDA graphs")
    parser.add_argument("--tiny", action="store_true", help="tiny float32 shape on the CPU")
    parser.add_argument("--moe", action="store_true", help="the Qwen3-30B-A3B-shaped MoE target")
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="instead of the profile: steps where a newcomer prefills beside the decoders",
    )
    parser.add_argument("--ks", type=int_list, default=[0, 3], help="depths with --mixed (0,3)")
    parser.add_argument(
        "--prompts", type=int_list, default=None, help="prompt lengths with --mixed (128,512,2048)"
    )
    args = parser.parse_args(argv)
    for name, (kind, full, tiny, _) in OPTIONS.items():
        if getattr(args, name) is None:
            setattr(args, name, kind(tiny if args.tiny else full))
    if args.prompts is None:
        args.prompts = [16, 64] if args.tiny else [128, 512, 2048]
    if args.mixed:
        args.prefill = [max(*args.prefill, *args.prompts)]  # sizes the RoPE table
    return args


def target_of(args: argparse.Namespace) -> tuple[Shape, torch.device, torch.dtype] | None:
    """The shape, device and dtype `--tiny` and `--moe` ask for (seeded); None without the
    CUDA device a full-size run needs."""
    if not args.tiny and not torch.cuda.is_available():
        print("needs a CUDA device (use --tiny on the CPU)", file=sys.stderr)
        return None
    dense, sparse = (TINY, TINY_MOE) if args.tiny else (Shape(), MOE)
    shape = replace(sparse if args.moe else dense, context=args.context)
    torch.manual_seed(0)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    return shape, torch.device("cpu" if args.tiny else "cuda"), dtype


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = target_of(args)
    if target is None:
        return 2
    shape, device, dtype = target
    with torch.inference_mode():
        clock = Clock(device, not args.eager, args.warmups, args.replays)
        twin = Twin(shape, args, device, dtype)
        clock.log(f"weights and KV caches allocated on {twin.device}")
        if args.mixed:
            rows = measure_mixed(twin, clock, args)
            source = profile_json(args, twin, clock.graphs, Results())["source"]
            document = {"source": source, "graphs": clock.graphs, "mixed": rows}
            args.out.write_text(json.dumps(document, indent=2) + "\n")
            clock.log(f"wrote {args.out}")
        else:
            profile(args, twin, clock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
