"""The CLI for people: every API operation as a command, built on the SDK (`atefleet.client`).

`ATEFLEET_API_URL` (default http://127.0.0.1:7777) and `ATEFLEET_TOKEN` say where and who (or
`--api-url` / `--token`). Every command takes `--json` (machine-readable output: one JSON document,
or JSON lines for streams); otherwise tables and progress come from rich. A failed call exits 1
with its problem's title and detail (exit 2 for usage errors, `exec` exits with the command's code).
"""

from __future__ import annotations

import argparse
import itertools
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
    """Add the client commands to the `atefleet` parser's subcommands: actions on a thing are verbs
    under its noun (`sessions suspend`, `jobs wait`, `dlq replay`)."""
    commands = _Commands(sub)
    _add_call_commands(commands)
    _add_session_commands(commands)
    _add_job_commands(commands)
    _add_admin_commands(commands)


class _Commands:
    """Adds commands (each with --json, --api-url, --token) to the `atefleet` parser."""

    def __init__(self, sub: Any) -> None:
        self.top = sub
        self._options, self._verb_options = _common_options(suppress=False), _common_options(suppress=True)

    def add(self, subs: Any, name: str, handler: Handler | None, help: str) -> argparse.ArgumentParser:
        """A command under `subs` (the top level's, or a noun's verbs) that runs `handler`."""
        parser: argparse.ArgumentParser = subs.add_parser(
            name, help=help, parents=[self._options if subs is self.top else self._verb_options])
        if handler is not None:
            parser.set_defaults(client_handler=handler)
        return parser

    def command(self, name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        return self.add(self.top, name, handler, help)

    def noun(self, name: str, help: str, default: Handler | None, **defaults: Any) -> Any:
        """A command whose verbs are subcommands (answered: where to add them); without a verb it
        runs `default` (None: a verb is required) with `defaults` for the arguments it reads."""
        parser = self.add(self.top, name, default, help)
        parser.set_defaults(**defaults)
        return parser.add_subparsers(title="verbs", metavar="VERB", required=default is None)


def _add_call_commands(commands: _Commands) -> None:
    e = commands.command("exec", _exec, "run a shell command in a session and stream its output")
    _session_args(e)
    e.add_argument("cmd", nargs="*", help="-- COMMAND... (options go before the --)")
    c = commands.command("call", _call, "run any tool: atefleet call ENV SID TOOL '{\"path\": \"x\"}'")
    _session_args(c)
    c.add_argument("tool")
    c.add_argument("arguments", nargs="?", default="{}", help="the tool's arguments as a JSON object")
    cp = commands.command("cp", _cp,
                      "copy a file to or from a session: cp LOCAL ENV/SID:PATH, cp ENV/SID:PATH LOCAL")
    cp.add_argument("source")
    cp.add_argument("destination")
    b = commands.command("batch", _batch, "submit JSON lines of calls (each with environment and session)")
    b.add_argument("file", help="JSON lines file, or - for stdin")
    b.add_argument("--wait", action="store_true", help="wait for every job and print each as it ends")
    t = commands.command("tools", _tools, "print an environment's tool definitions")
    t.add_argument("environment")
    t.add_argument("--format", choices=["openai", "anthropic"], default="openai")


def _add_session_commands(commands: _Commands) -> None:
    sessions = commands.noun("sessions", "environments and sessions: ls, show, resume, suspend, destroy",
                             _sessions_ls, environment=None)
    ls = commands.add(sessions, "ls", _sessions_ls, "an environment's sessions (no ENV: the environments)")
    ls.add_argument("environment", nargs="?")
    _session_args(commands.add(sessions, "show", _session_show, "a session's state"))
    _add_lifecycle_commands(commands, sessions, "")
    # `atefleet suspend ENV SID` (and resume, destroy): README's spelling before `sessions suspend`.
    _add_lifecycle_commands(commands, commands.top, "same as `sessions {action}`")


def _add_lifecycle_commands(commands: _Commands, subs: Any, shortcut: str) -> None:
    """resume, suspend and destroy; `shortcut` (if any) is their help, formatted with the action."""
    for action, help in (("resume", "create (if needed) and resume a session"),
                         ("suspend", "suspend a session (after its queued calls)"),
                         ("destroy", "destroy a session")):
        lc = commands.add(subs, action, _lifecycle, shortcut.format(action=action) or help)
        _session_args(lc)
        lc.set_defaults(action=action)
        if action == "suspend":
            lc.add_argument("--force", action="store_true", help="even with background processes running")
        if action == "destroy":
            lc.add_argument("--keep-snapshot", action="store_true")


def _add_job_commands(commands: _Commands) -> None:
    jobs = commands.noun("jobs", "show, wait for, cancel or tail a job", None)
    for verb, handler, help in (("show", _job_show, "a job's state and result"),
                                ("wait", _job_wait, "wait for a job to end"),
                                ("cancel", _job_cancel, "cancel a job"),
                                ("tail", _job_tail, "stream a job's output, then its result")):
        j = commands.add(jobs, verb, handler, help)
        j.add_argument("job_id")
        if verb == "wait":
            j.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")


#: The largest page `GET /v1/audit` serves.
AUDIT_PAGE_MAX = 1000


def _add_admin_commands(commands: _Commands) -> None:
    commands.command("capacity", _capacity, "Substrate workers, sessions running / parked / waiting")
    a = commands.command("audit", _audit, "audit records (admin scope)")
    for name in ("principal", "session", "since", "until"):
        a.add_argument(f"--{name}", default="")
    a.add_argument("--limit", type=int, default=100, help="at most this many records (oldest first)")
    dlq = commands.noun("dlq", "dead-lettered jobs (admin scope): ls, show, replay, discard", _dlq_ls)
    commands.add(dlq, "ls", _dlq_ls, "dead-lettered jobs, newest first")
    for verb, handler, help in (("show", _dlq_show, "one entry and its job"),
                                ("replay", _dlq_replay, "re-enqueue the entry's job at its session's tail"),
                                ("discard", _dlq_discard, "drop the entry")):
        commands.add(dlq, verb, handler, help).add_argument("entry_id", help="an id from `atefleet dlq ls`")


def _common_options(suppress: bool) -> argparse.ArgumentParser:
    """--json, --api-url and --token. A verb's copy (`suppress`) sets no defaults: argparse lets a
    subcommand's defaults overwrite what its parent parsed (`sessions --json ls`)."""
    flag, value = (argparse.SUPPRESS, argparse.SUPPRESS) if suppress else (False, None)
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--json", action="store_true", default=flag, help="machine-readable output")
    options.add_argument("--api-url", default=value, help="default: $ATEFLEET_API_URL or http://127.0.0.1:7777")
    options.add_argument("--token", default=value, help="bearer token (default: $ATEFLEET_TOKEN)")
    return options


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


def _sessions_ls(client: Client, args: argparse.Namespace) -> int:
    if not args.environment:
        envs = client.environments()
        if args.json:
            _print_json(envs)
        else:
            _table((e.model_dump() for e in envs), ("name", "template", "atespace", "idle_timeout_s"))
        return 0
    sessions = list(client.sessions(args.environment))
    if args.json:
        _print_json(sessions)
    else:
        _table((s.model_dump() for s in sessions), SESSION_COLUMNS)
    return 0


def _session_show(client: Client, args: argparse.Namespace) -> int:
    return _show(args, client.session(args.environment, args.session).view())


def _job_show(client: Client, args: argparse.Namespace) -> int:
    return _show(args, client.job(args.job_id))


def _job_wait(client: Client, args: argparse.Namespace) -> int:
    return _show(args, client.wait(args.job_id, args.timeout))


def _job_cancel(client: Client, args: argparse.Namespace) -> int:
    return _show(args, client.cancel(args.job_id))


def _job_tail(client: Client, args: argparse.Namespace) -> int:
    return _follow(client.stream(args.job_id), args)


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


def _dlq_ls(client: Client, args: argparse.Namespace) -> int:
    entries = list(client.dead_letters())
    if args.json:
        _print_json(entries)
    else:
        _table(entries, ("id", "job_id", "environment", "session", "reason", "attempts", "dead_at"))
    return 0


def _dlq_show(client: Client, args: argparse.Namespace) -> int:
    return _show(args, client.dead_letter(args.entry_id))


def _dlq_replay(client: Client, args: argparse.Namespace) -> int:
    return _show(args, client.replay(args.entry_id))


def _dlq_discard(client: Client, args: argparse.Namespace) -> int:
    client.discard(args.entry_id)
    return _show(args, {"discarded": args.entry_id})


def _audit(client: Client, args: argparse.Namespace) -> int:
    # The first --limit records, fetched in pages no bigger than that.
    pages = client.audit(principal=args.principal, session=args.session, since=args.since,
                         until=args.until, page_size=min(args.limit, AUDIT_PAGE_MAX))
    records = list(itertools.islice(pages, args.limit))
    if args.json:
        _print_json(records)
        return 0
    columns = sorted({k for r in records for k in r if not isinstance(r[k], dict | list)})
    _table(records, columns)
    return 0
