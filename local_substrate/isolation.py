"""What isolation a local Substrate gives its actors, stated exactly (status.json, /healthz, the
`atefleet up` banner): sandbox level, per-slot uids, cgroups, the memory bound, and what is given
up where a layer is missing. Operators must never have to infer it from the config.
"""

from __future__ import annotations

import os
from typing import Any

from common.config import Config
from local_substrate.sandbox import SHM_SHARE

#: What each missing layer costs, said once here for every reader of the report.
GIVEN_UP = {
    "sandbox": "no sandbox: tenant commands run as plain processes of the fleet's user and can read "
    "its files, keys and state and reach its ports (trusted code only)",
    "uids": "no per-slot uid (not root): every sandbox runs as the fleet's uid, each in a user "
    "namespace of its own",
    "nproc": "RLIMIT_NPROC counts the fleet's uid as a whole (no per-slot uid, and a kernel that "
    "does not count per user namespace): one sandbox's process count counts against the others', "
    "and no suspended sandbox is kept frozen (each resume starts a new one)",
    "cgroups": "no cgroups (hierarchy not writable): no whole-sandbox pid or memory cap; memory is "
    "bounded per process (RLIMIT_AS) and /dev/shm by its size only, not per sandbox",
    "network": "templates with network: host share the host's network and loopback (trusted "
    "code only)",
}


def isolation_report(config: Config, level: str, cgroup_mode: str, nproc_per_sandbox: bool,
                     ) -> dict[str, Any]:
    """The isolation in force, as a JSON object; `nproc_per_sandbox` as
    `sandbox.nproc_counted_per_sandbox` found it."""
    sandboxed = level != "none"
    uids = sandboxed and os.geteuid() == 0
    cgroups = cgroup_mode if sandboxed and cgroup_mode != "none" else None
    host_net = sorted(t.name for t in config.local_substrate.templates if t.network == "host")
    memory = (
        f"cgroup {cgroups} memory cap per sandbox = template memory_mb (counts tmpfs incl. /dev/shm and "
        f"page cache), plus RLIMIT_AS per process; /dev/shm is at most memory_mb/{SHM_SHARE}"
        if cgroups
        else f"RLIMIT_AS = memory_mb per process only; /dev/shm is at most memory_mb/{SHM_SHARE}"
    )
    given_up = [GIVEN_UP[k] for k, missing in (
        ("sandbox", not sandboxed), ("uids", sandboxed and not uids),
        ("nproc", sandboxed and not nproc_per_sandbox), ("cgroups", sandboxed and not cgroups),
        ("network", bool(host_net))) if missing]  # fmt: skip
    return {
        "sandbox": level,
        "per_slot_uids": uids,
        "nproc_per_sandbox": sandboxed and nproc_per_sandbox,
        "cgroups": cgroups,
        "memory": memory if sandboxed else "none",
        "network_host_templates": host_net,
        "gives_up": given_up,
    }


def describe(report: dict[str, Any]) -> list[str]:
    """Banner lines for `atefleet up`: the isolation in force, then what is given up."""
    head = (
        f"isolation: sandbox {report.get('sandbox', 'unknown')}, "
        f"per-slot uids {'yes' if report.get('per_slot_uids') else 'no'}, "
        f"cgroups {report.get('cgroups') or 'no'}; memory: {report.get('memory', 'unknown')}"
    )
    return [head, *(f"WARNING: {line}" for line in report.get("gives_up", []))]
