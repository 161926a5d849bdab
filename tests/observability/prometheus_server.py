"""A real Prometheus on a loopback port, scraping what a test's config names.

Needs the `prometheus` binary (Debian package `prometheus`; `make system-deps`): the
`prometheus_binary` fixture (tests/observability/conftest.py) skips a test without it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.clock import until_sync
from tests.gateway.conftest import free_port


@contextmanager
def running_prometheus(binary: str, workdir: Path, config: dict[str, Any]) -> Iterator[str]:
    """Prometheus on `config` (written to `workdir`, its data kept there), ready; its base
    URL. Stopped at the end."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (workdir / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            until(lambda: httpx.get(f"{base}/-/ready", timeout=2).status_code == 200, 60)
            yield base
        finally:
            proc.terminate()
            proc.wait(30)


def until(check: Callable[[], object], timeout_s: float) -> None:
    """Poll `check` (an HTTP error counts as not yet) until it holds."""

    def holds() -> object:
        try:
            return check()
        except httpx.HTTPError:
            return False

    try:
        until_sync(holds, timeout_s, poll_s=0.5)
    except AssertionError:
        raise TimeoutError(f"condition not met in {timeout_s} s") from None
