"""The chart README is generated from the values' `# --` comments and is current; it and
NOTES name the images the chart pulls and how to build and push them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.chart import CHART_DIR, REPO_ROOT, render
from tools import chart_readme


def test_the_chart_readme_is_current() -> None:
    readme = (CHART_DIR / "README.md").read_text(encoding="utf-8")
    assert readme == chart_readme.render(), "stale: run `python -m tools.chart_readme`"
    assert chart_readme.main(["--check"]) == 0


def test_a_changed_comment_makes_the_readme_stale(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    values = chart / "values.yaml"
    text = values.read_text(encoding="utf-8")
    values.write_text(text.replace("# -- Gateway replicas.", "# -- Replicas."), encoding="utf-8")
    assert chart_readme.main(["--check", "--chart", str(chart)]) == 1
    assert chart_readme.main(["--chart", str(chart)]) == 0
    assert "| `replicaCount` | int | `1` | Replicas." in (chart / "README.md").read_text()
    assert chart_readme.main(["--check", "--chart", str(chart)]) == 0


def test_descriptions_follow_the_helm_docs_convention() -> None:
    text = """\
# A note, not a description.
a: 1
# -- Described,
# continued.
b:
  # -- Nested.
  c: "x"
  d: []
e:
  f: null
"""
    docs = {d.key: d for d in chart_readme.rows(text)}
    assert list(docs) == ["a", "b", "b.c", "b.d", "e.f"]
    assert docs["a"].description == ""
    assert docs["b"].description == "Described, continued."
    assert docs["b"].branch
    assert docs["b.c"].description == "Nested."
    assert docs["b.d"].type_name == "list"
    schema = {"properties": {"e": {"properties": {"f": {"type": ["integer", "null"]}}}}}
    assert chart_readme.rows(text, schema)[-1].type_name == "int or null"


def test_every_top_level_value_has_a_row() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text(encoding="utf-8"))
    readme = (CHART_DIR / "README.md").read_text(encoding="utf-8")
    for key in values:
        assert re.search(rf"^\| `{re.escape(key)}(\.|`)", readme, re.M), key


@pytest.mark.parametrize("variant", ["cpu", "cuda"])
def test_notes_say_which_image_to_build_and_push(variant: str) -> None:
    values = {"image": {"repository": "registry.example.com/ml/spec-gateway", "variant": variant}}
    if variant == "cuda":
        values["engine"] = {"model": "org/target"}
    rendered = render(values)
    notes = rendered.templates["spec-gateway/templates/NOTES.txt"]
    image = rendered.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    dockerfile = f"deploy/docker/Dockerfile.{variant}"
    assert (REPO_ROOT / dockerfile).is_file()
    assert f"docker build -f {dockerfile} -t {image} ." in notes
    assert f"docker push {image}" in notes
    assert "names no registry" not in notes
    assert "names no registry" in render().templates["spec-gateway/templates/NOTES.txt"]


def test_the_readme_names_each_variant_dockerfile_and_tag() -> None:
    readme = (CHART_DIR / "README.md").read_text(encoding="utf-8")
    app_version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"]
    for variant in ("cpu", "cuda"):
        assert (REPO_ROOT / f"deploy/docker/Dockerfile.{variant}").is_file()
        assert f"`deploy/docker/Dockerfile.{variant}`" in readme
        assert f"spec-gateway:{app_version}-{variant}" in readme
