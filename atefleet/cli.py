"""The `atefleet` command: `up` (the whole fleet), one subcommand per role, and a CLI for people.

Roles are what deployments run one per process or pod; `up` runs all of them as children. Each
role's entry point lives in its own package (api/, workers/, reconciler/, local_substrate/,
guest/); this module only parses arguments and loads the config.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import shtab

from atefleet.client_cli import add_client_commands, run_client_command
from common.config import Config, ConfigError, load_config
from common.logs import setup_logging

#: Process roles a deployment can run (`atefleet <role>`); `up` supervises all but `guest`.
ROLES: tuple[str, ...] = ("api", "worker", "reconciler", "webhooks", "local-substrate", "guest")

#: Port for /healthz, /readyz and /metrics of roles without an HTTP API of their own.
DEFAULT_METRICS_PORT = 9100


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="atefleet", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="config file (default: $ATEFLEET_CONFIG or ./config.yaml)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start the whole fleet (embedded Redis and local Substrate by default)")
    sub.add_parser("api", help="run the HTTP API")
    w = sub.add_parser("worker", help="run one worker process")
    w.add_argument("--id", default="", help="worker id (default: host-pid)")
    for role in ("worker", "reconciler", "webhooks", "local-substrate"):
        sp = w if role == "worker" else sub.add_parser(role, help=f"run the {role} role")
        sp.add_argument("--metrics-port", type=int, default=0,
                        help=f"serve /healthz /readyz /metrics here (containers: {DEFAULT_METRICS_PORT})")
        if role == "local-substrate":
            sp.add_argument("--listen", default="", help="gRPC address (default: local_substrate.listen)")
    # `guest` takes the guest's own options (`atefleet guest --listen ...`); main() hands them over
    # before parsing, since argparse's REMAINDER cannot capture options that start with "--".
    sub.add_parser("guest", help="run the in-actor tool server (options: see `python -m guest --help`)")
    add_client_commands(sub)
    c = sub.add_parser("completion", help='a shell completion script: eval "$(atefleet completion bash)"')
    c.add_argument("shell", choices=["bash", "zsh", "tcsh"])
    return p


def _load(path: str | None) -> Config:
    try:
        return load_config(path)
    except ConfigError as err:
        raise SystemExit(f"atefleet: {err}") from None


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["guest"]:
        from guest.__main__ import main as guest_main

        guest_main(argv[1:])
        return
    parser = _parser()
    # `exec ENV SID [options] -- COMMAND...`: what follows `--` is the command, whatever it looks
    # like (argparse cannot take options after a list positional).
    command = argv[argv.index("--") + 1:] if argv[:1] == ["exec"] and "--" in argv else None
    args = parser.parse_args(argv if command is None else argv[:argv.index("--")])
    if command is not None:
        args.cmd = command
    if getattr(args, "client_handler", None) is not None:
        sys.exit(run_client_command(args))
    if args.command == "completion":
        print(shtab.complete(parser, shell=args.shell))
        return
    config = _load(args.config)
    setup_logging(args.command, config.log_level)
    if args.command == "up":
        from atefleet.supervisor import run_up

        run_up(config, args.config)
    elif args.command == "api":
        from api.main import run_api

        run_api(config)
    elif args.command == "worker":
        from workers.main import run_worker

        run_worker(config, args.id, args.metrics_port)
    elif args.command == "reconciler":
        from reconciler.main import run_reconciler

        run_reconciler(config, args.metrics_port)
    elif args.command == "webhooks":
        from workers.webhooks import run_deliverer

        run_deliverer(config, config.redis.url, args.metrics_port)
    elif args.command == "local-substrate":
        from local_substrate.__main__ import main as substrate_main

        substrate_main(["--listen", args.listen or config.local_substrate.listen]
                       + (["--metrics-port", str(args.metrics_port)] if args.metrics_port else [])
                       + (["--config", args.config] if args.config else []))
