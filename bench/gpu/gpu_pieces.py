"""What a step mixing k = 0 and drafting requests costs on a GPU, for the engine twin.

    python -m bench.gpu.gpu_pieces --out mixed_depth.json          # CUDA, Llama-3.1-8B shape
    python -m bench.gpu.gpu_pieces --moe --out mixed_depth_moe.json  # Qwen3-30B-A3B shape
    python -m bench.gpu.gpu_pieces --tiny --out /tmp/m.json         # CPU, float32, seconds

vLLM replays a FULL decode graph only for a step whose requests all verify the same number of
tokens (`engine/vllm/batch_depth.py`); a step in which some requests verify none (k = 0) and
others k runs PIECEWISE: everything but attention replays as captured graphs, and each layer's
attention runs eagerly between them. Such a step verifies fewer tokens than the uniform step at
k (b0 + b1 (k + 1) rows instead of b (k + 1)) but pays a launch per attention call.

For each batch b, depth k and b0 requests at k = 0 this times the same step two ways:
`full` (the whole step in one graph: what it would cost with a FULL graph) and `piecewise`
(vLLM's fallback). b0 = 0 is the uniform step at k, so `piecewise / full` there is the graph
loss alone; `piecewise(b0) / full(0)` is what the twin's per-request depths pay for a mixed
step against the uniform step at the batch's deepest k, which the twin charges them now.

Needs only torch; the models are `gpu_profile`'s (random weights in the targets' shapes), and
so is the simplification that a step's logits and drafts are inside its graphs. The eager
attention is `gpu_profile`'s SDPA with its KV-cache writes plus two gathers (a few more launches
per layer than vLLM's one varlen FlashAttention call), so the graph loss measured here is an
upper estimate of vLLM's.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from bench.gpu.gpu_profile import (
    Attend,
    Clock,
    Twin,
    feed_forward,
    int_list,
    ms,
    rms_norm,
    rope,
    target_of,
)

#: One stage of a step: (captured as a graph in PIECEWISE mode, the work). Stages share state
#: through a dict; an eager stage writes its result into a buffer allocated before capture, so
#: that the graph after it reads the same memory at every replay.
Stage = tuple[bool, Callable[[], None]]


class MixedStep:
    """One step: b0 sequences verifying nothing beside b1 verifying k drafts each. The target runs
    each linear layer once over their b0 + b1 (k + 1) rows, as vLLM's flattened batches do; the
    drafter makes a pass over the same rows, then k - 1 over one token per sequence, as vLLM's
    EAGLE proposer drafts for the whole batch.

    Attention is one call per layer, as vLLM's varlen kernel: the rows are scattered into a
    [batch, k + 1] layout (a k = 0 sequence's one row repeated into its unused slots, whose
    outputs are dropped), attended, and gathered back. The uniform step (b0 = 0) pays the same
    gathers, so that the ratios between them price the rows and the graphs, not the gathers."""

    def __init__(self, twin: Twin, b0: int, b1: int, k: int) -> None:
        self.twin, self.s, self.batch, self.width = twin, twin.shape, b0 + b1, k + 1
        c, hq = twin.shape.context, twin.shape.heads * twin.shape.head_dim
        widths = [1] * b0 + [k + 1] * b1
        starts = [sum(widths[:i]) for i in range(self.batch)]
        self.rows = sum(widths)
        #: padded slot -> source row, and real row -> padded slot
        self.pad = torch.tensor(
            [starts[i] + min(j, widths[i] - 1) for i in range(self.batch) for j in range(k + 1)],
            device=twin.device,
        )
        self.keep = torch.tensor(
            [i * (k + 1) + j for i in range(self.batch) for j in range(widths[i])],
            device=twin.device,
        )
        self.attends = [twin._cached(c, k + 1, cache) for cache in twin.caches]
        self.draft_attend = twin._cached(c, k + 1, twin.draft_cache)
        self.rot = twin.rot[:, c : c + k + 1]
        self.ids = torch.randint(0, self.s.vocab, (self.rows,), device=twin.device)
        self.state: dict[str, Tensor] = {
            name: torch.zeros(self.rows, hq, device=twin.device, dtype=twin.dtype)
            for name in [f"a{layer}" for layer in range(self.s.layers)] + ["da"]
        }
        #: each sequence's last row, where the drafter's first pass proposes its first draft
        self.ends = torch.tensor(
            [starts[i] + widths[i] - 1 for i in range(self.batch)], device=twin.device
        )
        start = c + k + 1
        self.chain = [
            (start + j, twin._cached(start + j, 1, twin.draft_cache)) for j in range(k - 1)
        ]
        self.stages = self._stages()

    def whole(self) -> Tensor:
        """Every stage in order: captured as one graph, this is the step with a FULL graph."""
        for _, fn in self.stages:
            fn()
        return self.state["draft"]

    def _qkv(self, prefix: str, normed: Tensor, weight: Tensor) -> None:
        """Projection, the scatter into the padded layout and RoPE, into the state."""
        s, b, w = self.s, self.batch, self.width
        q_size, kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
        q, k, v = torch.split(F.linear(normed, weight)[self.pad], [q_size, kv_size, kv_size], -1)
        self.state[prefix + "q"] = rope(q.reshape(b, w, s.heads, s.head_dim), self.rot)
        self.state[prefix + "k"] = rope(k.reshape(b, w, s.kv_heads, s.head_dim), self.rot)
        self.state[prefix + "v"] = v.reshape(b, w, s.kv_heads, s.head_dim)

    def _attention(self, prefix: str, out: str, attend: Attend) -> None:
        """The stage PIECEWISE leaves eager: the attention, gathered into the buffer `out`."""
        st = self.state
        padded = attend(st[prefix + "q"], st[prefix + "k"], st[prefix + "v"])
        st[out].copy_(padded.reshape(-1, padded.shape[-1])[self.keep])

    def _finish(self, index: int) -> Tensor:
        """Layer `index` after its attention: the output projection and the MLP or experts."""
        layer = self.twin.layers[index]
        x = self.state[f"x{index}"] + F.linear(self.state[f"a{index}"], layer.o)
        return feed_forward(layer, x, self.s)

    def _stages(self) -> list[Stage]:
        s, twin, st = self.s, self.twin, self.state

        def before_attention(index: int) -> None:
            x = F.embedding(self.ids, twin.embed) if index == 0 else self._finish(index - 1)
            st[f"x{index}"] = x
            layer = twin.layers[index]
            self._qkv(f"l{index}", rms_norm(x, layer.in_norm, s.eps), layer.qkv)

        def verify_and_draft() -> None:
            x = self._finish(s.layers - 1)
            tokens = F.linear(rms_norm(x, twin.norm, s.eps), twin.lm_head).argmax(-1)
            d = twin.drafter
            aux = torch.cat([st[f"x{a}"] for a in s.aux_layers], dim=-1)
            st["dh"] = hidden = F.linear(aux, d.fc)
            embeds = rms_norm(F.embedding(tokens, twin.embed), d.embed_norm, s.eps)
            normed = torch.cat((embeds, rms_norm(hidden, d.hidden_norm, s.eps)), dim=-1)
            self._qkv("d", normed, d.layer.qkv)

        def propose() -> None:
            d = twin.drafter
            h = feed_forward(d.layer, st["dh"] + F.linear(st["da"], d.layer.o), s)[self.ends]
            index = F.linear(rms_norm(h, d.norm, s.eps), d.lm_head).argmax(-1)
            token, hidden = (index + d.d2t[index])[:, None], h[:, None]
            for start, attend in self.chain:
                token, hidden = twin.draft(token, hidden, start, attend, fuse=False)
            st["draft"] = token

        stages: list[Stage] = []
        for index in range(s.layers):
            stages.append((True, partial(before_attention, index)))
            attention = partial(self._attention, f"l{index}", f"a{index}", self.attends[index])
            stages.append((False, attention))
        stages.append((True, verify_and_draft))
        stages.append((False, partial(self._attention, "d", "da", self.draft_attend)))
        stages.append((True, propose))
        return stages


class Pieces:
    """A step's stages replayed as vLLM's PIECEWISE mode does: a graph per captured stage, the
    others eager between them. Off CUDA (or with --eager) every stage runs eagerly."""

    def __init__(self, clock: Clock, step: MixedStep) -> None:
        self.step = step
        self.graphs: list[torch.cuda.CUDAGraph | None] = []
        if clock.side is not None:  # warm up on a side stream, as `Clock._capture` does
            clock.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(clock.side):
                for _ in range(clock.warmups):
                    step.whole()
            torch.cuda.current_stream().wait_stream(clock.side)
        else:
            for _ in range(clock.warmups):
                step.whole()
        for captured, fn in step.stages:
            if not (captured and clock.graphs):
                fn()
                self.graphs.append(None)
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            self.graphs.append(graph)

    def run(self) -> Tensor:
        for graph, (_, fn) in zip(self.graphs, self.step.stages, strict=True):
            if graph is None:
                fn()
            else:
                graph.replay()
        return self.step.state["draft"]


def measure(twin: Twin, clock: Clock, args: argparse.Namespace) -> list[dict[str, float | bool]]:
    """Each (batch, k, b0): the step in one graph and piecewise, with the piecewise step's ratio
    to the uniform step at k in one graph (b0 = 0), which is what the twin charges now."""
    rows: list[dict[str, float | bool]] = []
    for batch in args.batches:
        for k in args.ks:
            uniform = 0.0
            for zero in zeros(batch, args.zero_fractions):
                if clock.elapsed() > args.deadline_s:
                    clock.log(f"deadline {args.deadline_s} s reached: incomplete")
                    return rows
                step = MixedStep(twin, zero, batch - zero, k)
                full = clock.measure(step.whole).median
                pieces = Pieces(clock, step)
                piecewise = clock.measure(pieces.run, graph=False).median
                # the same drafts both ways: the pieces compute the step the whole graph does
                same = bool(torch.equal(pieces.run().clone(), step.whole()))
                uniform = uniform or full
                rows.append(
                    {
                        "batch": batch,
                        "k": k,
                        "zero": zero,
                        "full_ms": ms(full),
                        "piecewise_ms": ms(piecewise),
                        "piecewise_over_full": round(piecewise / full, 4),
                        "piecewise_over_uniform": round(piecewise / uniform, 4),
                        "same_drafts": same,
                    }
                )
                clock.log(
                    f"batch {batch} k {k}, {zero} at k = 0: full {full:.3f} ms, piecewise "
                    f"{piecewise:.3f} ms = {piecewise / uniform:.3f}x the uniform step at k"
                )
                del pieces, step
                if clock.graphs:
                    torch.cuda.empty_cache()
    return rows


def zeros(batch: int, fractions: list[float]) -> list[int]:
    """The numbers of k = 0 requests in a batch for these shares, at least one drafting."""
    return sorted({round(batch * f) for f in fractions} - {batch})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("mixed_depth.json"))
    parser.add_argument("--tiny", action="store_true", help="tiny float32 shape on the CPU")
    parser.add_argument("--moe", action="store_true", help="the Qwen3-30B-A3B-shaped MoE target")
    parser.add_argument("--eager", action="store_true", help="time eagerly, without CUDA graphs")
    parser.add_argument("--batches", type=int_list, default=None, help="4,16,64 (tiny: 2,4)")
    parser.add_argument("--ks", type=int_list, default=[1, 3], help="drafting depths (1,3)")
    parser.add_argument(
        "--zero-fractions",
        type=lambda text: [float(f) for f in text.split(",")],
        default=[0.0, 0.25, 0.5, 0.75],
        help="shares of the batch at k = 0 (0,0.25,0.5,0.75; 0 is the uniform step)",
    )
    parser.add_argument("--context", type=int, default=None, help="cached tokens (1024; tiny 32)")
    parser.add_argument("--replays", type=int, default=None, help="timed replays (20; tiny 2)")
    parser.add_argument("--warmups", type=int, default=None, help="untimed runs (3; tiny 1)")
    parser.add_argument("--deadline-s", type=float, default=200.0, help="start nothing after (200)")
    args = parser.parse_args(argv)
    defaults = {"batches": ([2, 4], [4, 16, 64]), "context": (32, 1024), "replays": (2, 20)}
    defaults["warmups"] = (1, 3)
    for name, (tiny, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    # `Twin` sizes its caches and RoPE table from these
    args.max_k, args.prefill = max(args.ks), [1]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = target_of(args)
    if target is None:
        return 2
    shape, device, dtype = target
    threads = torch.get_num_threads()
    if args.tiny:  # its tiny matmuls gain nothing from threads that spin against other work
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            clock = Clock(device, not args.eager, args.warmups, args.replays)
            twin = Twin(shape, args, device, dtype)
            clock.log(f"weights and KV caches allocated on {device}")
            rows = measure(twin, clock, args)
    finally:
        torch.set_num_threads(threads)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    model = ("Qwen3-30B-A3B" if args.moe else "Llama-3.1-8B") + " shape"
    model = ("tiny " + ("MoE " if args.moe else "") + "test shape") if args.tiny else model
    expected = sum(len(zeros(b, args.zero_fractions)) for b in args.batches) * len(args.ks)
    document = {
        "source": f"measured by python -m bench.gpu.gpu_pieces on {name}, torch "
        f"{torch.__version__}, random {str(dtype).removeprefix('torch.')} weights, {model}, "
        f"one-layer EAGLE-3 head, context {shape.context}, CUDA graphs {clock.graphs}",
        "graphs": clock.graphs,
        "complete": len(rows) == expected,
        "rows": rows,
    }
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    clock.log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
