"""`python -m local_substrate --config PATH --listen 127.0.0.1:PORT`: serve until SIGTERM/SIGINT.

On SIGTERM running actors are snapshotted and suspended before exit; after a crash they come
back SUSPENDED at their last snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from common.config import load_config
from local_substrate.server import LocalSubstrate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m local_substrate", description="embedded ateapi.Control server"
    )
    p.add_argument("--config", default=None, help="config.yaml (default: ./config.yaml or built-in defaults)")
    p.add_argument("--listen", default=None, help="HOST:PORT (default: local_substrate.listen)")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    config = load_config(args.config)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    server = LocalSubstrate(config, args.listen)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
