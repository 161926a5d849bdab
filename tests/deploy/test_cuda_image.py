"""The CUDA image installs exactly what the CUDA test tier tested.

`make cuda-env` (the tier's environment, built in CI without Docker) and
deploy/docker/Dockerfile.cuda must run the same pip command: the same constraints file,
the same `cuda` extra (the image leaves out `dev`), no other requirement; and the
constraints file must pin what pyproject pins.
"""

from __future__ import annotations

import ast
import io
import re
import shlex
import tomllib

from dockerfile_parse import DockerfileParser

from tests.deploy.chart import REPO_ROOT

CONSTRAINTS = "deploy/constraints/cuda.txt"
MAKE_VARIABLE = re.compile(r"^([A-Z_]+)\s*[:?]?=\s*(.*)$")


def _make_variables(makefile: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in makefile.splitlines():
        match = MAKE_VARIABLE.match(line)
        if match:
            found.setdefault(match.group(1), match.group(2).strip())
    return found


def _expand(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables.get(m.group(1), m.group(0)), text)


def _pip_install(command: str) -> tuple[str | None, list[str], set[str]]:
    """(constraints file, requirements, options) of one `pip install` command."""
    words = shlex.split(command)
    words = words[words.index("install") + 1 :]
    if "&&" in words:
        words = words[: words.index("&&")]
    constraints: str | None = None
    requirements: list[str] = []
    options: set[str] = set()
    it = iter(words)
    for word in it:
        if word == "-c":
            constraints = next(it)
        elif word.startswith("-"):
            options.add(word)
        else:
            requirements.append(word)
    return constraints, requirements, options


def _make_cuda_env_install() -> tuple[str | None, list[str], set[str]]:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("$(CUDA_STAMP): ", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in recipe.splitlines() if "pip install" in line]
    assert len(lines) == 1, lines
    return _pip_install(_expand(lines[0], _make_variables(makefile)))


def _dockerfile_install() -> tuple[str | None, list[str], set[str]]:
    path = REPO_ROOT / "deploy" / "docker" / "Dockerfile.cuda"
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    runs = [i["value"] for i in parser.structure if i["instruction"] == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 1, installs
    return _pip_install(installs[0])


def _extras(requirement: str) -> set[str]:
    match = re.fullmatch(r"\.\[([a-z,]+)\]", requirement)
    assert match, requirement
    return set(match.group(1).split(","))


def test_image_and_cuda_env_install_with_the_same_constraints_and_extra() -> None:
    make_c, make_reqs, make_opts = _make_cuda_env_install()
    docker_c, docker_reqs, docker_opts = _dockerfile_install()
    assert make_c == docker_c == CONSTRAINTS
    assert (REPO_ROOT / CONSTRAINTS).is_file()
    assert len(make_reqs) == 1
    assert _extras(make_reqs[-1]) == {"cuda", "dev"}
    assert _extras(docker_reqs[0]) == {"cuda"}
    assert len(docker_reqs) == 1
    # Nothing that would let pip step outside the constraints (another index, no deps).
    for options in (make_opts, docker_opts):
        assert options <= {"-q", "-e", "--no-cache-dir"}, options


def test_the_image_copies_the_constraints_file_it_installs_with() -> None:
    path = REPO_ROOT / "deploy" / "docker" / "Dockerfile.cuda"
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    copies = [i["value"].split() for i in parser.structure if i["instruction"] == "COPY"]
    assert [CONSTRAINTS, f"./{CONSTRAINTS}"] in copies


def _pins(lines: list[str]) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lines:
        line = line.split(";")[0].strip()
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[re.sub(r"\[.*\]", "", name).strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_the_constraints_pin_the_tested_vllm_and_every_pyproject_pin() -> None:
    constraints = _pins((REPO_ROOT / CONSTRAINTS).read_text(encoding="utf-8").splitlines())
    assert constraints["vllm"] == "0.33.0"
    assert constraints["torch"] == "2.14.0"
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = _pins(
        project["dependencies"]
        + project["optional-dependencies"]["cuda"]
        + project["optional-dependencies"]["dev"]
    )
    drift = {
        name: (version, constraints.get(name))
        for name, version in declared.items()
        if constraints.get(name) != version
    }
    assert drift == {}, "pyproject pins changed: run `make cuda-constraints`"


def _driver_floor() -> dict[int, int]:
    """The engine's start-up check's table (`engine.vllm.preflight.CUDA_DRIVER_FLOOR`), read
    from its source: importing the module imports vLLM."""
    tree = ast.parse((REPO_ROOT / "engine" / "vllm" / "preflight.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "CUDA_DRIVER_FLOOR"
            and node.value is not None
        ):
            floor: dict[int, int] = ast.literal_eval(node.value)
            return floor
    raise AssertionError("engine/vllm/preflight.py has no CUDA_DRIVER_FLOOR")


def _final_stage_runs() -> str:
    path = REPO_ROOT / "deploy" / "docker" / "Dockerfile.cuda"
    structure = DockerfileParser(fileobj=io.BytesIO(path.read_bytes())).structure
    last_from = max(i for i, ins in enumerate(structure) if ins["instruction"] == "FROM")
    return " ".join(i["value"] for i in structure[last_from:] if i["instruction"] == "RUN")


def test_the_image_has_a_cpp_host_compiler_for_jit_builds() -> None:
    """nvcc (FlashInfer's JIT kernels) needs a C++ host compiler; Triton's launchers a C one."""
    packages = set(_final_stage_runs().split())
    assert {"gcc", "g++", "libc6-dev"} <= packages


def test_the_driver_floor_of_the_pinned_cuda_is_documented() -> None:
    """The image ships no cuda-compat libraries, so the engine refuses an older driver at
    start: every place an operator reads before installing names the floor it checks for
    the pinned CUDA runtime."""
    constraints = _pins((REPO_ROOT / CONSTRAINTS).read_text(encoding="utf-8").splitlines())
    major = int(constraints["nvidia-cuda-runtime"].split(".")[0])
    stated = f"NVIDIA driver {_driver_floor()[major]} or newer"
    for doc in (
        "deploy/docker/Dockerfile.cuda",
        "deploy/OPERATIONS.md",
        "helm/spec-gateway/values.yaml",
        "helm/spec-gateway/templates/NOTES.txt",
    ):
        text = " ".join((REPO_ROOT / doc).read_text(encoding="utf-8").replace("#", " ").split())
        assert stated in text, f"{doc} does not say {stated!r}"
