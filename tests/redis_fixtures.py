"""A real `redis-server` on a loopback port, and a delaying TCP proxy, for tests.

Register as a pytest plugin (`pytest_plugins = ["tests.redis_fixtures"]` in the
root conftest) or import the fixtures into a package conftest. The server is
started with an append-only file in a temporary directory, so a stop/start
keeps the data, like a production Redis with persistence; `stop()` and
`start()` let fault tests take it away mid-load. Needs the `redis-server`
binary (Debian package `redis-server`; `make system-deps` installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio
import redis

from tests.clock import until_sync


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process on 127.0.0.1 that can be stopped and restarted."""

    def __init__(
        self, workdir: Path, port: int | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        """`extra_args`: more `redis-server` options (auth, TLS), appended as given."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server not installed: run `make system-deps`")
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_args = tuple(extra_args)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        assert self.proc is None, "already running"
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.workdir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--protected-mode", "no",
            "--loglevel", "warning",
            *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers() -> bool:
            with (
                contextlib.suppress(redis.exceptions.RedisError, OSError),
                self.client() as client,
            ):
                return bool(client.ping())
            return False

        with contextlib.suppress(AssertionError):
            until_sync(answers, timeout_s, poll_s=0.02)
            return
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        """SIGTERM: Redis fsyncs its append-only file and exits; connections drop."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: Redis dies as on a crash or an OOM kill, without a goodbye to its
        clients (the append-only file, fsynced on every write, keeps the data)."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, decode_responses=True)

    def command_calls(self) -> dict[str, int]:
        """`INFO commandstats` as command name -> calls."""
        with self.client() as client:
            info = client.info("commandstats")
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


class DelayProxy:
    """Loopback TCP proxy that holds every chunk for `delay_s` in both directions.

    Simulates a slow Redis (a saturated server, a congested network): commands
    still succeed, only late. Set `delay_s` at any time; 0 passes through.
    """

    def __init__(self, upstream_port: int, delay_s: float = 0.0) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                if self.delay_s > 0:
                    await asyncio.sleep(self.delay_s)
                dst.write(chunk)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            dst.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server per test (about 20 ms to start)."""
    server = RedisServer(tmp_path / "redis")
    server.workdir.mkdir()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def module_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for a whole module (replicas that are real processes share it)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


# Function loop scope: the proxy must run on the same loop as the test that uses it.
@pytest_asyncio.fixture(loop_scope="function")
async def delay_proxy(redis_server: RedisServer) -> AsyncIterator[DelayProxy]:
    proxy = DelayProxy(redis_server.port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
