"""Errors in OpenAI's shape, through the official client and raw HTTP: bodies, keys, limits."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.conftest import ADMIN_KEY, MESSAGES, MODEL, USER_KEY, InProcessGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _post(gw: InProcessGateway, body: Any, key: str | None = USER_KEY) -> Any:
    if isinstance(body, bytes):
        headers = {**gw.auth(key), "content-type": "application/json"}
        return await gw.http.post("/v1/chat/completions", content=body, headers=headers)
    return await gw.http.post("/v1/chat/completions", json=body, headers=gw.auth(key))


@pytest.mark.parametrize(
    ("body", "status", "param_hint"),
    [
        (b'{"model": "specgw-default", "messages": [', 400, None),
        (b"not json at all", 400, None),
        ({"model": MODEL, "messages": "hi"}, 400, "messages"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": MESSAGES, "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": MODEL, "messages": MESSAGES, "max_tokens": 10_000_000}, 400, "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x " * 3000}]}, 400, None),
        ({"model": "no-such-model", "messages": MESSAGES}, 404, "model"),
        ({"model": MODEL, "messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools"),
        ({"model": MODEL, "messages": MESSAGES, "vllm_xargs": {"specgw_k": 4}}, 400, "vllm_xargs"),
        ({"model": MODEL, "messages": MESSAGES, "n": 2}, 400, "n"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "a\x00b"}]}, 400, None),
    ],
    ids=[
        "truncated-json",
        "not-json",
        "messages-not-a-list",
        "no-messages",
        "max-tokens-not-a-number",
        "max-tokens-over-the-context",
        "prompt-over-the-context",
        "unknown-model",
        "tool-without-function",
        "reserved-xargs",
        "several-choices",
        "nul-in-content",
    ],
)
async def test_invalid_requests_get_openai_errors(
    gateway: InProcessGateway, body: Any, status: int, param_hint: str | None
) -> None:
    response = await _post(gateway, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert response.headers["x-request-id"]
    if param_hint:
        assert param_hint in (error["param"] or error["message"])
    assert gateway.runtime.admission.running == 0


async def test_the_client_raises_the_matching_exceptions(gateway: InProcessGateway) -> None:
    client = gateway.client()
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.completions.create(model=MODEL, prompt="word " * 2100, max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"vllm_xargs": {"specgw_k": 0}}
        )


@pytest.mark.parametrize(
    ("key", "status", "kind"),
    [
        (None, 401, openai.AuthenticationError),
        ("sk-wrong", 401, openai.AuthenticationError),
        (ADMIN_KEY, 403, openai.PermissionDeniedError),
    ],
)
async def test_v1_refuses_bad_keys(
    gateway: InProcessGateway, key: str | None, status: int, kind: type[Exception]
) -> None:
    if key is not None:  # the official client always sends one
        with pytest.raises(kind):
            await gateway.client(key, max_retries=0).chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=2
            )
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/completions")]:
        response = await gateway.http.request(
            method, path, json={"model": MODEL, "prompt": "x"}, headers=gateway.auth(key)
        )
        assert response.status_code == status, path
        assert response.json()["error"]["type"] in {"authentication_error", "permission_error"}
    assert gateway.engine.outcomes == []  # nothing reached the engine


async def test_admin_routes_refuse_a_user_key(gateway: InProcessGateway) -> None:
    for path in ("/admin/classes", "/admin/costs", "/admin/flags"):
        user = await gateway.http.get(path, headers=gateway.auth(USER_KEY))
        assert user.status_code == 403, path
        anonymous = await gateway.http.get(path)
        assert anonymous.status_code == 401, path


async def test_a_body_over_the_limit_is_413_before_parsing(gateway: InProcessGateway) -> None:
    limit = gateway.runtime.settings.max_body_bytes
    response = await _post(gateway, b"{" + b" " * limit + b"}")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


async def test_a_wrong_method_names_the_allowed_ones(gateway: InProcessGateway) -> None:
    response = await gateway.http.get("/v1/chat/completions", headers=gateway.auth(USER_KEY))
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


def _unclassified(exposition: str) -> dict[str, float]:
    """`specgw_requests_total` of the class `unclassified`, by status."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "specgw_requests_total" and labels["class_id"] == "unclassified":
                out[labels["status"]] = out.get(labels["status"], 0.0) + sample.value
    return out


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/chat/completions", {"model": "no-such-model", "messages": MESSAGES}, 404),
        ("/v1/completions", {"model": "no-such-model", "prompt": "def f():"}, 404),
        ("/v1/responses", {"model": "no-such-model", "input": "Hello"}, 404),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "a\x00b"}]},
            400,
        ),
        (
            "/v1/chat/completions",
            {"model": MODEL, "messages": MESSAGES, "tools": [{"type": "function"}]},
            400,
        ),
        ("/v1/completions", {"model": MODEL, "prompt": "x", "vllm_xargs": {"specgw_k": 1}}, 400),
    ],
    ids=[
        "unknown-model-chat",
        "unknown-model-completion",
        "unknown-model-responses",
        "body-does-not-parse",
        "nul-in-content",
        "tool-without-function",
        "reserved-xargs",
    ],
)
async def test_a_request_refused_before_classification_takes_no_class(
    gateway: InProcessGateway, path: str, body: dict[str, Any], status: int
) -> None:
    """Refused on its body or its model: no class is created or decided for it, nothing
    reaches the engine, and it is counted as `unclassified` with its status."""
    response = await gateway.http.post(path, json=body, headers=gateway.auth(USER_KEY))
    assert response.status_code == status, response.text
    assert response.json()["error"]["message"]
    assert "x-specgw-class" not in response.headers
    classes = await gateway.http.get("/admin/classes", headers=gateway.auth(ADMIN_KEY))
    assert classes.json()["data"] == []
    assert gateway.engine.outcomes == []
    metrics = await gateway.http.get("/metrics", headers=gateway.auth(ADMIN_KEY))
    assert _unclassified(metrics.text) == {str(status): 1.0}


async def test_bodies_refused_at_the_edge_count_as_unclassified(gateway: InProcessGateway) -> None:
    """A body over the limit (413, before parsing) and one that is not JSON (400) are
    counted like the service's own refusals; a wrong method is no inference request."""
    limit = gateway.runtime.settings.max_body_bytes
    assert (await _post(gateway, b"{" + b" " * limit + b"}")).status_code == 413
    assert (await _post(gateway, b'{"model": "specgw-default", "messages": [')).status_code == 400
    wrong = await gateway.http.get("/v1/chat/completions", headers=gateway.auth(USER_KEY))
    assert wrong.status_code == 405
    metrics = await gateway.http.get("/metrics", headers=gateway.auth(ADMIN_KEY))
    assert _unclassified(metrics.text) == {"413": 1.0, "400": 1.0}
