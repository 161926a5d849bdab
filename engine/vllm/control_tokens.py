"""Client text never becomes a control token: chat input is tokenized as plain text.

A chat template renders the messages into one string and the tokenizer then splits
that string on its added tokens (`<|im_start|>`, `<|im_end|>`, `<tool_call>`, ...).
A message whose content carries those strings therefore forges turns: a system turn
inside a user message (transformers issue 29279; vLLM PR 31735; sglang PR 30962;
transformers PRs 47386 and 48052 discuss the fixes).

The rule, at token level (the shape of transformers PR 48052 and sglang PR 30962):

1. in every string the client sent (message content and names, tool calls and tool
   results, tool schemas, documents, chat-template kwargs) each control-token string
   is replaced by a sentinel built on a per-request random nonce, of ASCII letters and
   digits only, so that it passes `tojson` and any filter that keeps text unchanged;
2. the template renders as usual, and the rendered text is encoded with the
   tokenizer's own added-token matching: the template's markers stay control tokens;
3. each stretch between two control tokens that holds a sentinel is encoded again,
   sentinels restored, by the same tokenizer with no added vocabulary: the client's
   `<|im_start|>` comes out as the plain-text tokens `<`, `|`, `im`, `_start`, ...

A fast tokenizer encodes each stretch between added tokens on its own, so step 3
yields exactly the ids of the same text read as plain characters (ByteLevel
tokenizers: Qwen, Llama 3, GPT-2 family; a Metaspace tokenizer that prepends a space
to the first word may differ by one token per such stretch). A request with no
control-token string in it (nearly all) takes the template's own path unchanged.
Anything that would let a sentinel escape (a filter that rewrites it, an added token
cutting through it) fails the request instead: a 400, never a forged turn.

Roles are not escaped (templates compare them to `"system"`, `"tool"`, ...): a role
that contains a control-token string is refused. The system message stays the one
channel for a system prompt: the client may send one, but no message can open
another turn from inside its text.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from tokenizers import Tokenizer

#: Keyword arguments of `apply_chat_template` that change how the text is tokenized;
#: a client can reach them through `chat_template_kwargs`. Refused on the escaped path.
_TOKENIZE_KWARGS = ("padding", "truncation", "max_length", "return_tensors")


class ControlTokenInInput(ValueError):
    """Client input the guard cannot render safely (a 400 through vLLM's serving layer)."""


def _escape_tree(value: Any, swap: Callable[[str], str]) -> Any:
    """`value` with `swap` applied to every string in it, dict keys included."""
    if isinstance(value, str):
        return swap(value)
    if isinstance(value, dict):
        return {_escape_tree(k, swap): _escape_tree(v, swap) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_escape_tree(v, swap) for v in value)
    return value


class ControlTokenGuard:
    """Encodes a rendered chat so that only the template's own markers are control tokens.

    Neither of its tokenizers is changed after construction, so both may encode from
    many threads (vLLM renders chats on a thread pool).
    """

    def __init__(
        self, control: dict[int, str], full: Tokenizer | None, plain: Tokenizer | None
    ) -> None:
        #: id -> text of every added token (special or not): the template's vocabulary.
        self.control = control
        self._full = full
        self._plain = plain
        texts = sorted({t for t in control.values() if t}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(t) for t in texts)) if texts else None
        self._index = {text: i for i, text in enumerate(texts)}
        self._texts = texts

    @classmethod
    def from_json(cls, tokenizer_json: str) -> ControlTokenGuard:
        """From a `tokenizer.json`: one copy encodes as the model does, one copy without
        added vocabulary encodes plain text."""
        spec = json.loads(tokenizer_json)
        full = Tokenizer.from_str(tokenizer_json)
        full.no_truncation()
        full.no_padding()
        control = {int(t["id"]): str(t["content"]) for t in spec.get("added_tokens") or []}
        spec.update(added_tokens=[], truncation=None, padding=None)
        return cls(control, full, Tokenizer.from_str(json.dumps(spec)))

    @classmethod
    def of(cls, tokenizer: Any) -> ControlTokenGuard:
        """The guard for a transformers tokenizer. A fast one (with `backend_tokenizer`)
        gets exact plain-text encoding; any other only refuses control-token strings."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return cls.from_json(backend.to_str())
        added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
        return cls({int(i): str(t) for t, i in added.items()}, None, None)

    @property
    def exact(self) -> bool:
        """Whether client markers are encoded as plain text (else they are refused)."""
        return self._full is not None

    def find(self, text: str) -> str | None:
        """The first control-token string in `text`, if any."""
        match = self._pattern.search(text) if self._pattern else None
        return match.group() if match else None

    def plain_ids(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """`text` as plain characters: no added token can match. `add_special_tokens`
        adds what the tokenizer's post-processor adds (a BOS), as a text prompt gets."""
        if self._plain is None:
            raise ControlTokenInInput(f"input holds the control token {self.find(text)!r}")
        encoding = self._plain.encode(text, add_special_tokens=add_special_tokens)
        # The post-processor's tokens are the model's own; a control id anywhere else would
        # come from the text, through merges of a vocabulary that spells a marker: refuse.
        marks = encoding.special_tokens_mask
        forged = [
            i for i, m in zip(encoding.ids, marks, strict=True) if i in self.control and not m
        ]
        if forged:
            raise ControlTokenInInput(f"plain text encodes to control token {forged[0]}")
        return list(encoding.ids)

    def completion_ids(self, prompt: Any, add_special_tokens: bool) -> list[int] | None:
        """The ids of a completion prompt (one string) that holds control-token strings,
        read as text (with a BOS where the tokenizer adds one); None for any other prompt,
        which vLLM tokenizes as it would (identically, having no marker to split)."""
        text = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
        if not isinstance(text, str) or self.find(text) is None:
            return None
        return self.plain_ids(text, add_special_tokens=add_special_tokens)

    def escape(self, value: Any, nonce: str) -> tuple[Any, int]:
        """`value` with each control-token string replaced by its sentinel, and the count."""
        count = 0

        def swap(text: str) -> str:
            nonlocal count
            if self._pattern is None:
                return text
            out, n = self._pattern.subn(lambda m: self._sentinel(nonce, m.group()), text)
            count += n
            return out

        return _escape_tree(value, swap), count

    def _sentinel(self, nonce: str, text: str) -> str:
        return f"SGW{nonce}N{self._index[text]}Z"

    def encode(self, rendered: str, nonce: str) -> list[int]:
        """Ids of `rendered`: its control tokens as the model's, sentinels as plain text."""
        if self._full is None:
            raise ControlTokenInInput("this tokenizer cannot encode control-token strings as text")
        sentinel = re.compile(f"SGW{nonce}N(\\d+)Z")
        encoding = self._full.encode(rendered, add_special_tokens=False)
        ids: list[int] = []
        stretch: list[int] = []
        start = 0
        restored = 0

        def close(end: int) -> None:
            nonlocal restored
            text = rendered[start:end]
            if nonce not in text:
                ids.extend(stretch)
                return
            plain, n = sentinel.subn(lambda m: self._texts[int(m.group(1))], text)
            if nonce in plain:
                raise ControlTokenInInput("a sentinel was cut by a control token")
            restored += n
            ids.extend(self.plain_ids(plain))

        for token_id, (begin, end) in zip(encoding.ids, encoding.offsets, strict=True):
            if token_id in self.control:
                close(begin)
                ids.append(token_id)
                stretch, start = [], end
            else:
                stretch.append(token_id)
        close(len(rendered))
        if restored != len(sentinel.findall(rendered)) or rendered.lower().count(nonce) != restored:
            raise ControlTokenInInput("the chat template altered escaped content")
        return ids


