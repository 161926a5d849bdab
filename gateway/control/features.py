"""What a request shows about how well the drafter will do on it.

EAGLE-style drafters lose acceptance under an unfamiliar chat template, an
unfamiliar system prompt, tool-call JSON and long context (the attention-drift
analysis behind EAGLE 3.1; vLLM issues 52258 and 41838). `RequestFeatures`
keeps exactly those signals, coarsened so that classes stay few: the template
fingerprint, the identity of the normalised system prompt, the tool context and
a log2 prompt-length bucket. Volatile parts of a system prompt (dates, numbers,
e-mails, uuids, names after a greeting) are masked so they do not split a class.
Sampled requests are classed apart from greedy ones, by temperature bucket: a
draft is accepted with probability min(1, p/q) rather than when it is the
target's argmax, so the same prompts accept less when sampled, and more so the
hotter the sampling.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from engine.interface import GREEDY_EPS

_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
    r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DAYS = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
#: Order matters: the structured tokens first, bare numbers last.
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"https?://\S+"), "<url>"),
    (re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "<email>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<id>"),
    (
        re.compile(r"\b\d{4}-\d{1,2}-\d{1,2}(?:[t ]\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?z?)?\b", re.I),
        "<d>",
    ),
    (re.compile(rf"\b{_MONTHS}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b", re.I), "<d>"),
    (re.compile(rf"\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTHS}\.?,?\s+\d{{4}}\b", re.I), "<d>"),
    (re.compile(r"\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4}\b"), "<d>"),
    (re.compile(rf"\b{_DAYS}\b", re.I), "<day>"),
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s*(?:am|pm)\b)?", re.I), "<t>"),
    (
        re.compile(
            r"\b((?i:name is|named|called|i am|i'm|user|customer|dear|hi|hello|assisting))\s+"
            r"[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)?"
        ),
        r"\1 <name>",
    ),
    (re.compile(r"\b\d+(?:[.,]\d+)*\b"), "<n>"),
    (re.compile(r"\s+"), " "),
)

#: Raw-prompt template markers of the completions endpoint, first match wins.
_TEMPLATE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("chatml", ("<|im_start|>",)),
    ("llama3", ("<|start_header_id|>",)),
    ("llama2", ("[INST]", "<<SYS>>")),
    ("alpaca", ("### Instruction:", "### Response:")),
)
_CODE_HINT = re.compile(r"^\s*(?:def |class |import |from \S+ import |#include|function |package )")


def normalise_text(text: str) -> str:
    """Mask the volatile parts of a prompt (dates, numbers, ids, names); collapse blanks."""
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return text.strip().lower()


def text_identity(text: str) -> str:
    """Short stable identity of a normalised text; "" for no text."""
    if not text:
        return ""
    digest = hashlib.blake2b(normalise_text(text).encode(), digest_size=4).hexdigest()
    return digest


class IdentityCache:
    """Bounded cache of raw system-prompt text -> identity (the masking regexes cost
    ~20 us on a long prompt, and most traffic repeats a few system prompts). One per
    gateway, built by the composition root; cleared whole when full."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._ids: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        found = self._ids.get(text)
        if found is None:
            if len(self._ids) >= self._size:
                self._ids.clear()
            found = self._ids[text] = text_identity(text)
        return found


def length_bucket(prompt_tokens: int) -> int:
    """Upper bound of the log2 bucket: 64, 128, ... 32768 (acceptance falls with context)."""
    if prompt_tokens <= 64:
        return 64
    return min(1 << (prompt_tokens - 1).bit_length(), 32768)


def sampling_bucket(temperature: float) -> str:
    """ "" for greedy decoding, else the temperature's bucket: `t0.5` (up to 0.5), `t1`
    (up to 1), `t2` (hotter)."""
    if temperature < GREEDY_EPS:
        return ""
    if temperature <= 0.5:
        return "t0.5"
    return "t1" if temperature <= 1.0 else "t2"


#: vLLM's bound below which a sampling parameter is unset (`vllm.sampling_params._SAMPLING_EPS`).
_SAMPLING_EPS = 1e-5


