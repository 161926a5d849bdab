"""Malformed bodies against each body-taking endpoint: always an OpenAI-shaped 4xx.

hypothesis builds bodies that are invalid by construction (bytes that are not
JSON, JSON of the wrong shape, required fields missing or of the wrong type,
deep nesting, control characters and lone surrogates in text, unknown models)
and sends each to a real gateway process. Every answer must be a 4xx with
`{"error": {"message", "type", "code"}}` and an `x-request-id`; a 5xx, a hang
or a 200 fails the test.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import ADMIN_KEY, USER_KEY, GatewayProcess

pytestmark = pytest.mark.engine

CHAT: dict[str, Any] = {"model": "specgw-default", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION: dict[str, Any] = {"model": "specgw-default", "prompt": "hi"}
VALID: dict[str, dict[str, Any]] = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION}
ENDPOINTS = sorted(VALID)
EXAMPLES = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner)
)
#: Never coerced by pydantic into a string, number, or bool field.
containers = st.lists(json_values, min_size=1, max_size=3) | st.dictionaries(
    st.text(min_size=1), json_values, min_size=1, max_size=3
)
bad_chars = st.sampled_from(["\x00", "\x01", "\x07", "\x1b", "\x7f\x00", "\ud800", "\udfff"])


def _post(gw: GatewayProcess, path: str, content: bytes, key: str = USER_KEY) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    return httpx.post(gw.base_url + path, content=content, headers=headers, timeout=60)


def assert_openai_4xx(response: httpx.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    assert response.headers.get("x-request-id"), dict(response.headers)
    error = response.json()["error"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["type"], str)
    assert error["type"]
    assert "code" in error


def _dumps(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=True).encode()


@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@EXAMPLES
def test_not_json(shared_gateway: GatewayProcess, raw: bytes) -> None:
    try:
        json.loads(raw)
    except ValueError:
        pass
    else:
        raw = raw + b"}"  # make it invalid JSON
    for path in ENDPOINTS:
        assert_openai_4xx(_post(shared_gateway, path, raw))


@given(body=json_scalars | st.lists(json_values, max_size=3))
@EXAMPLES
def test_wrong_top_level_type(shared_gateway: GatewayProcess, body: Any) -> None:
    for path in ENDPOINTS:
        assert_openai_4xx(_post(shared_gateway, path, _dumps(body)))


REQUIRED = {"/v1/chat/completions": ["messages"], "/v1/completions": ["prompt"]}
TYPED = {
    "/v1/chat/completions": ["messages", "model", "max_tokens", "temperature", "stream", "stop",
                             "tools", "n", "top_p", "seed", "tool_choice", "logprobs"],
    "/v1/completions": ["prompt", "model", "max_tokens", "temperature", "stream", "stop", "n",
                        "top_p", "seed", "echo", "logprobs"],
}  # fmt: skip


@given(data=st.data())
@EXAMPLES
def test_missing_or_wrongly_typed_field(shared_gateway: GatewayProcess, data: Any) -> None:
    path = data.draw(st.sampled_from(ENDPOINTS))
    body = dict(VALID[path])
    if data.draw(st.booleans()):
        del body[data.draw(st.sampled_from(REQUIRED[path]))]
    else:
        field = data.draw(st.sampled_from(TYPED[path]))
        wrong = (
            containers
            if field not in ("messages", "prompt", "stop", "tools")
            else st.one_of(
                st.integers(), st.booleans(), st.dictionaries(st.text(), json_values, max_size=2)
            )
        )
        body[field] = data.draw(wrong)
    assert_openai_4xx(_post(shared_gateway, path, _dumps(body)))


@given(
    depth=st.integers(min_value=20, max_value=3000),
    kind=st.sampled_from(["list", "dict"]),
    path=st.sampled_from(ENDPOINTS),
)
@EXAMPLES
def test_deeply_nested_values(
    shared_gateway: GatewayProcess, depth: int, kind: str, path: str
) -> None:
    open_, close = ("[", "]") if kind == "list" else ('{"a":', "}")
    nested = open_ * depth + "1" + close * depth
    field = "messages" if path.endswith("chat/completions") else "prompt"
    raw = f'{{"model":"specgw-default","{field}":{nested}}}'.encode()
    assert_openai_4xx(_post(shared_gateway, path, raw))


@given(
    prefix=st.text(max_size=20),
    bad=bad_chars,
    suffix=st.text(max_size=20),
    where=st.sampled_from(["chat", "chat_parts", "completion", "completion_list", "stop"]),
)
@EXAMPLES
def test_control_characters_and_surrogates(
    shared_gateway: GatewayProcess, prefix: str, bad: str, suffix: str, where: str
) -> None:
    text = prefix + bad + suffix
    path, body = "/v1/chat/completions", dict(CHAT)
    if where == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    elif where == "chat_parts":
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": text}]}]
    elif where == "stop":
        body["stop"] = [text]
    else:
        path, body = "/v1/completions", dict(COMPLETION)
        body["prompt"] = text if where == "completion" else ["ok", text]
    response = _post(shared_gateway, path, _dumps(body))
    assert_openai_4xx(response)
    assert response.status_code == 400


@given(model=st.text(min_size=1, max_size=40).filter(lambda m: m != "specgw-default"))
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_unknown_model_is_404(shared_gateway: GatewayProcess, model: str) -> None:
    response = _post(shared_gateway, "/v1/chat/completions", _dumps({**CHAT, "model": model}))
    assert_openai_4xx(response)


@given(value=json_values)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_admin_flag_bodies(shared_gateway: GatewayProcess, value: Any) -> None:
    """Flag writes with malformed bodies are 4xx (or 503: no Redis behind this replica)."""
    response = httpx.put(
        f"{shared_gateway.base_url}/admin/flags/no-such-flag",
        content=_dumps(value),
        headers={"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code in (*range(400, 500), 503), response.text
    assert response.headers.get("x-request-id")
    assert "error" in response.json()


@pytest.mark.parametrize("path", ENDPOINTS)
def test_oversized_body_is_413(shared_gateway: GatewayProcess, path: str) -> None:
    big = _dumps({**VALID[path], "padding": "x" * (5 * 1024 * 1024)})
    response = _post(shared_gateway, path, big)
    assert response.status_code == 413, response.text[:300]
    assert response.json()["error"]["code"] == "payload_too_large"


def _chunked_oversized() -> Any:
    yield b'{"model":"specgw-default","padding":"'
    for _ in range(80):
        yield b"x" * 65536
    yield b'"}'


@pytest.mark.parametrize("path", ENDPOINTS)
def test_oversized_chunked_body_is_refused(shared_gateway: GatewayProcess, path: str) -> None:
    """No content-length: the streamed body is counted as it arrives and refused with a 4xx."""
    headers = {"authorization": f"Bearer {USER_KEY}", "content-type": "application/json"}
    response = httpx.post(
        shared_gateway.base_url + path, content=_chunked_oversized(), headers=headers
    )
    assert_openai_4xx(response)


# Regressions for the gateway bugs this suite found (fixed in 4ee9d43).


def test_oversized_body_413_has_request_id(shared_gateway: GatewayProcess) -> None:
    big = _dumps({**CHAT, "padding": "x" * (5 * 1024 * 1024)})
    assert_openai_4xx(_post(shared_gateway, "/v1/chat/completions", big))


def test_oversized_chunked_body_is_413(shared_gateway: GatewayProcess) -> None:
    headers = {"authorization": f"Bearer {USER_KEY}", "content-type": "application/json"}
    url = shared_gateway.base_url + "/v1/chat/completions"
    response = httpx.post(url, content=_chunked_oversized(), headers=headers)
    assert response.status_code == 413, response.text[:300]


def test_completion_without_prompt_is_400(shared_gateway: GatewayProcess) -> None:
    assert_openai_4xx(_post(shared_gateway, "/v1/completions", _dumps({"model": "specgw-default"})))


def test_chat_messages_not_a_list_is_400(shared_gateway: GatewayProcess) -> None:
    body = {"model": "specgw-default", "messages": 5}
    assert_openai_4xx(_post(shared_gateway, "/v1/chat/completions", _dumps(body)))
