"""Each served request's outcome, carried back with its reply (`Served`).

A port answers with `Served(reply, outcome)`: the reply as the wire model or the SSE
iterator, and `outcome`, a future the engine resolves as the request leaves it: its
`RequestOutcome`, or None where it ended without one (refused before it ran, the
stream closed early, the engine core died or shut down). TGI's `End` message, as a
future, because vLLM's own serving layer renders the stream.

`OutcomeTap` is the engine's side: the port registers the future under the gateway's
request id before it serves (`serve`), the engine resolves it when the request with
that id (`GATEWAY_ID_ARG`) finishes, before the reply's last chunk is produced, and
resolves it None when the request's stream ends any other way. An entry lives only
while its future is pending, so a request that ends in any way leaves none behind; a
consumer that stops waiting (a stream closed before it was read, so the engine never
saw the request) cancels the future, which drops its entry too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import wraps
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from engine.interface import RequestOutcome

R = TypeVar("R")
P = ParamSpec("P")

#: How the engine's finish reaches the request: its outcome, or None (no outcome came).
Outcome = asyncio.Future[RequestOutcome | None]


@dataclass(frozen=True, slots=True)
class Served(Generic[R]):
    """A port's answer: the reply, and the request's outcome as the engine resolves it."""

    reply: R
    outcome: Outcome


class OutcomeTap:
    """The outcomes one engine owes, by gateway request id, while they are pending."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[str, Outcome] = {}

    def expect(self, gateway_id: str) -> Outcome:
        """A future for the request's outcome, registered before the engine sees it."""
        future: Outcome = asyncio.get_running_loop().create_future()
        self._pending[gateway_id] = future
        future.add_done_callback(lambda done: self._forget(gateway_id, done))
        return future

    async def serve(self, gateway_id: str, answer: Awaitable[R]) -> Served[R]:
        """`answer` (a port's reply, not yet awaited) with its outcome; where it raises,
        the request never ran to an end: its outcome is None."""
        outcome = self.expect(gateway_id)
        try:
            reply = await answer
        except BaseException:
            self.resolve(gateway_id, None)
            raise
        return Served(reply, outcome)

    def resolve(self, gateway_id: str, outcome: RequestOutcome | None) -> None:
        """The request `gateway_id` left the engine: with its outcome, or None without
        one. A later call, or one for an id nobody expects, does nothing."""
        future = self._pending.pop(gateway_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def close(self) -> None:
        """The engine is gone: every pending outcome is None."""
        for gateway_id in list(self._pending):
            self.resolve(gateway_id, None)

    def _forget(self, gateway_id: str, future: Outcome) -> None:
        if self._pending.get(gateway_id) is future:
            del self._pending[gateway_id]

    def __len__(self) -> int:
        return len(self._pending)


class Tapped(Protocol):
    """A serving port whose engine resolves its outcomes in `outcomes`."""

    @property
    def outcomes(self) -> OutcomeTap: ...


T = TypeVar("T", bound=Tapped)


def served(
    answer: Callable[Concatenate[T, P], Awaitable[R]],
) -> Callable[Concatenate[T, P], Coroutine[Any, Any, Served[R]]]:
    """A port's answering method (called with `gateway_id=`) as the port contract has it:
    its reply `Served` with the outcome registered under that id before it runs."""

    @wraps(answer)
    async def serving(port: T, /, *args: P.args, **kwargs: P.kwargs) -> Served[R]:
        gateway_id: Any = kwargs["gateway_id"]
        return await port.outcomes.serve(str(gateway_id), answer(port, *args, **kwargs))

    return serving
