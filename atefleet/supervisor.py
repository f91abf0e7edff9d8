"""`atefleet up`: start every role of the fleet on one host and keep them running.

Start order follows dependencies: Redis (embedded unless `redis.url` is set), local Substrate
(unless `ate.ateapi` is set), then the API, the workers, the reconciler and the webhook deliverer.
A child that exits on its own is logged and restarted with backoff. Ctrl-C / SIGTERM stops them in
the reverse order, so the API stops taking work before workers stop, workers finish or hand back
their sessions before Substrate and Redis go away, and Redis flushes its AOF last.

Secrets (the Redis URL with its password) reach children through the environment, never argv,
so `ps` shows only `python -m atefleet <role> ...`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.child_process import start_owned
from common.config import Config
from common.embedded_redis import EmbeddedRedis, rotate_log, start_embedded_redis
from common.file_lock import try_lock
from common.ports import free_port
from common.secret_box import KEY_ENV, load_key
from local_substrate.isolation import describe as describe_isolation

log = logging.getLogger("atefleet.supervisor")

#: Seconds a child gets to exit after SIGTERM before SIGKILL.
STOP_GRACE_S = 15.0
#: Restart backoff bounds (seconds) for a child that keeps crashing.
RESTART_BACKOFF_MIN_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
#: A child that ran this long before exiting is considered healthy again (backoff resets).
HEALTHY_AFTER_S = 30.0

#: All the local Substrate gets of the fleet's environment. It serves gRPC and runs sandboxes:
#: it never needs the fleet key or Redis, so neither (nor the operator's other variables) is in
#: its memory for a sandbox escape, a core dump or /proc to show.
SUBSTRATE_ENV = (
    "PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER", "LOGNAME", "PYTHONPATH", "PYTHONUNBUFFERED",
    "PROMETHEUS_MULTIPROC_DIR", "ATEFLEET_CONFIG", "ATEFLEET_STATE_DIR", "ATEFLEET_ATEAPI",
)  # fmt: skip


@dataclass
class Child:
    """One supervised role process."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = RESTART_BACKOFF_MIN_S
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> None:
        # Own process group (common.child_process): a terminal's Ctrl-C reaches only the
        # supervisor, which then stops the children in order instead of all at once.
        self.process = start_owned(self.argv, env=self.env, stdin=subprocess.DEVNULL)
        self.started_at = time.monotonic()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, deadline: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("child did not stop in time; killing", extra={"fields": {"child": self.name}})
            self.process.kill()
            self.process.wait()


