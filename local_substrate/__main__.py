"""`python -m local_substrate --config PATH --listen 127.0.0.1:PORT`: serve until SIGTERM/SIGINT.

On SIGTERM running actors are snapshotted and suspended before exit; after a crash they come
back SUSPENDED at their last snapshot.
"""

from __future__ import annotations

import argparse
import asyncio

from common.config import ConfigError, load_config
from common.logs import setup_logging
from common.metrics import serve_role_endpoints
from common.signals import stop_on_signals
from local_substrate.server import LocalSubstrate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m local_substrate", description="embedded ateapi.Control server"
    )
    p.add_argument("--config", default=None, help="config.yaml (default: ./config.yaml or built-in defaults)")
    p.add_argument("--listen", default=None, help="HOST:PORT (default: local_substrate.listen)")
    p.add_argument("--metrics-port", type=int, default=0, help="serve /healthz /readyz /metrics here")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    config = load_config(args.config)
    setup_logging("local_substrate", config.log_level)
    server = LocalSubstrate(config, args.listen)
    await server.start()
    endpoints = (await serve_role_endpoints("0.0.0.0", args.metrics_port, lambda: True)
                 if args.metrics_port else None)
    await stop_on_signals().wait()
    if endpoints is not None:
        endpoints.close()
    await server.stop()


def main(argv: list[str] | None = None) -> None:
    try:
        asyncio.run(serve(parse_args(argv)))
    except ConfigError as err:
        raise SystemExit(f"local_substrate: {err}") from None


if __name__ == "__main__":
    main()
