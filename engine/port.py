"""The serving port: everything the gateway asks of a backend to answer `/v1`.

Requests and replies are vLLM's OpenAI wire models (`engine.protocol`), the
field's library for parsing and validating OpenAI bodies; a backend answers a
chat, completion or Responses API request at the speculation depth k the control
plane chose, under the gateway's request id. Two implementations: `OpenAIFrontend`
(vLLM's own serving layer on the embedded engine) and `FakeFrontend` (the scripted
`FakeEngine`, for the in-process test tier); both pass `tests/engine/port_contract.py`.

The contract, beyond the signatures:

* A reply is the wire model or a stream of OpenAI SSE lines (`data: {...}\\n\\n`
  ... `data: [DONE]\\n\\n`); a Responses stream is typed events ending in
  `response.completed` (`engine.responses_wire`). Every failure is raised as an
  `EngineError` whose `kind` is one of `engine.interface.ErrorClass` (unknown model:
  `NOT_FOUND`; a prompt over the context: `InvalidRequestError`), before the reply or
  from inside its stream: a backend translates its library's error replies itself
  (vLLM's: `engine.vllm.errors`), so the gateway reads no backend's payloads.
* Each answer is `Served(reply, outcome)` (`engine.outcomes`): `outcome` resolves to the
  request's `RequestOutcome` before the reply's last chunk is produced (a whole reply:
  before it is returned), and to None where the request ended without one (refused,
  its stream closed early, the engine died): it never stays pending once the request
  has left the engine, and a consumer that stops waiting cancels it.
* `k` is the request's depth; `cap`, where set, lowers the requests already in
  the engine to at most that depth as this one is added (`SPEC_CAP_ARG`); `step`,
  where set, makes k a bound and the request a voter in the engine's step-depth rule
  (`engine.step_rule`). A backend whose engine runs no such rule ignores `step`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NamedTuple, Protocol

from engine.interface import GATEWAY_ID_ARG, SPEC_CAP_ARG, SPEC_CLASS_ARG, SPEC_DEPTH_ARG
from engine.outcomes import Served
from engine.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
    ResponsesRequest,
    ResponsesResponse,
)
from engine.step_rule import SPEC_COSTS_ARG, SPEC_NEWS_ARG, SPEC_VOTE_ARG, StepArgs

#: Keys of `vllm_xargs` reserved for the gateway; a client may never set them.
RESERVED_XARGS = frozenset(
    {
        SPEC_DEPTH_ARG,
        SPEC_CAP_ARG,
        SPEC_CLASS_ARG,
        GATEWAY_ID_ARG,
        SPEC_VOTE_ARG,
        SPEC_COSTS_ARG,
        SPEC_NEWS_ARG,
    }
)

ChatResult = ChatCompletionResponse | AsyncIterator[str]
CompletionResult = CompletionResponse | AsyncIterator[str]
#: A Responses stream is typed events (`engine.responses_wire`), not `data:` chunks.
ResponsesResult = ResponsesResponse | AsyncIterator[str]
#: The requests whose sampling the backend reports (`sampling_of`).
SampledRequest = ChatCompletionRequest | CompletionRequest | ResponsesRequest


class Sampling(NamedTuple):
    """How a backend samples one request: what the gateway classifies it by and checks
    against the drafts before it plans k."""

    #: The request's temperature, else the model's generation-config default, else 1.0.
    temperature: float
    #: Its min_p, else the model's default (a generation config may set one, which vLLM
    #: refuses beside drafts), else 0.
    min_p: float
    #: Whether speculation leaves a sampled request's output distribution unchanged on
    #: this engine (`Engine.lossless_sampling`; greedy requests are exact everywhere).
    lossless: bool


class ServingPort(Protocol):
    """One backend's OpenAI serving, as the service and the routes use it."""

    @property
    def served_model_name(self) -> str:
        """The model name `/v1/models` lists and requests must name."""
        ...

    @property
    def harmony_messages(self) -> bool:
        """Whether the model reads OpenAI-harmony messages (author/channel: gpt-oss only)."""
        ...

    def sampling_of(self, request: SampledRequest) -> Sampling:
        """How the backend will sample this request, its defaults filled in."""
        ...

    async def check_model(self, request: SampledRequest) -> None:
        """Raise the `NOT_FOUND` error the answering methods would raise for a model the
        backend does not serve (none for the served name, a loaded adapter's, or none at
        all): the gateway asks before it classifies a request, so a refused one takes
        no class's decision."""
        ...

    async def chat(
        self,
        request: ChatCompletionRequest,
        *,
        k: int,
        gateway_id: str,
        cap: int | None = None,
        step: StepArgs | None = None,
    ) -> Served[ChatResult]:
        """Answer a chat request at depth k under the gateway's id."""
        ...

    async def completion(
        self,
        request: CompletionRequest,
        *,
        k: int,
        gateway_id: str,
        cap: int | None = None,
        step: StepArgs | None = None,
    ) -> Served[CompletionResult]:
        """Answer a completion request at depth k under the gateway's id."""
        ...

    async def responses(
        self,
        request: ResponsesRequest,
        *,
        k: int,
        gateway_id: str,
        cap: int | None = None,
        step: StepArgs | None = None,
    ) -> Served[ResponsesResult]:
        """Answer a Responses API request at depth k under the gateway's id; the answer's
        id is `resp_<gateway id>`, its one engine request `resp_<gateway id>_0`."""
        ...

    async def models(self) -> ModelList:
        """The served model, as `/v1/models` lists it."""
        ...
