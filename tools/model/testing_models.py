"""A tiny random-weight Llama target and a matching EAGLE 3.1 drafter, for tests.

The engine tests (and the gateway's) must run before the trained embedded model
exists, on a machine with no network. This builds, into a directory, a target
that vLLM loads as `LlamaForCausalLM` with a ChatML tokenizer trained on local
files, and a one-layer EAGLE-3 drafter (`fc_norm` and `norm_output` on, the
EAGLE 3.1 variant) that vLLM loads as `LlamaForCausalLMEagle3`.

Random weights would give an acceptance rate of about zero, which makes the
acceptance accounting tests vacuous. So both heads are rigged: the target's
greedy next token is `A` when the first coordinate of its final hidden state is
positive and `B` otherwise, and the drafter's the same on *its* own hidden
state. The two signs are unrelated functions of the context, so each draft
position is accepted about half the time: acceptance is neither 0 nor 1, and
accepted-per-position falls with depth as in a real drafter.

Building is idempotent: a directory holding a finished build is reused.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Bump when the layout or weights change, so stale builds are rebuilt.
BUILD_VERSION = "3"
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, slots=True)
class TinyModels:
    """Paths of a built target/drafter pair."""

    target: Path
    drafter: Path


@dataclass(frozen=True, slots=True)
class TinyShape:
    """Sizes of the tiny target; the drafter copies width and heads."""

    layers: int = 4
    hidden: int = 64
    intermediate: int = 128
    heads: int = 2
    kv_heads: int = 1
    vocab: int = 512
    seed: int = 0


def build_tiny_models(root: Path, shape: TinyShape | None = None) -> TinyModels:
    """Build (or reuse) the pair under `root`; returns their directories."""
    shape = shape or TinyShape()
    tag = f"l{shape.layers}-h{shape.hidden}-s{shape.seed}-v{BUILD_VERSION}"
    models = TinyModels(target=root / tag / "target", drafter=root / tag / "eagle31")
    marker = root / tag / "BUILT"
    if marker.exists():
        return models
    models.target.mkdir(parents=True, exist_ok=True)
    models.drafter.mkdir(parents=True, exist_ok=True)
    vocab_size, eos_id = _build_tokenizer(models.target, shape.vocab)
    token_a, token_b = vocab_size // 2, vocab_size // 2 + 1
    _build_target(models.target, shape, vocab_size, eos_id, (token_a, token_b))
    _build_drafter(models.drafter, shape, vocab_size, (token_a, token_b))
    marker.write_text("ok\n", encoding="utf-8")
    return models


def _build_tokenizer(out: Path, vocab: int) -> tuple[int, int]:
    """Byte-level BPE trained on the standard library's `json` package (always present)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = sorted(str(p) for p in (Path(json.__file__).parent).glob("*.py"))
    corpus += [str(Path(sys.modules["dataclasses"].__file__ or ""))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(corpus, trainer)
    tok.add_tokens(_TOOL_TOKENS)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    eos: Any = fast.convert_tokens_to_ids("<|im_end|>")
    return len(fast), int(eos)


def _build_target(
    out: Path, shape: TinyShape, vocab_size: int, eos_id: int, tokens: tuple[int, int]
) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=eos_id,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(shape.seed)
    model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        model.lm_head.weight.copy_(_sign_head(vocab_size, shape.hidden, tokens))
    model.to(torch.bfloat16).save_pretrained(str(out))
    GenerationConfig(eos_token_id=eos_id).save_pretrained(str(out))  # type: ignore[no-untyped-call]


def _sign_head(vocab_size: int, hidden: int, tokens: tuple[int, int]) -> Any:
    """An LM head whose argmax is tokens[0] when h[0] > 0 and tokens[1] otherwise."""
    import torch

    head = torch.randn(vocab_size, hidden) * 1e-3
    head[tokens[0], 0] = 8.0
    head[tokens[1], 0] = -8.0
    return head


def _build_drafter(out: Path, shape: TinyShape, vocab_size: int, tokens: tuple[int, int]) -> None:
    """One EAGLE-3 decoder layer in the original checkpoint layout (`midlayer.*`)."""
    import torch
    from safetensors.torch import save_file

    h, inter = shape.hidden, shape.intermediate
    head_dim = h // shape.heads
    aux_layers = _aux_layers(shape.layers)
    gen = torch.Generator().manual_seed(shape.seed + 1)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen) * 0.02

    weights = {
        "midlayer.self_attn.q_proj.weight": rand(shape.heads * head_dim, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(shape.kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(shape.kv_heads * head_dim, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, shape.heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, h),
        "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "fc.weight": rand(h, len(aux_layers) * h) * 10,
        "norm.weight": torch.ones(h),
        "lm_head.weight": _sign_head(vocab_size, h, tokens),
    }
    for i in range(len(aux_layers)):
        weights[f"fc_norm.{i}.weight"] = torch.ones(h)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
        str(out / "model.safetensors"),
    )
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "draft_vocab_size": vocab_size,
        "target_hidden_size": h,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "fc_norm": True,
        "norm_output": True,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(aux_layers),
            "use_aux_hidden_state": True,
        },
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _aux_layers(layers: int) -> tuple[int, int, int]:
    """Three distinct captured target layers (vLLM's default collides below 6 layers)."""
    if layers >= 6:
        return (2, layers // 2, layers - 3)
    if layers < 3:
        raise ValueError("the tiny target needs at least 3 layers for EAGLE-3")
    return (0, layers // 2, layers - 1)