class Supervisor:
    def __init__(self, config: Config, config_path: str | None) -> None:
        self.config = config
        self.config_path = config_path
        self.state_dir = Path(config.state_dir).resolve()
        self.redis: EmbeddedRedis | None = None
        self.children: list[Child] = []
        self._stopping = asyncio.Event()
        self._lock_fd: int | None = None

    # -- start -------------------------------------------------------------------------------

    def _lock_state_dir(self) -> None:
        """One `up` per state dir. flock is released by the kernel on exit, so no stale lock."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = try_lock(self.state_dir / "up.lock")
        if self._lock_fd is None:
            raise SystemExit(f"another `atefleet up` is running with state dir {self.state_dir}")

    def _base_env(self) -> dict[str, str]:
        env = dict(os.environ)
        metrics_dir = self.state_dir / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        env["ATEFLEET_STATE_DIR"] = str(self.state_dir)
        env["PYTHONUNBUFFERED"] = "1"
        # Made (or read) once here so every child seals and opens env vars with the same key.
        env[KEY_ENV] = base64.b64encode(load_key(self.state_dir, env)).decode()
        if self.config_path:
            env["ATEFLEET_CONFIG"] = str(Path(self.config_path).resolve())
        return env

    def _role(self, name: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "atefleet", name, *args]

    def _plan(self, env: dict[str, str]) -> tuple[list[Child], str]:
        """The children to start, in start order, and the local Substrate address ('' if external)."""
        children: list[Child] = []
        substrate_addr = ""
        if not self.config.ate.ateapi:
            # The others find it through its status.json (see common.routing), as `ate.ateapi`
            # empty means "the embedded local Substrate" to every role.
            taken = {self.config.listen_host_port[1], *([self.redis.port] if self.redis else [])}
            substrate_addr = f"127.0.0.1:{free_port(taken)}"
            children.append(Child("local-substrate",
                                  self._role("local-substrate", "--listen", substrate_addr)))
        for i in range(self.config.api.processes):
            children.append(Child(f"api-{i}", self._role("api")))
        for i in range(self.config.workers.processes):
            children.append(Child(f"worker-{i}", self._role("worker", "--id", f"w{i}")))
        children.append(Child("reconciler", self._role("reconciler")))
        children.append(Child("webhooks", self._role("webhooks")))
        for child in children:
            child.env = env if child.name != "local-substrate" else {
                k: v for k, v in env.items() if k in SUBSTRATE_ENV}
        return children, substrate_addr

    def start(self) -> None:
        self._lock_state_dir()
        env = self._base_env()
        if not self.config.redis.url:
            # Not the API's port: a test (or user) may have picked it free a moment ago.
            self.redis = start_embedded_redis(self.state_dir / "redis", settings=self.config.redis,
                                              avoid={self.config.listen_host_port[1]})
            env["ATEFLEET_REDIS_URL"] = self.redis.url
            log.info("embedded redis started", extra={"fields": {"port": self.redis.port}})
        self.children, substrate_addr = self._plan(env)
        for child in self.children:
            child.start()
            if child.name == "local-substrate":
                self._wait_substrate_ready(child)
        self._announce(substrate_addr)

    def _substrate_status(self) -> dict[str, object] | None:
        path = self.state_dir / "local-substrate" / "status.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _wait_substrate_ready(self, child: Child, timeout_s: float = 60.0) -> None:
        """Wait until local Substrate serves (it then writes status.json), or fail if it exits."""
        path = self.state_dir / "local-substrate" / "status.json"
        started = time.time()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if path.exists() and path.stat().st_mtime >= started - 1:
                return
            if child.process is not None and child.process.poll() is not None:
                raise SystemExit(f"atefleet: local-substrate exited with {child.process.returncode} "
                                 "at start (see its log above)")
            time.sleep(0.05)
        log.warning("local substrate did not report ready in time; continuing")

    def _announce(self, substrate_addr: str) -> None:
        _, port = self.config.listen_host_port
        host = self.config.api_bind_host
        url_host = "127.0.0.1" if host == "0.0.0.0" else host
        status = self._substrate_status() or {}
        sandbox = status.get("sandbox", "n/a (external Substrate)" if not substrate_addr else "unknown")
        print(f"atefleet is up: API http://{url_host}:{port}  (listening on {host}:{port}"
              f"{'' if self.config.auth.enabled else ', loopback only: no auth configured'};"
              " /healthz /metrics)", flush=True)
        print(f"  redis: {'embedded, ' + str(self.state_dir / 'redis') if self.redis else 'external'}"
              f"  substrate: {substrate_addr or self.config.ate.ateapi} (sandbox: {sandbox})"
              f"  workers: {self.config.workers.processes}", flush=True)
        isolation = status.get("isolation")
        for line in describe_isolation(isolation) if isinstance(isolation, dict) else []:
            print(f"  {line}", flush=True)

    # -- supervise ---------------------------------------------------------------------------

    async def supervise(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        while not self._stopping.is_set():
            self._restart_exited()
            try:
                await asyncio.wait_for(self._stopping.wait(), 0.2)
            except TimeoutError:
                pass

    def _restart_exited(self) -> None:
        now = time.monotonic()
        if self.redis is not None and self.redis.process.poll() is not None:
            log.error("embedded redis exited; restarting on the same port")
            self.redis = start_embedded_redis(self.redis.data_dir, port=self.redis.port,
                                              settings=self.config.redis)
        if self.redis is not None:
            rotate_log(self.redis.data_dir, self.config.redis.log_max_mb * 1024 * 1024)
        for child in self.children:
            proc = child.process
            if proc is None or proc.poll() is None:
                continue
            if now - child.started_at < child.backoff_s:
                continue
            healthy_run = now - child.started_at > HEALTHY_AFTER_S
            child.backoff_s = RESTART_BACKOFF_MIN_S if healthy_run else min(child.backoff_s * 2,
                                                                            RESTART_BACKOFF_MAX_S)
            child.restarts += 1
            log.error("child exited; restarting", extra={"fields": {
                "child": child.name, "exit_code": proc.returncode, "restarts": child.restarts}})
            print(f"atefleet: {child.name} exited with {proc.returncode}; restarting", flush=True)
            child.start()

    def stop(self) -> None:
        """Stop children in reverse start order, each tier given STOP_GRACE_S, then Redis."""
        print("atefleet: stopping...", flush=True)
        tiers = [
            [c for c in self.children if c.name.startswith("api-")],
            [c for c in self.children if c.name.startswith("worker-")],
            [c for c in self.children if c.name in ("reconciler", "webhooks")],
            [c for c in self.children if c.name == "local-substrate"],
        ]
        for tier in tiers:
            for child in tier:
                child.stop()
            deadline = time.monotonic() + STOP_GRACE_S
            for child in tier:
                child.wait_stopped(deadline)
        if self.redis is not None:
            self.redis.stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        print("atefleet: stopped", flush=True)


def run_up(config: Config, config_path: str | None) -> None:
    sup = Supervisor(config, config_path)
    try:
        sup.start()
        asyncio.run(sup.supervise())
    finally:
        sup.stop()
