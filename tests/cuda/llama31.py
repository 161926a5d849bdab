"""A Llama-3.1-8B-Instruct target and an EAGLE-3 head shaped like
`yuhuili/EAGLE3-LLaMA3.1-Instruct-8B`, as directories vLLM reads, without weights.

What vLLM reads before it loads weights is real: each `config.json` holds the published
values (tests/cuda/models/), the target carries Llama 3.1's generation config and its
chat template (the official one, tool-calling JSON section included), and the tokenizer
has Llama 3's special tokens at their real ids (128000 to 128255), so the chat template,
the `llama3_json` tool parser and the stop tokens see what they would on the real model.

The one difference is the tokenizer's ordinary vocabulary: Llama 3's is 128,000 tiktoken
merges (9 MB); this one is a small byte-level BPE trained on local text with Llama 3's
pre-tokenizer split, so any text still encodes and decodes exactly, in more tokens.
Ids between its vocabulary and 128000 decode to nothing; nothing here emits them.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODELS = Path(__file__).parent / "models"
CHAT_TEMPLATE = MODELS / "llama3.1_chat_template.jinja"

#: The directory names the production chart mounts (`models.targetDir`, `models.drafterDir`
#: in helm/spec-gateway/ci/production-values.yaml are read by the test that needs them).
TARGET_CONFIGS = MODELS / "llama-3.1-8b-instruct"
DRAFTER_CONFIGS = MODELS / "eagle3-llama3.1-instruct-8b"

BEGIN_OF_TEXT = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
EOT = "<|eot_id|>"
EOM = "<|eom_id|>"
PYTHON_TAG = "<|python_tag|>"

#: Llama 3's named special tokens at their ids; the other ids of 128000..128255 are its
#: `<|reserved_special_token_N|>`, numbered as in the published tokenizer.
NAMED_SPECIAL: dict[int, str] = {
    128000: BEGIN_OF_TEXT,
    128001: END_OF_TEXT,
    128004: "<|finetune_right_pad_id|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: EOM,
    128009: EOT,
    128010: PYTHON_TAG,
}
FIRST_SPECIAL, SPECIAL_COUNT = 128000, 256

#: Llama 3's pre-tokenizer split (its tokenizer.json), before the byte-level mapping.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Enough merges that English and JSON take a few characters a token; the file stays
#: about 100 KB.
BASE_VOCAB = 2048


@dataclass(frozen=True, slots=True)
class LlamaPair:
    """The target and drafter directories (config, tokenizer, template; no weights)."""

    target: Path
    drafter: Path


def special_tokens() -> dict[int, str]:
    """All 256 of Llama 3's special tokens by id."""
    tokens: dict[int, str] = {}
    reserved = 0
    for token_id in range(FIRST_SPECIAL, FIRST_SPECIAL + SPECIAL_COUNT):
        name = NAMED_SPECIAL.get(token_id)
        if name is None:
            name = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
        tokens[token_id] = name
    return tokens


def build_llama31_pair(root: Path, target_dir: str, drafter_dir: str) -> LlamaPair:
    """Write the pair under `root` (`root/target_dir`, `root/drafter_dir`)."""
    pair = LlamaPair(target=root / target_dir, drafter=root / drafter_dir)
    shutil.copytree(TARGET_CONFIGS, pair.target, dirs_exist_ok=True)
    shutil.copytree(DRAFTER_CONFIGS, pair.drafter, dirs_exist_ok=True)
    _write_tokenizer(pair.target)
    return pair


def _corpus() -> list[str]:
    """Deterministic local text: the standard library's `json` package and `dataclasses`
    (always present, as tools/model/testing_models.py trains on), and the chat template."""
    files = sorted((Path(json.__file__).parent).glob("*.py"))
    files.append(Path(sys.modules["dataclasses"].__file__ or ""))
    texts = [f.read_text(encoding="utf-8") for f in files]
    texts.append(CHAT_TEMPLATE.read_text(encoding="utf-8"))
    return texts


def _base_tokenizer() -> dict[str, Any]:
    """The byte-level BPE, as tokenizer.json's dict (before the special tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    loaded: dict[str, Any] = json.loads(tok.to_str())
    return loaded


def _write_tokenizer(out: Path) -> None:
    """tokenizer.json with the special tokens at their ids, and the Llama 3.1 config files.

    An added token keeps the id it has in the model's vocabulary (the tokenizers library
    numbers new ones after the vocabulary), so the special tokens go into both.
    """
    spec = _base_tokenizer()
    specials = special_tokens()
    vocab: dict[str, int] = spec["model"]["vocab"]
    vocab.update({name: token_id for token_id, name in specials.items()})
    spec["added_tokens"] = [
        {
            "id": token_id,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token_id, name in specials.items()
    ]
    # As Llama 3's: `<|begin_of_text|>` before a prompt encoded with special tokens.
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {
            BEGIN_OF_TEXT: {"id": BEGIN_OF_TEXT, "ids": [FIRST_SPECIAL], "tokens": [BEGIN_OF_TEXT]}
        },
    }
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config = {
        "added_tokens_decoder": {
            str(token_id): {
                "content": name,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token_id, name in specials.items()
        },
        "bos_token": BEGIN_OF_TEXT,
        "chat_template": CHAT_TEMPLATE.read_text(encoding="utf-8"),
        "clean_up_tokenization_spaces": False,
        "eos_token": EOT,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    special_map = {"bos_token": BEGIN_OF_TEXT, "eos_token": EOT}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map), encoding="utf-8")
