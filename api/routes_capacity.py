"""`GET /v1/capacity`: Substrate workers, sessions running / parked / waiting, the wait queue, parks.

Read from Redis only (the API never calls Substrate): the reconciler's leader records the workers
as ListWorkers shows them every pass (`observed_at_ms` says when); the rest is the workers' own
bookkeeping of resumes, parks and the wait queue (common.capacity).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.fleet import FleetDep, PrincipalDep
from common.capacity import Capacity

router = APIRouter(tags=["ops"])


@router.get("/v1/capacity", summary="Substrate workers, sessions running / parked / waiting, parks")
async def capacity(fleet: FleetDep, _principal: PrincipalDep) -> dict[str, Any]:
    return await Capacity(fleet.redis, fleet.config).view()
