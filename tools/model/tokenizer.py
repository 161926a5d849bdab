"""A small byte-level BPE tokenizer, trained deterministically on the training texts.

A small vocabulary keeps the embedding (and the drafter's LM head, its largest
part) small. ChatML markers are special tokens; the Hermes tool markers are
ordinary added tokens, so that they survive detokenisation and vLLM's `hermes`
tool parser finds them in the vocabulary and in the output text.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.model.chat_template import CHAT_TEMPLATE, ENDOFTEXT, IM_END, SPECIAL_TOKENS, TOOL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A `PreTrainedTokenizerFast` with the main chat template, eos `<|im_end|>`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tok: Any, out: Path) -> None:
    tok.save_pretrained(str(out))


def padded_vocab(tok: Any, multiple: int = 64) -> int:
    """Embedding rows: the tokenizer's size rounded up (vLLM accepts unused rows)."""
    n = len(tok)
    return (n + multiple - 1) // multiple * multiple
