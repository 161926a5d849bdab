"""The gateway's Redis clients against real servers with `requirepass`, an ACL user and TLS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.exceptions
from pydantic import SecretStr

from gateway.auth import digest
from gateway.settings import GatewaySettings
from gateway.state.connection import RedisConnection
from tests.clock import until
from tests.tenants.limits import KEY_A
from tests.tenants.secure_redis import Pki, SecureRedis, make_pki
from tests.tenants.test_gateway_limits import chat, settings
from tests.unit.conftest import serve_in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")

PASSWORD = "s3cret-Redis-pw"
ADMIN = "sk-tenant-admin"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server(tmp_path: Path, **kwargs: object) -> Iterator[SecureRedis]:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = SecureRedis(workdir, **kwargs)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def requirepass(tmp_path: Path) -> Iterator[SecureRedis]:
    yield from _server(tmp_path, password=PASSWORD)


@pytest.fixture
def acl_tls(tmp_path: Path, pki: Pki) -> Iterator[SecureRedis]:
    """TLS with client certificates, and an ACL user limited to `specgw:*` keys."""
    yield from _server(tmp_path, password=PASSWORD, user="specgw", pki=pki)


async def ping(connection: RedisConnection) -> bool:
    client = connection.client(op_timeout_s=2, connect_timeout_s=2)
    try:
        return bool(await client.ping())
    finally:
        await client.aclose()


async def test_requirepass(requirepass: SecureRedis) -> None:
    assert await ping(RedisConnection(requirepass.url, password=PASSWORD))
    with pytest.raises(redis.exceptions.AuthenticationError):
        await ping(RedisConnection(requirepass.url))
    with pytest.raises(redis.exceptions.AuthenticationError):
        await ping(RedisConnection(requirepass.url, password="wrong"))


async def test_acl_user_over_mutual_tls(acl_tls: SecureRedis, pki: Pki) -> None:
    good = RedisConnection(
        acl_tls.url,
        username="specgw",
        password=PASSWORD,
        tls_ca_file=pki.ca,
        tls_cert_file=pki.client_cert,
        tls_key_file=pki.client_key,
    )
    assert await ping(good)
    no_user = RedisConnection(
        good.url,
        password=PASSWORD,
        tls_ca_file=pki.ca,
        tls_cert_file=pki.client_cert,
        tls_key_file=pki.client_key,
    )
    with pytest.raises(redis.exceptions.AuthenticationError):
        await ping(no_user)  # the default user is off
    no_client_cert = RedisConnection(
        good.url, username="specgw", password=PASSWORD, tls_ca_file=pki.ca
    )
    with pytest.raises(redis.exceptions.ConnectionError):
        await ping(no_client_cert)
    plain = RedisConnection(good.url.replace("rediss://", "redis://"), "specgw", PASSWORD)
    with pytest.raises(redis.exceptions.ConnectionError):
        await ping(plain)


async def test_a_server_certificate_from_another_ca_is_refused(
    acl_tls: SecureRedis, pki: Pki, tmp_path: Path
) -> None:
    other = make_pki(tmp_path / "other")
    stranger = RedisConnection(
        acl_tls.url,
        username="specgw",
        password=PASSWORD,
        tls_ca_file=other.ca,
        tls_cert_file=pki.client_cert,
        tls_key_file=pki.client_key,
    )
    with pytest.raises(redis.exceptions.ConnectionError):
        await ping(stranger)


def test_settings_make_the_connection(tmp_path: Path, pki: Pki) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")  # as a mounted Secret often is
    from_file = GatewaySettings(
        redis_url="rediss://redis.example:6380/0",
        redis_username="specgw",
        redis_password_file=secret,
        redis_tls_ca_file=pki.ca,
    )
    connection = RedisConnection.from_settings(from_file)
    assert connection is not None
    assert connection.password == PASSWORD
    assert PASSWORD not in repr(connection)
    options = connection.options()
    assert options["ssl_ca_certs"] == str(pki.ca)
    assert options["ssl_check_hostname"] is True
    assert RedisConnection.from_settings(GatewaySettings()) is None
    both = from_file.model_copy(update={"redis_password": SecretStr("x")})
    with pytest.raises(ValueError, match="not both"):
        RedisConnection.from_settings(both)


@pytest.mark.parametrize(
    ("url", "files", "message"),
    [
        ("redis://h:6379/0", {"tls_ca_file": "ca"}, "not rediss"),
        ("rediss://h:6379/0", {"tls_cert_file": "client_cert"}, "both"),
        ("http://h:6379/0", {}, "scheme"),
    ],
)
def test_inconsistent_settings_are_refused_at_start(
    url: str, files: dict[str, str], message: str, pki: Pki
) -> None:
    paths = {field: getattr(pki, name) for field, name in files.items()}
    with pytest.raises(ValueError, match=message):
        RedisConnection(url, **paths)


async def test_the_gateway_on_an_acl_user_over_tls(acl_tls: SecureRedis, pki: Pki) -> None:
    """Flag overrides (the admin API), class state and rate limits all reach a TLS Redis as
    a least-privilege user."""
    config = settings(
        {"default": {"requests_per_minute": 3}},
        redis_url=acl_tls.url,
        redis_username="specgw",
        redis_password=PASSWORD,
        redis_tls_ca_file=pki.ca,
        redis_tls_cert_file=pki.client_cert,
        redis_tls_key_file=pki.client_key,
    )
    config = config.model_copy(update={"admin_keys": [digest(ADMIN)]})
    async with serve_in_process(config) as gw:
        for _ in range(3):
            await chat(gw, KEY_A)
        pinned = await gw.http.put("/admin/flags/pin-k", json={"value": 1}, headers=gw.auth(ADMIN))
        assert pinned.status_code == 200, pinned.text
        with acl_tls.client() as admin:
            # The class store flushes every 0.5 s.
            await until(lambda: list(admin.scan_iter(match="specgw:*:class:*")), 5.0)
            assert list(admin.scan_iter(match="specgw:*:rl:*:requests"))
            assert list(admin.scan_iter(match="specgw:*:class:*"))
        ready = (await gw.http.get("/ready")).json()["detail"]
        assert ready["ratelimit"] == "cluster"
        assert ready["redis"] == "ok"
        assert ready["flags_redis"] == "ok"


async def test_the_gateway_on_requirepass(requirepass: SecureRedis) -> None:
    config = settings(
        {"default": {"requests_per_minute": 5}},
        redis_url=requirepass.url,
        redis_password=PASSWORD,
    )
    async with serve_in_process(config) as gw:
        await chat(gw, KEY_A)
        ready = (await gw.http.get("/ready")).json()["detail"]
        assert (ready["ratelimit"], ready["redis"]) == ("cluster", "ok")
    assert requirepass.command_calls().get("evalsha", 0) >= 1
