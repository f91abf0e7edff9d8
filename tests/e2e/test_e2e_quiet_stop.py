"""`atefleet up` stopped under load stops quietly: exit status 0, no traceback from any role in its
output or in any log under its state dir, and no child killed for being slow, while sync calls,
async calls and their webhook deliveries are in flight. Stopped as a terminal's Ctrl-C does it
(SIGINT to `up`'s whole process group) and as `kill` does it (SIGTERM to `up` alone)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from test_e2e_async import ASYNC, bash, resume

from tests.e2e.conftest import ClientThreads, RunningFleet, base_config, free_port, start_fleet, wait_until

#: Client threads, each on its own session, alternating a sync call and an async one with a callback.
SESSIONS = 6
#: How long the receiver takes to answer a delivery (s), so some are in flight at the stop.
DELIVERY_S = 0.3
#: Work seen done before the signal: webhooks delivered and sync answers received.
WARM_DELIVERIES = 10
WARM_ANSWERS = 10


class SlowReceiver:
    """A webhook receiver on loopback that counts deliveries and answers each after DELIVERY_S."""

    def __init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                time.sleep(DELIVERY_S)
                self.send_response(204)
                self.end_headers()
                with receiver.lock:
                    receiver.delivered += 1

            def log_message(self, *args: object) -> None:
                pass

        self.lock = threading.Lock()
        self.delivered = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@pytest.fixture
def receiver() -> Iterator[SlowReceiver]:
    receiver = SlowReceiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    receiver.server.shutdown()


class Load(ClientThreads):
    """Client threads calling until told to stop or until the fleet stops answering."""

    def __init__(self, fleet: RunningFleet, callback_url: str) -> None:
        self.fleet, self.callback_url = fleet, callback_url
        self.answers = 0
        self.lock = threading.Lock()
        super().__init__([f"quiet-{i}" for i in range(SESSIONS)])

    def _run(self, sid: str) -> None:
        hook = {"callback_url": self.callback_url, "callback_secret_id": "test"}
        try:
            with self.fleet.client(timeout_s=60) as c:
                base = resume(c, sid)
                n = 0
                while not self.stop.is_set():
                    c.post(base, json=bash(f"echo {n}", call_id=f"a{n}", **hook), headers=ASYNC)
                    if c.post(base, json=bash(f"sleep 0.05; echo {n}", call_id=f"s{n}")).status_code == 200:
                        with self.lock:
                            self.answers += 1
                    n += 1
        except httpx.HTTPError:
            pass  # the fleet went away under this thread: what the test does on purpose



def _tracebacks(fleet: RunningFleet) -> list[str]:
    """The fleet's output and every log file under its state dir that shows a traceback."""
    logs = [fleet.log_path, *fleet.state_dir.rglob("*.log")]
    return [str(p) for p in logs if p.is_file() and "Traceback" in p.read_text(errors="replace")]


def _ctrl_c(fleet: RunningFleet) -> None:
    os.killpg(fleet.process.pid, signal.SIGINT)


def _sigterm(fleet: RunningFleet) -> None:
    fleet.process.send_signal(signal.SIGTERM)


@pytest.mark.parametrize("stop", [_ctrl_c, _sigterm], ids=["ctrl-c", "sigterm"])
def test_a_stop_under_load_exits_0_without_a_traceback(
    short_tmp: Path, receiver: SlowReceiver, stop: Callable[[RunningFleet], None]
) -> None:
    fleet = start_fleet(short_tmp, base_config(short_tmp, free_port()), own_process_group=True)
    try:
        # given the fleet is busy: sync calls answered, async calls' webhooks delivered
        with Load(fleet, receiver.url) as load:
            wait_until(lambda: receiver.delivered >= WARM_DELIVERIES and load.answers >= WARM_ANSWERS,
                       "the load to get going", 120)
            # when it is told to stop while that goes on
            stop(fleet)
            fleet.process.wait(120)
        # then it exits 0 and no role printed or logged a traceback
        assert fleet.process.returncode == 0, fleet.log()
        assert "atefleet: stopped" in fleet.log() and "did not stop in time" not in fleet.log()
        assert _tracebacks(fleet) == [], fleet.log()
    finally:
        fleet.stop()
