"""`python -m guest (--fd N | --uds PATH | --listen HOST:PORT) [--actor NAME] [--workspace DIR]
[--state-dir DIR] [--skills-dir DIR] [--max-processes N]`: the in-actor tool server.

`--fd` serves on a listening socket its launcher bound and passed in (the local Substrate: the
socket stays out of the sandbox's reach); `--actor` (or $ATEFLEET_GUEST_ACTOR) names the only
actor whose requests it answers. The guest makes itself non-dumpable, so the tenant's commands,
though they run as its uid, cannot ptrace it or read its memory, fds or environment.

SIGTERM (or SIGINT) stops it gracefully: no new connections, running commands and background
process groups are killed (their executions are journaled as interrupted), exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys

from guest.app import GuestApp
from guest.executions import Executions
from guest.identity import ActorIdentity
from guest.journal import Journal
from guest.procs import ProcessManager
from guest.server import HttpServer

log = logging.getLogger("guest")

#: Environment variable naming the actor, for launchers that cannot pass `--actor`.
ACTOR_ENV = "ATEFLEET_GUEST_ACTOR"
_PR_SET_DUMPABLE = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m guest", description="atefleet in-actor tool server")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd", type=int, help="serve on this inherited listening unix socket")
    where.add_argument("--uds", help="serve on this unix socket")
    where.add_argument("--listen", help="serve on HOST:PORT (TCP)")
    parser.add_argument("--actor", default=os.environ.get(ACTOR_ENV),
                        help=f"the actor served (default ${ACTOR_ENV}; unset: the first request's)")
    parser.add_argument(
        "--workspace", default="/workspace", help="the agent's root: every tool path resolves inside it"
    )
    parser.add_argument(
        "--state-dir",
        default="/var/lib/atefleet-guest",
        help="journal and process logs (not in the workspace)",
    )
    parser.add_argument("--skills-dir", default="/skills", help="default skills directory")
    parser.add_argument(
        "--max-processes", type=int, default=16, help="concurrent commands + background processes"
    )
    return parser.parse_args(argv)


def _use_pidfd_watcher() -> None:
    """On Python 3.11, have asyncio watch its children (background processes) with pidfds where
    the kernel has them: its default watcher starts a thread per child. From 3.12 asyncio does so
    itself (and 3.14 has no watcher to set); foreground commands use `spawn.watch_exit`."""
    if sys.version_info < (3, 12) and hasattr(os, "pidfd_open"):
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return
        watcher = asyncio.PidfdChildWatcher()
        asyncio.set_child_watcher(watcher)
        watcher.attach_loop(asyncio.get_running_loop())


def not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: same-uid processes (the tenant's commands) cannot ptrace this process or
    open its /proc files; execve resets it, so commands the guest spawns are unaffected."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        log.warning("cannot make the guest non-dumpable")


async def serve(args: argparse.Namespace) -> None:
    not_dumpable()
    _use_pidfd_watcher()
    os.makedirs(args.workspace, exist_ok=True)
    os.makedirs(args.state_dir, mode=0o700, exist_ok=True)
    processes = ProcessManager(args.state_dir, args.max_processes)
    journal = Journal(args.state_dir)
    executions = Executions(journal, processes, args.workspace, args.state_dir, args.skills_dir)
    server = HttpServer(GuestApp(executions, ActorIdentity(args.state_dir, args.actor)).handle)
    if args.fd is not None:
        await server.listen_socket(socket.socket(fileno=args.fd))
    elif args.uds:
        await server.listen_unix(args.uds)
    else:
        host, _, port = args.listen.rpartition(":")
        await server.listen_tcp(host.strip("[]"), int(port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("guest %d serving on %s", os.getpid(), args.uds or args.listen or f"fd {args.fd}")
    await stop.wait()
    # Order: stop taking requests, end running commands (journaled as interrupted), then the
    # background groups, and flush the journal last so it records all of it.
    await executions.stop()
    await processes.stop_all()
    await server.close()
    journal.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s guest %(levelname)s %(message)s"
    )
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