#: Why a sampled request runs at k = 0 on an engine whose sampled speculation is lossy.
SAMPLED_NOT_EXACT = "unserved sampling: speculation is not lossless on this engine build"


def unserved_by_drafts(
    logit_bias: Mapping[Any, float] | None,
    min_p: float | None,
    sampling: str = "",
    lossless: bool = True,
) -> str:
    """The reason a request must run at k = 0 whatever its class decides, or "" for none:
    the one place that says why this engine cannot draft this request.

    vLLM refuses `logit_bias` and `min_p` once a request drafts (the rejection sampler
    applies neither to draft rows; `SamplingParams._validate_spec_decode`); a request
    that never drafts samples them exactly as an engine without a drafter
    (`engine.vllm.depth_zero_params`). A sampled request (`sampling`, its temperature's
    bucket, "" when greedy) on an engine whose sampled speculation is not `lossless`
    would sample another distribution with drafts. The reason starts with its kind, like
    the controller's.
    """
    names = [
        name
        for name, used in (
            ("logit_bias", bool(logit_bias)),
            ("min_p", min_p is not None and min_p > _SAMPLING_EPS),
        )
        if used
    ]
    if names:
        return f"unserved {' and '.join(names)}: served only to a request that never drafts"
    return SAMPLED_NOT_EXACT if sampling and not lossless else ""


class ChatView(NamedTuple):
    """What classification reads of a chat-shaped request (a chat request, or a Responses
    request as the chat request it renders to), as plain data."""

    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None = None
    #: `none`, `auto`, `required`, or `named` (a named function: only its kind is read);
    #: None where the request sets none.
    tool_choice: str | None = None
    #: The response format's type (`text`, `json_object`, `json_schema`, ...); None: unset.
    response_format: str | None = None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ChatView:
        """The view of an OpenAI chat body as JSON (the engine twin's, tests')."""
        choice = body.get("tool_choice")
        fmt = body.get("response_format")
        return cls(
            body["messages"],
            body.get("tools") or None,
            choice if choice is None or isinstance(choice, str) else "named",
            fmt.get("type") if isinstance(fmt, Mapping) else fmt,
        )


def turns_bucket(user_turns: int) -> int:
    """1, 2 (two or three user turns) or 4 (more): multi-turn, not its exact length."""
    if user_turns <= 1:
        return 1
    return 2 if user_turns <= 3 else 4


class RequestFeatures(NamedTuple):
    """The canonical, coarsened features of one request; hashable, cheap to compare.

    A NamedTuple: built and hashed (the classifier's cache key) once per request,
    which a tuple does in C; a frozen dataclass took 2 us more of the 20 us budget.
    """

    #: `chat` (server-side template), or the raw prompt's: chatml/llama3/llama2/alpaca/plain/code.
    template: str
    #: Identity of the normalised system prompt ("" when there is none).
    system_id: str = ""
    #: Bucketed number of user turns in the history.
    turns: int = 1
    #: Tools were offered to the model.
    tools: bool = False
    #: Tool results are in the history (the model continues after tool output).
    tool_messages: bool = False
    #: `none`, `auto`, `required` or `named`; "" when not set.
    tool_choice: str = ""
    #: `text`, `json_object`, `json_schema` or "" when not set.
    response_format: str = ""
    #: Upper bound of the prompt-length bucket, tokens.
    length: int = 64
    #: "" when decoded greedily, else the temperature's bucket (`sampling_bucket`).
    sampling: str = ""

    def canonical(self) -> str:
        """The one string hashed into the class id; field order is part of the contract.

        `sampling` is appended only when set, so a greedy class keeps the id it had
        before sampled requests were classed apart (shared state, flags and
        dashboards name classes by id).
        """
        text = (
            f"v1|{self.template}|{self.system_id}|{self.turns}|{int(self.tools)}|"
            f"{int(self.tool_messages)}|{self.tool_choice}|{self.response_format}|{self.length}"
        )
        return f"{text}|{self.sampling}" if self.sampling else text

    def label(self) -> str:
        """Short human label, e.g. `chat/sys:ab12/tools/json_object/len:512/t1`: each
        feature that is set, in the canonical order (metrics, flags and reports show it)."""
        parts = [self.template]
        if self.system_id:
            parts.append(f"sys:{self.system_id[:4]}")
        if self.turns > 1:
            parts.append(f"turns:{self.turns}")
        if self.tools:
            parts.append(
                "tools" if self.tool_choice in ("", "auto") else f"tools:{self.tool_choice}"
            )
        if self.tool_messages:
            parts.append("toolmsg")
        if self.response_format and self.response_format != "text":
            parts.append(self.response_format)
        parts.append(f"len:{self.length}")
        if self.sampling:
            parts.append(self.sampling)
        return "/".join(parts)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def _tool_choice_kind(tool_choice: Any) -> str:
    if tool_choice is None:
        return ""
    if isinstance(tool_choice, str):
        return tool_choice if tool_choice in ("none", "auto", "required", "named") else "other"
    return "named"


