"""The CLI for people: every API operation as a command, built on the SDK (`atefleet.client`).

`ATEFLEET_API_URL` (default http://127.0.0.1:7777) and `ATEFLEET_TOKEN` say where and who (or
`--api-url` / `--token`). Every command takes `--json` (machine-readable output: one JSON document,
or JSON lines for streams); otherwise tables and progress come from rich. A failed call exits 1
with its problem's title and detail (exit 2 for usage errors, `exec` exits with the command's code).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rich.console import Console
from rich.table import Table

from atefleet.client import Client, Job, OutputChunk
from atefleet.client.errors import AtefleetError, NotFoundError, ProblemError
from atefleet.client_cp import copy

Handler = Callable[[Client, argparse.Namespace], int]

#: Session columns shown by `sessions ls`.
SESSION_COLUMNS = ("session", "state", "last_activity", "queue_depth", "running_job")


def add_client_commands(sub: Any) -> None:
    """Add the client commands to the `atefleet` parser's subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--api-url", default=None, help="default: $ATEFLEET_API_URL or http://127.0.0.1:7777")
    common.add_argument("--token", default=None, help="bearer token (default: $ATEFLEET_TOKEN)")

    def command(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=help, parents=[common])
        parser.set_defaults(client_handler=handler)
        return parser

    e = command("exec", _exec, "run a shell command in a session and stream its output")
    _session_args(e)
    e.add_argument("cmd", nargs="*", help="-- COMMAND... (options go before the --)")
    c = command("call", _call, "run any tool: atefleet call ENV SID TOOL '{\"path\": \"x\"}'")
    _session_args(c)
    c.add_argument("tool")
    c.add_argument("arguments", nargs="?", default="{}", help="the tool's arguments as a JSON object")
    cp = command("cp", _cp, "copy a file to or from a session: cp LOCAL ENV/SID:PATH, cp ENV/SID:PATH LOCAL")
    cp.add_argument("source")
    cp.add_argument("destination")
    for action, help in (("resume", "create (if needed) and resume a session"),
                         ("suspend", "suspend a session (after its queued calls)"),
                         ("destroy", "destroy a session")):
        lc = command(action, _lifecycle, help)
        _session_args(lc)
        lc.set_defaults(action=action)
        if action == "suspend":
            lc.add_argument("--force", action="store_true", help="even with background processes running")
        if action == "destroy":
            lc.add_argument("--keep-snapshot", action="store_true")
    s = command("sessions", _sessions, "list environments, list or show sessions")
    s.add_argument("action", choices=["ls", "show"], nargs="?", default="ls")
    s.add_argument("environment", nargs="?")
    s.add_argument("session", nargs="?")
    j = command("jobs", _jobs, "show, wait for, cancel or tail a job")
    j.add_argument("action", choices=["show", "wait", "cancel", "tail"])
    j.add_argument("job_id")
    j.add_argument("--timeout", type=float, default=None, help="wait: give up after this many seconds")
    b = command("batch", _batch, "submit JSON lines of calls (each with environment and session)")
    b.add_argument("file", help="JSON lines file, or - for stdin")
    b.add_argument("--wait", action="store_true", help="wait for every job and print each as it ends")
    t = command("tools", _tools, "print an environment's tool definitions")
    t.add_argument("environment")
    t.add_argument("--format", choices=["openai", "anthropic"], default="openai")
    command("capacity", _capacity, "Substrate workers, sessions running / parked / waiting")
    a = command("audit", _audit, "audit records (admin scope)")
    for name in ("principal", "session", "since", "until"):
        a.add_argument(f"--{name}", default="")
    a.add_argument("--limit", type=int, default=100)
    d = command("dlq", _dlq, "dead-lettered jobs: ls, show, replay (admin scope), discard")
    d.add_argument("action", choices=["ls", "show", "replay", "discard"], nargs="?", default="ls")
    d.add_argument("entry_id", nargs="?", help="an id from `atefleet dlq ls`")


def _session_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("environment")
    parser.add_argument("session")


def run_client_command(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    with Client(args.api_url, args.token) as client:
        try:
            handler: Handler = args.client_handler
            return handler(client, args)
        except ProblemError as err:
            detail = f": {err.problem.detail}" if err.problem.detail else ""
            console.print(f"[red]atefleet: {err.status} {err.problem.title}{detail}[/red]", markup=True,
                          highlight=False)
            return 1
        except AtefleetError as err:
            console.print(f"atefleet: {err} (API at {client.settings.base_url}; is `make run` up?)",
                          markup=False, highlight=False)
            return 1


# ---- output ----------------------------------------------------------------------------------


def _print_json(value: Any) -> None:
    print(json.dumps(_plain(value), indent=2))


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _table(rows: Iterable[dict[str, Any]], columns: Iterable[str]) -> None:
    table = Table(*[c.upper() for c in columns])
    cols = list(columns)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in cols))
    Console().print(table)


def _fields(value: dict[str, Any]) -> None:
    table = Table(show_header=False, box=None)
    for key, item in value.items():
        table.add_row(key, json.dumps(item) if isinstance(item, dict | list) else str(item))
    Console().print(table)


def _show(args: argparse.Namespace, value: Any) -> int:
    if args.json:
        _print_json(value)
    else:
        _fields(_plain(value))
    return 0


# ---- commands --------------------------------------------------------------------------------


