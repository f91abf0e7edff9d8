"""RedisSettings: every URL option parsed, unknown ones refused, TLS checked by default, and the
same settings handed to redis-py (arq) unchanged."""

from __future__ import annotations

import ssl

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

from common.redis.settings import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_HEALTH_CHECK_INTERVAL_S,
    RedisSettings,
    RedisSettingsError,
    TlsSettings,
    role_settings,
)


def test_a_plain_url_gives_address_credentials_db_and_defaults() -> None:
    s = RedisSettings.from_url("redis://user:p%40ss@redis.example:6380/3")
    assert (s.host, s.port, s.unix_path, s.username, s.password, s.db) == (
        "redis.example", 6380, None, "user", "p@ss", 3)
    assert s.tls is None
    assert s.connect_timeout_s == DEFAULT_CONNECT_TIMEOUT_S and s.timeout_s is None
    assert s.health_check_interval_s == DEFAULT_HEALTH_CHECK_INTERVAL_S


def test_defaults_of_a_bare_url() -> None:
    s = RedisSettings.from_url("redis://")
    assert (s.host, s.port, s.db, s.username, s.password) == ("localhost", 6379, 0, None, None)


def test_a_unix_url_gives_the_socket_path_and_its_db() -> None:
    s = RedisSettings.from_url("unix://:secret@/run/redis/redis.sock?db=2")
    assert (s.unix_path, s.password, s.db) == ("/run/redis/redis.sock", "secret", 2)


@pytest.mark.parametrize(("option", "field", "value"), [
    ("db=5", "db", 5),
    ("socket_connect_timeout=2.5", "connect_timeout_s", 2.5),
    ("socket_timeout=0.25", "timeout_s", 0.25),
    ("health_check_interval=0", "health_check_interval_s", 0.0),
    ("health_check_interval=15", "health_check_interval_s", 15.0),
])
def test_each_common_option(option: str, field: str, value: object) -> None:
    assert getattr(RedisSettings.from_url(f"redis://h?{option}"), field) == value


def test_tls_checks_the_certificate_and_the_host_name_by_default() -> None:
    tls = RedisSettings.from_url("rediss://h").tls
    assert tls == TlsSettings()
    assert tls.cert_reqs == "required" and tls.check_hostname
    context = tls.context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_each_tls_option() -> None:
    url = ("rediss://h?ssl_ca_certs=/ca.pem&ssl_ca_data=PEM&ssl_certfile=/c.pem&ssl_keyfile=/c.key"
           "&ssl_password=pw&ssl_cert_reqs=optional&ssl_check_hostname=false")
    assert RedisSettings.from_url(url).tls == TlsSettings(
        ca_file="/ca.pem", ca_data="PEM", cert_file="/c.pem", key_file="/c.key", key_password="pw",
        cert_reqs="optional", check_hostname=False)


def test_no_certificate_check_means_no_host_name_check() -> None:
    tls = RedisSettings.from_url("rediss://h?ssl_cert_reqs=none").tls
    assert tls is not None and not tls.check_hostname
    assert tls.context().verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(("url", "named"), [
    ("redis://h?max_connections=5", "'max_connections'"),
    ("redis://h?decode_responses=1", "'decode_responses'"),
    ("redis://h?ssl_ca_certs=/ca.pem", "'ssl_ca_certs' needs a rediss://"),
    ("unix:///s?ssl_cert_reqs=none", "'ssl_cert_reqs' needs a rediss://"),
    ("rediss://h?ssl_cert_reqs=maybe", "'ssl_cert_reqs'"),
    ("rediss://h?ssl_check_hostname=perhaps", "'ssl_check_hostname'"),
    ("rediss://h?ssl_cert_reqs=none&ssl_check_hostname=true", "ssl_check_hostname=true"),
    ("rediss://h?ssl_keyfile=/k", "'ssl_keyfile' needs 'ssl_certfile'"),
    ("rediss://h?ssl_password=pw", "'ssl_password' needs 'ssl_certfile'"),
    ("redis://h?socket_timeout=0", "'socket_timeout'"),
    ("redis://h?socket_timeout=soon", "'socket_timeout'"),
    ("redis://h?socket_connect_timeout=-1", "'socket_connect_timeout'"),
    ("redis://h?db=1&db=2", "'db' is given twice"),
    ("redis://h/x", "database"),
    ("redis://h:port/0", "port"),
    ("http://h", "scheme 'http'"),
    ("unix://", "no socket path"),
])
def test_what_cannot_be_used_is_refused_by_name(url: str, named: str) -> None:
    with pytest.raises(RedisSettingsError, match=named.replace("?", r"\?")):
        RedisSettings.from_url(url)


def test_a_role_refuses_a_bad_or_missing_url_at_start() -> None:
    with pytest.raises(SystemExit, match="atefleet worker: redis.url: .*'retry_on_timeout'"):
        role_settings("worker", "redis://h?retry_on_timeout=1")
    with pytest.raises(SystemExit, match="atefleet api: redis.url .* is required"):
        role_settings("api", "")


def test_repr_hides_secrets() -> None:
    shown = repr(RedisSettings.from_url("rediss://u:hunter2@h?ssl_certfile=/c&ssl_password=swordfish"))
    assert "hunter2" not in shown and "swordfish" not in shown and "***" in shown


def test_redis_py_gets_the_same_settings() -> None:
    # given TLS settings with every option redis-py's asyncio client supports
    url = ("rediss://u:pw@h:6390/4?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/c.key"
           "&socket_timeout=3&socket_connect_timeout=2&health_check_interval=7")
    # when a redis-py pool is made from them
    pool = RedisSettings.from_url(url).connection_pool(max_connections=9)
    # then it connects the same way (host name checked too: redis-py's own default is not to)
    assert pool.connection_class is SSLConnection and pool.max_connections == 9
    kw = pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["username"], kw["password"], kw["db"]) == ("h", 6390, "u", "pw", 4)
    timeouts = (kw["socket_timeout"], kw["socket_connect_timeout"], kw["health_check_interval"])
    assert timeouts == (3.0, 2.0, 7.0)
    assert (kw["ssl_ca_certs"], kw["ssl_certfile"], kw["ssl_keyfile"]) == ("/ca.pem", "/c.pem", "/c.key")
    assert kw["ssl_cert_reqs"] == "required" and kw["ssl_check_hostname"] is True


def test_redis_py_pools_of_plain_and_unix_urls() -> None:
    assert RedisSettings.from_url("redis://h").connection_pool().connection_class is Connection
    unix = RedisSettings.from_url("unix:///tmp/r.sock?db=1").connection_pool()
    assert unix.connection_class is UnixDomainSocketConnection
    assert unix.connection_kwargs["path"] == "/tmp/r.sock" and unix.connection_kwargs["db"] == 1


def test_an_encrypted_client_key_is_refused_for_redis_py() -> None:
    # redis-py's asyncio client cannot open one: arq would fail at its first connection instead
    settings = RedisSettings.from_url("rediss://h?ssl_certfile=/c.pem&ssl_password=pw")
    with pytest.raises(RedisSettingsError, match="ssl_password"):
        settings.connection_pool()