def _response_format_kind(response_format: Any) -> str:
    """Its type, from the type itself (`ChatView`) or a `response_format` object."""
    kind = response_format.get("type", "") if isinstance(response_format, Mapping) else ""
    if isinstance(response_format, str):
        kind = response_format
    if not kind:
        return ""
    return kind if kind in ("text", "json_object", "json_schema", "structural_tag") else "other"


def features_from_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: Any,
    response_format: Any,
    prompt_tokens: int,
    identities: IdentityCache | None = None,
    sampling: str = "",
) -> RequestFeatures:
    """Features of a chat request, from its plain JSON body fields."""
    system_parts: list[str] = []
    user_turns = 0
    tool_messages = False
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system_parts.append(_content_text(message.get("content")))
        elif role == "user":
            user_turns += 1
        elif role in ("tool", "function"):
            tool_messages = True
    return RequestFeatures(  # positional: a keyword NamedTuple call costs twice as much
        "chat",
        (identities or text_identity)("\n".join(system_parts)),
        turns_bucket(user_turns),
        bool(tools),
        tool_messages,
        _tool_choice_kind(tool_choice),
        _response_format_kind(response_format),
        length_bucket(prompt_tokens),
        sampling,
    )


def _raw_system_prompt(template: str, prompt: str) -> str:
    if template == "chatml":
        match = re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", prompt, re.S)
    elif template == "llama2":
        match = re.search(r"<<SYS>>(.*?)<</SYS>>", prompt, re.S)
    elif template == "llama3":
        match = re.search(
            r"<\|start_header_id\|>system<\|end_header_id\|>(.*?)<\|eot_id\|>", prompt, re.S
        )
    elif template == "alpaca":
        match = re.search(r"^(.*?)### Instruction:", prompt, re.S)
    else:
        return ""
    return match.group(1) if match else ""


def raw_template(prompt: str) -> str:
    """Fingerprint of a raw completion prompt by its template markers."""
    head = prompt[:4096]
    for name, markers in _TEMPLATE_MARKERS:
        if any(m in head for m in markers):
            return name
    return "code" if _CODE_HINT.match(head) else "plain"


def features_from_completion(
    prompt: str, prompt_tokens: int, identities: IdentityCache | None = None, sampling: str = ""
) -> RequestFeatures:
    """Features of a completions request: the raw prompt's template and system prompt."""
    template = raw_template(prompt)
    user_turns = {
        "chatml": prompt.count("<|im_start|>user"),
        "llama3": prompt.count("<|start_header_id|>user"),
        "llama2": prompt.count("[INST]"),
        "alpaca": prompt.count("### Instruction:"),
    }.get(template, 1)
    tool_messages = template == "chatml" and "<|im_start|>tool" in prompt
    return RequestFeatures(
        template=template,
        system_id=(identities or text_identity)(_raw_system_prompt(template, prompt).strip()),
        turns=turns_bucket(user_turns),
        tool_messages=tool_messages,
        length=length_bucket(prompt_tokens),
        sampling=sampling,
    )