def _refuse_control_roles(guard: ControlTokenGuard, conversation: Iterable[Any]) -> None:
    for i, message in enumerate(conversation):
        role = message.get("role") if isinstance(message, dict) else None
        if isinstance(role, str) and guard.find(role) is not None:
            raise ControlTokenInInput(f"messages[{i}].role holds a control token")


def guard_chat_template(tokenizer: Any) -> ControlTokenGuard:
    """Make `tokenizer.apply_chat_template` (this instance only) tokenize client text as text.

    The wrapper keeps the original's signature (vLLM inspects it to filter template
    kwargs) and calls the original unchanged when no control-token string is present.
    With one present it returns token ids even where text was asked for (`tokenize=False`,
    vLLM's serving path): the text would be tokenized with the markers as control tokens.
    A request's `add_special_tokens` (a BOS on top of the template) is then not applied.
    """
    installed = getattr(tokenizer.apply_chat_template, "control_token_guard", None)
    if isinstance(installed, ControlTokenGuard):
        return installed  # a second serving layer on the same renderer
    guard = ControlTokenGuard.of(tokenizer)
    if not guard.control:
        return guard
    original = tokenizer.apply_chat_template

    @functools.wraps(original)
    def apply_chat_template(conversation: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise TypeError("apply_chat_template: pass everything after the conversation by name")
        if kwargs.get("tokenizer_kwargs"):
            raise ControlTokenInInput("chat_template_kwargs.tokenizer_kwargs is not accepted")
        _refuse_control_roles(guard, conversation)
        nonce = secrets.token_hex(16)
        fixed = {
            k: kwargs.pop(k) for k in ("chat_template", "tokenize", "return_dict") if k in kwargs
        }
        escaped, count = guard.escape((conversation, kwargs), nonce)
        if count == 0:
            return original(conversation, **fixed, **kwargs)
        conversation, kwargs = escaped
        if not guard.exact:
            raise ControlTokenInInput("chat input holds a control token of the model's template")
        if any(kwargs.get(k) for k in (*_TOKENIZE_KWARGS, "return_assistant_tokens_mask")):
            raise ControlTokenInInput("tokenizer options are not accepted with this input")
        rendered = original(
            conversation, chat_template=fixed.get("chat_template"), tokenize=False, **kwargs
        )
        if not isinstance(rendered, str):
            raise ControlTokenInInput("one conversation per call on this path")
        ids = guard.encode(rendered, nonce)
        if not fixed.get("tokenize", True):
            # Text would carry the markers back into vLLM's tokenizer: hand it the ids,
            # which its renderer takes as a token prompt (`parse_dec_only_prompt`).
            return ids
        if fixed.get("return_dict", True):
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        return ids

    apply_chat_template.control_token_guard = guard  # type: ignore[attr-defined]
    tokenizer.apply_chat_template = apply_chat_template
    return guard