def _exec(client: Client, args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if not cmd:
        raise SystemExit("atefleet exec: give a command after --")
    session = client.session(args.environment, args.session)
    _ensure_running(session, args)
    return _follow(client.stream(session.submit("bash", {"command": " ".join(cmd)})), args)


def _ensure_running(session: Any, args: argparse.Namespace) -> None:
    try:
        running = session.view().state == "running"
    except NotFoundError:
        running = False
    if running:
        return
    slow = "resuming session (a template's first resume bakes its golden snapshot)"
    with Console(stderr=True).status(slow):
        info = session.resume()
    if info.get("cold_start") and not args.json:
        print(f"(cold start: {info.get('duration_ms', 0) / 1000:.1f} s)", file=sys.stderr)


def _follow(events: Iterator[OutputChunk | Job], args: argparse.Namespace) -> int:
    """Print a job's output as it comes; the exit code of its command (1 if the job failed)."""
    for event in events:
        if args.json:
            print(json.dumps({"event": "output" if isinstance(event, OutputChunk) else "result",
                              **event.model_dump(mode="json")}), flush=True)
        elif isinstance(event, OutputChunk):
            out = sys.stdout if event.stream == "stdout" else sys.stderr
            out.write(event.data)
            out.flush()
        if isinstance(event, Job):
            return _exit_code(event)
    return 1


def _exit_code(job: Job) -> int:
    if job.state != "succeeded":
        print(f"atefleet: job {job.state}: {json.dumps(job.error)}", file=sys.stderr)
        return 1
    code = (job.result or {}).get("exit_code")
    return int(code) if isinstance(code, int) else 0


def _call(client: Client, args: argparse.Namespace) -> int:
    try:
        arguments = json.loads(args.arguments)
    except ValueError as err:
        raise SystemExit(f"atefleet call: the arguments are not JSON: {err}") from None
    result = client.session(args.environment, args.session).tool(args.tool, arguments)
    if args.json:
        _print_json(result)
    else:
        print(result.output, end="" if result.output.endswith("\n") else "\n")
    return 1 if result.is_error else 0


def _cp(client: Client, args: argparse.Namespace) -> int:
    size = copy(client, args.source, args.destination, progress=not args.json)
    if args.json:
        _print_json({"source": args.source, "destination": args.destination, "bytes": size})
    return 0


def _lifecycle(client: Client, args: argparse.Namespace) -> int:
    session = client.session(args.environment, args.session)
    if args.action == "resume":
        answer = session.resume()
    elif args.action == "suspend":
        answer = session.suspend(force=args.force)
    else:
        answer = session.destroy(keep_snapshot=args.keep_snapshot)
    return _show(args, answer)


def _sessions(client: Client, args: argparse.Namespace) -> int:
    if not args.environment:
        envs = client.environments()
        if args.json:
            _print_json(envs)
        else:
            _table((e.model_dump() for e in envs), ("name", "template", "atespace", "idle_timeout_s"))
        return 0
    if args.action == "ls":
        sessions = list(client.sessions(args.environment))
        if args.json:
            _print_json(sessions)
        else:
            _table((s.model_dump() for s in sessions), SESSION_COLUMNS)
        return 0
    if not args.session:
        raise SystemExit("atefleet sessions show: give ENVIRONMENT SESSION")
    return _show(args, client.session(args.environment, args.session).view())


def _jobs(client: Client, args: argparse.Namespace) -> int:
    if args.action == "tail":
        return _follow(client.stream(args.job_id), args)
    if args.action == "show":
        job = client.job(args.job_id)
    elif args.action == "wait":
        job = client.wait(args.job_id, args.timeout)
    else:
        job = client.cancel(args.job_id)
    return _show(args, job)


def _batch(client: Client, args: argparse.Namespace) -> int:
    stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
    with stream:
        calls = [json.loads(line) for line in stream if line.strip()]
    jobs = client.batch(calls)
    if args.wait:
        jobs = list(client.as_completed(jobs))
    if args.json:
        _print_json(jobs)
    else:
        _table((j.model_dump(mode="json") for j in jobs), ("id", "state", "environment", "session"))
    return 1 if args.wait and any(j.state != "succeeded" for j in jobs) else 0


def _tools(client: Client, args: argparse.Namespace) -> int:
    tools = client.tools(args.environment, args.format)
    if args.json:
        _print_json(tools)
        return 0
    rows = [t.get("function", t) for t in tools]
    _table(({"name": r["name"], "description": r.get("description", "")} for r in rows),
           ("name", "description"))
    return 0


def _capacity(client: Client, args: argparse.Namespace) -> int:
    return _show(args, client.capacity())


def _dlq(client: Client, args: argparse.Namespace) -> int:
    if args.action == "ls":
        entries = list(client.dead_letters())
        if args.json:
            _print_json(entries)
        else:
            _table(entries, ("id", "job_id", "environment", "session", "reason", "attempts", "dead_at"))
        return 0
    if not args.entry_id:
        raise SystemExit(f"atefleet dlq {args.action}: an entry id is needed (see `atefleet dlq ls`)")
    if args.action == "show":
        return _show(args, client.dead_letter(args.entry_id))
    if args.action == "replay":
        return _show(args, client.replay(args.entry_id))
    client.discard(args.entry_id)
    return _show(args, {"discarded": args.entry_id})


def _audit(client: Client, args: argparse.Namespace) -> int:
    records = list(client.audit(principal=args.principal, session=args.session, since=args.since,
                                until=args.until, limit=args.limit))
    if args.json:
        _print_json(records)
        return 0
    columns = sorted({k for r in records for k in r if not isinstance(r[k], dict | list)})
    _table(records, columns)
    return 0
