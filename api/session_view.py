"""The public JSON of a session: what `GET /v1/environments/{env}/sessions/{sid}` answers.

Built from Redis only (the API never calls Substrate): `state` is the fleet's view of the actor,
kept by the workers and corrected by the reconciler's status sync (`drift` says what it found);
`background_processes` is what the guest reported after the session's last process-related call.
`suspended_by` says who suspended it (a call wakes the fleet's own parks, see common.capacity), and
`capacity_wait` where its resume stands in the fleet's wait for a Substrate worker.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from common.actor_names import actor_name
from common.capacity import PARKED_STATES, Capacity
from common.config import Environment
from common.job_json import rfc3339
from common.queue import JobState, Queue, session_name


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


async def session_view(queue: Queue, env: Environment, sid: str) -> dict[str, Any] | None:
    info, depth, head, waiting = await asyncio.gather(
        queue.get_session(env.name, sid), queue.queue_depth(env.name, sid), queue.head_job(env.name, sid),
        Capacity(queue.redis, queue.config).position(session_name(env.name, sid)))
    if info is None:
        return None
    state = info.get("state", "new")
    return {
        "environment": env.name,
        "session": sid,
        "owner": info.get("own"),
        "state": state,
        "suspended_by": (info.get("suspended_by") or None) if state in PARKED_STATES else None,
        "capacity_wait": None if waiting is None else {"position": waiting[0], "since": rfc3339(waiting[1])},
        "actor": {"name": info.get("actor") or actor_name(env.name, sid), "atespace": env.atespace},
        "last_activity": rfc3339(_float(info.get("last_activity"))),
        "queue_depth": depth,
        "running_job": head.id if head is not None and head.state == JobState.RUNNING else None,
        "background_processes": json.loads(info.get("background_processes") or "[]"),
        "cold_start": info.get("cold_start") == "1",
        "last_resume_ms": _float(info.get("last_resume_ms")),
        "last_suspend_ms": _float(info.get("last_suspend_ms")),
        "snapshot": {"kept": info.get("snapshot_kept") == "1", "location": info.get("snapshot") or None,
                     "bytes": int(info["snapshot_bytes"]) if info.get("snapshot_bytes") else None},
        "drift": ({"kind": info["drift"], "detail": info.get("drift_detail"), "at": info.get("drift_at")}
                  if info.get("drift") else None),
    }
