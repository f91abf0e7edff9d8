"""The fleet as users start it: `atefleet --config X up` in a subprocess, talked to over real HTTP."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
import redis
import yaml

from common.ports import free_port
from tests.redis_servers import RedisUnderTest, selected_kind, start_redis

REPO = Path(__file__).resolve().parents[2]

#: API keys of the auth-enabled fleet: (key, environments it may use).
KEY_ALICE = "ak_alice_0123456789abcdef"
KEY_BOB = "ak_bob_0123456789abcdef"
#: The auth fleet keeps finished jobs this long (s), so expiry can be seen in a test.
AUTH_FLEET_JOB_TTL_S = 3
#: ... and answers a sync call still running after this long (s) with 202 + its location.
AUTH_FLEET_SYNC_WAIT_S = 2


@dataclass
class RunningFleet:
    url: str
    process: subprocess.Popen[bytes]
    state_dir: Path
    config_path: Path
    log_path: Path
    #: The server the fleet was given as `redis.url` (tests/redis_servers.py); None: its embedded one.
    redis_server: RedisUnderTest | None = None

    def client(self, token: str | None = None, timeout_s: float = 120) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20000:]

    def children(self) -> dict[str, int]:
        """Role → pid of the fleet's children, read from their command lines (as `ps` shows them);
        `worker-<id>`, and `api-<n>` numbered by pid (the API processes share one command line)."""
        roles: dict[str, int] = {}
        apis: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.process.pid and b"atefleet" in cmd:
                args = [c.decode() for c in cmd if c]
                role = args[args.index("atefleet") + 1]
                if role == "api":
                    apis.append(int(entry.name))
                else:
                    roles[role if role != "worker" else f"worker-{args[-1]}"] = int(entry.name)
        roles.update({f"api-{n}": pid for n, pid in enumerate(sorted(apis))})
        return roles

    def redis_client(self) -> redis.Redis:
        """A client of the fleet's Redis, whichever server that is."""
        if self.redis_server is not None:
            return redis.Redis.from_url(self.redis_server.url)
        d = self.state_dir / "redis"
        return redis.Redis(port=int((d / "port").read_text()), password=(d / "password").read_text().strip())

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.redis_server is not None:
            self.redis_server.stop()


def base_config(tmp: Path, port: int, **overrides: Any) -> dict[str, Any]:
    skills = tmp / "skills"
    (skills / "hello").mkdir(parents=True, exist_ok=True)
    (skills / "hello" / "SKILL.md").write_text(
        "---\nname: hello\ndescription: Says hello.\n---\nRun `echo hello`.\n"
    )
    cfg: dict[str, Any] = {
        "listen": f"127.0.0.1:{port}",
        "state_dir": str(tmp / "state"),
        "environments": [
            {
                "name": "my-env",
                "template": "default-env-template",
                "atespace": "default",
                "skills_dir": "/skills",
                "allowed_tools": [
                    "bash",
                    "read_file",
                    "write_file",
                    "list_dir",
                    "list_skills",
                    "activate_skill",
                    "edit",
                    "process",
                    "stat",
                    "mkdir",
                    "rm",
                ],
                "idle_timeout_s": 20,  # parks sessions tests leave running, so slots free up
            },
            {"name": "other-env", "template": "other-template", "atespace": "default", "idle_timeout_s": 0},
        ],
        "workers": {"processes": 2, "concurrency": 64, "lease_ttl_s": 3},
        "reconciler": {"period_s": 0.5},
        "local_substrate": {
            "slots": 16,
            "stop_grace_s": 1,
            "templates": [{"name": "default-env-template", "skills_dir": str(skills)}],
        },
        "webhooks": {
            "allow_private_targets": True,
            "secrets": {"test": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
        },
        "jobs": {"sync_wait_s": 30},
    }
    cfg.update(overrides)
    return cfg


def wait_until(cond: Callable[[], object], what: str, timeout_s: float = 30) -> None:
    """Poll `cond` until it is true; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextmanager
def few_slots_fleet(
    tmp: Path, slots: int, workers: dict[str, Any] | None = None, **local: Any
) -> Iterator[RunningFleet]:
    """A fleet on `slots` local slots (`local`: more local_substrate settings) and one worker
    process (`workers`: more of its settings), for many more sessions than slots; stopped after."""
    cfg = base_config(tmp, free_port())
    cfg["local_substrate"].update(slots=slots, **local)
    cfg["workers"] = {"processes": 1, "lease_ttl_s": 3, **(workers or {})}
    running = start_fleet(tmp, cfg)
    try:
        yield running
    finally:
        running.stop()


def start_fleet(tmp: Path, cfg: dict[str, Any], own_process_group: bool = False) -> RunningFleet:
    """`atefleet up` on `cfg`, ready. Unless the tests run on the embedded Redis (the default) or
    `cfg` names a Redis, the fleet gets a server of its own as `redis.url` (tests/redis_servers.py).
    With `own_process_group`, `up` leads a process group as in a terminal, so a test can send it a
    terminal's Ctrl-C (SIGINT to the group: `os.killpg`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    server = None
    if selected_kind() != "embedded" and not cfg.get("redis", {}).get("url"):
        server = start_redis(tmp / "redis-under-test")
        cfg = {**cfg, "redis": {**cfg.get("redis", {}), "url": server.url}}
    try:
        return _start_up(tmp, cfg, server, own_process_group)
    except BaseException:
        if server is not None:
            server.stop()
        raise


def _start_up(tmp: Path, cfg: dict[str, Any], server: RedisUnderTest | None,
              own_process_group: bool) -> RunningFleet:
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    log_path = tmp / "fleet.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATEFLEET_", "PROMETHEUS_"))}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "atefleet", "--config", str(config_path), "up"],
            cwd=tmp,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0 if own_process_group else None,
        )
    _, port = cfg["listen"].rsplit(":", 1)
    fleet = RunningFleet(f"http://127.0.0.1:{port}", proc, Path(cfg["state_dir"]), config_path, log_path,
                         server)
    _STARTED.append(fleet)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"atefleet up exited with {proc.returncode}:\n{fleet.log()}")
        try:
            if httpx.get(f"{fleet.url}/readyz", timeout=1).status_code == 200:
                return fleet
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    fleet.stop()
    raise RuntimeError(f"fleet did not become ready:\n{fleet.log()}")


