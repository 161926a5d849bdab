"""On the embedded model, two classes of different acceptance end with different k.

The main chat template (what the drafter was trained on; acceptance about 2.5 at
k = 3) and tool-call conversations (never in the drafter's data; about 1.2, flat
beyond k = 2: `engine/default_model/acceptance.md`) are driven through the real
gateway; the controller must tell them apart from live acceptance alone: visible
in `x-specgw-k` and `/admin/classes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import (
    ADMIN_KEY,
    GatewayProcess,
    start_gateway,
    stop_gateway,
)
from tests.models import trained_model

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(not trained_model(), reason="needs the trained embedded model"),
]

ROUNDS = 40


@pytest.fixture(scope="module")
def adaptive_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(tmp_path_factory.mktemp("adaptive"), {"SPECGW_CONTROL_MIN_SAMPLES": "6"})
    yield gw
    stop_gateway(gw)


def _bodies(family: str) -> list[dict[str, object]]:
    from tools.model.corpus import load_corpus
    from tools.model.families import family_prompts

    out: list[dict[str, object]] = []
    for p in family_prompts(load_corpus(), family, "heldout", n=ROUNDS, seed=7):
        body: dict[str, object] = {"model": "specgw-default", "max_tokens": 48, "temperature": 0}
        if p.messages is not None:
            body["messages"] = p.messages
            if p.tools:
                body["tools"] = p.tools
        else:
            body["prompt"] = p.prompt
        out.append(body)
    return out


def test_two_classes_end_with_different_k(adaptive_gateway: GatewayProcess, tmp_path: Path) -> None:
    main, other = _bodies("chat_main"), _bodies("tool_call")
    last: dict[str, tuple[str, int]] = {}
    with adaptive_gateway.http() as http:
        for a, b in zip(main, other, strict=False):
            for name, body in (("main", a), ("other", b)):
                path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
                response = http.post(path, json=body)
                assert response.status_code == 200, response.text
                last[name] = (
                    response.headers["x-specgw-class"],
                    int(response.headers["x-specgw-k"]),
                )
    with adaptive_gateway.http(ADMIN_KEY) as http:
        rows = {r["label"]: r for r in http.get("/admin/classes").json()["data"]}
    main_row, other_row = rows[last["main"][0]], rows[last["other"][0]]
    assert main_row["acceptance_length"] > other_row["acceptance_length"]
    assert main_row["k"] != other_row["k"], (main_row, other_row)
    assert main_row["k"] > other_row["k"]
