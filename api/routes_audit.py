"""`GET /v1/audit`: the audit log (common/audit.py), for admins, filtered and paged."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Query

from api.fleet import FleetDep, PrincipalDep
from api.problems import BadRequest
from common.audit import READ_MAX

#: A cursor is a record id of the audit stream.
_CURSOR = re.compile(r"\d{1,20}-\d{1,20}")

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("", summary="Audit records, oldest first (admin scope)")
async def read_audit(
    fleet: FleetDep, caller: PrincipalDep,
    principal: str = Query("", description="only this principal's records (e.g. key:ci, jwt:agent-7)"),
    session: str = Query("", description="only records of this session id"),
    since: str = Query("", description="RFC 3339 time or unix ms: records at or after it"),
    until: str = Query("", description="RFC 3339 time or unix ms: records at or before it"),
    cursor: str = Query("", description="`next_cursor` of the previous page"),
    limit: int = Query(100, ge=1, le=READ_MAX),
) -> dict[str, Any]:
    if not caller.admin:
        await fleet.audit.record("forbidden", caller.id, op="audit")
    caller.check_admin()
    if cursor and not _CURSOR.fullmatch(cursor):
        raise BadRequest("`cursor` must be the `next_cursor` of a previous page", field="cursor")
    await fleet.audit.record("admin", caller.id, op="audit_read", why=principal or session)
    records, next_cursor = await fleet.audit.read(
        principal=principal, session=session, since_ms=_time_ms(since, "since"),
        until_ms=_time_ms(until, "until"), cursor=cursor, limit=limit)
    return {"records": records, "next_cursor": next_cursor}


def _time_ms(value: str, name: str) -> int:
    if not value:
        return 0
    if value.isdigit():
        return int(value)
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"`{name}` must be an RFC 3339 time or unix milliseconds", field=name) from None
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)