#: Fleets whose log a failure report already shows (a broken session fleet fails many tests).
_LOGGED_FLEETS: set[str] = set()
#: Fleets started since the current test began: its own, not only those it got from fixtures.
_STARTED: list[RunningFleet] = []


def _started_lists() -> list[list[RunningFleet]]:
    """`_STARTED` of each copy of this module: pytest loads it as a conftest, and the tests
    import it again as `tests.e2e.conftest`, whose `start_fleet` appends to its own copy."""
    imported = getattr(sys.modules.get("tests.e2e.conftest"), "_STARTED", None)
    return [_STARTED] if imported is None or imported is _STARTED else [_STARTED, imported]
#: How much of a fleet's log a failure report shows.
FAILURE_LOG_CHARS = 8000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report ends with the tail of the log of each fleet it used, once per fleet:
    on a CI machine that log is the only account of what the fleet was doing."""
    report = yield
    if report.failed:
        used = [(name, value) for name, value in getattr(item, "funcargs", {}).items()
                if isinstance(value, RunningFleet)]
        started = [("started by the test", f) for fleets in _started_lists() for f in fleets]
        for name, fleet in [*used, *started]:
            if fleet.url not in _LOGGED_FLEETS and fleet.log_path.exists():
                _LOGGED_FLEETS.add(fleet.url)
                tail = fleet.log()[-FAILURE_LOG_CHARS:]
                report.sections.append((f"fleet log: {name} (its last lines)", tail))
    if report.when == "teardown":
        for fleets in _started_lists():
            fleets.clear()
    return report


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short state dir for a test's own fleet: unix socket paths under it must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="af-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    """The default fleet: no auth (loopback only), like `make run`."""
    tmp = tmp_path_factory.mktemp("fleet")
    running = start_fleet(tmp, base_config(tmp, free_port()))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def auth_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    """A fleet with API keys: alice may use my-env, bob other-env."""
    tmp = tmp_path_factory.mktemp("auth-fleet")
    keys = [
        {
            "name": "alice",
            "sha256": hashlib.sha256(KEY_ALICE.encode()).hexdigest(),
            "environments": ["my-env"],
        },
        {
            "name": "bob",
            "sha256": hashlib.sha256(KEY_BOB.encode()).hexdigest(),
            "environments": ["other-env", "my-env"],
        },
    ]
    running = start_fleet(
        tmp,
        base_config(
            tmp,
            free_port(),
            auth={"api_keys": keys},
            jobs={"sync_wait_s": AUTH_FLEET_SYNC_WAIT_S, "ttl_s": AUTH_FLEET_JOB_TTL_S},
        ),
    )
    yield running
    running.stop()


class ClientThreads:
    """Client threads, one per argument, each running `_run(arg)` until `stop` is set; as a
    context manager: started on entry, stopped and joined on exit."""

    def __init__(self, args: list[str]) -> None:
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(arg,)) for arg in args]

    def _run(self, arg: str) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
