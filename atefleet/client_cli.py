"""The CLI for people: `exec`, `sessions`, `jobs`, speaking to the API like any other client.

`ATEFLEET_API_URL` (default http://127.0.0.1:7777) and `ATEFLEET_TOKEN` (a bearer token) say
where and who. Output streams as it is produced (SSE); a spinner shows while a resume runs,
because a template's first resume bakes its golden snapshot and takes a while.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

SPINNER = "|/-\\"


def _client() -> httpx.Client:
    base = os.environ.get("ATEFLEET_API_URL", "http://127.0.0.1:7777")
    token = os.environ.get("ATEFLEET_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base, headers=headers, timeout=httpx.Timeout(120, connect=5))


def _check(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        try:
            body = resp.json()
            msg = f"{body.get('title', resp.reason_phrase)}: {body.get('detail', '')}"
        except ValueError:
            msg = resp.text
        raise SystemExit(f"atefleet: {resp.status_code} {msg}")
    return resp.json()


class Spinner:
    """A progress line on stderr while something slow runs (only on a terminal)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        started = time.monotonic()
        for ch in itertools.cycle(SPINNER):
            if self._done.wait(0.1):
                break
            sys.stderr.write(f"\r{ch} {self.label} ({time.monotonic() - started:.0f} s)")
            sys.stderr.flush()
        sys.stderr.write("\r\033[K")

    def __enter__(self) -> Spinner:
        if sys.stderr.isatty():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def _sse_events(resp: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    event, data = "message", ""
    for line in resp.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif not line and data:
            yield event, json.loads(data)
            event, data = "message", ""


def _exec(c: httpx.Client, env: str, sid: str, cmd: list[str]) -> int:
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise SystemExit("atefleet exec: give a command after --")
    base = f"/v1/environments/{env}/sessions/{sid}"
    state = c.get(base)
    if state.status_code == 404 or (state.status_code == 200 and state.json().get("state") != "running"):
        with Spinner("resuming session (a template's first resume bakes its golden snapshot)"):
            info = _check(c.post(f"{base}/resume"))
        if info.get("cold_start"):
            print(f"(cold start: {info.get('duration_ms', 0) / 1000:.1f} s)", file=sys.stderr)
    body = {"call_id": "cli", "type": "function_call",
            "function": {"name": "bash", "arguments": json.dumps({"command": " ".join(cmd)})}}
    job = _check(c.post(base, json=body, headers={"Prefer": "respond-async"}))
    with c.stream("GET", f"/v1/jobs/{job['id']}/events", timeout=None) as resp:
        for event, data in _sse_events(resp):
            if event == "output":
                (sys.stdout if data.get("stream") == "stdout" else sys.stderr).write(data.get("data", ""))
            elif event == "result":
                return _exit_code(data)
    return 1


def _exit_code(job: dict[str, Any]) -> int:
    if job.get("state") != "succeeded":
        print(f"atefleet: job {job.get('state')}: {json.dumps(job.get('error'))}", file=sys.stderr)
        return 1
    code = (job.get("result") or {}).get("exit_code")
    return int(code) if isinstance(code, int) else 0


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    cells = [[str(r.get(c, "") if r.get(c) is not None else "") for c in cols] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _sessions(c: httpx.Client, args: argparse.Namespace) -> int:
    if not args.environment:
        envs = _check(c.get("/v1/environments"))["environments"]
        print(_table(envs, ["name", "template", "atespace", "idle_timeout_s"]))
        return 0
    base = f"/v1/environments/{args.environment}/sessions"
    if args.action == "ls":
        cursor, rows = "0", []
        while True:
            page = _check(c.get(base, params={"cursor": cursor, "limit": 1000}))
            rows += page["sessions"]
            cursor = page.get("next_cursor") or "0"
            if cursor == "0":
                break
        print(_table(rows, ["session", "state", "actor", "last_activity", "queue_depth"]))
        return 0
    if not args.session:
        raise SystemExit(f"atefleet sessions {args.action}: give ENVIRONMENT SESSION")
    if args.action == "show":
        for k, v in _check(c.get(f"{base}/{args.session}")).items():
            print(f"{k:>20}  {json.dumps(v) if isinstance(v, dict | list) else v}")
    elif args.action == "suspend":
        print(json.dumps(_check(c.post(f"{base}/{args.session}/suspend", params={"force": args.force}))))
    else:
        print(json.dumps(_check(c.delete(f"{base}/{args.session}",
                                         params={"keep_snapshot": args.keep_snapshot}))))
    return 0


def run_client_command(args: argparse.Namespace) -> int:
    with _client() as c:
        try:
            if args.command == "exec":
                return _exec(c, args.environment, args.session, list(args.cmd))
            if args.command == "sessions":
                return _sessions(c, args)
            print(json.dumps(_check(c.get(f"/v1/jobs/{args.job_id}")), indent=2))
            return 0
        except httpx.ConnectError as err:
            raise SystemExit(f"atefleet: cannot reach the API at {c.base_url} ({err}); is `make run` up?") \
                from None
