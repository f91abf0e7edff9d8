"""`python -m guest (--uds PATH | --listen HOST:PORT) [--workspace DIR] [--state-dir DIR]
[--skills-dir DIR] [--max-processes N]`: the in-actor tool server.

SIGTERM (or SIGINT) stops it gracefully: no new connections, running commands and background
process groups are killed (their executions are journaled as interrupted), exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from guest.app import GuestApp
from guest.executions import Executions
from guest.identity import SessionBinding
from guest.journal import Journal
from guest.procs import ProcessManager
from guest.server import HttpServer

log = logging.getLogger("guest")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m guest", description="atefleet in-actor tool server")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--uds", help="serve on this unix socket")
    where.add_argument("--listen", help="serve on HOST:PORT (TCP)")
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
    """Watch children with pidfds where the kernel has them: the default watcher starts a thread
    per child, a measurable part of a `bash true` call."""
    if hasattr(os, "pidfd_open"):
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return
        watcher = asyncio.PidfdChildWatcher()
        asyncio.set_child_watcher(watcher)
        watcher.attach_loop(asyncio.get_running_loop())


async def serve(args: argparse.Namespace) -> None:
    _use_pidfd_watcher()
    os.makedirs(args.workspace, exist_ok=True)
    os.makedirs(args.state_dir, mode=0o700, exist_ok=True)
    processes = ProcessManager(args.state_dir, args.max_processes)
    journal = Journal(args.state_dir)
    executions = Executions(journal, processes, args.workspace, args.state_dir, args.skills_dir)
    server = HttpServer(GuestApp(executions, SessionBinding(args.state_dir)).handle)
    if args.uds:
        await server.listen_unix(args.uds)
    else:
        host, _, port = args.listen.rpartition(":")
        await server.listen_tcp(host.strip("[]"), int(port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("guest %d serving on %s", os.getpid(), args.uds or args.listen)
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
