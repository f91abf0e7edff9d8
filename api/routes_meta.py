"""Health, readiness, metrics, and discovery (environments and their ready-to-use tool definitions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from api.fleet import FleetDep, PrincipalDep
from api.problems import Forbidden
from common import metrics
from common.tool_schemas import anthropic_tools, openai_tools

router = APIRouter()


def _isolation(state_dir: str) -> dict[str, Any]:
    """The isolation the local Substrate reports in its status file (local_substrate.isolation);
    no file means a cluster, whose isolation is Substrate's own."""
    try:
        status = json.loads((Path(state_dir) / "local-substrate" / "status.json").read_text())
    except (OSError, ValueError):
        return {"sandbox": "external-substrate"}
    report = status.get("isolation")
    return report if isinstance(report, dict) else {"sandbox": str(status.get("sandbox", "unknown"))}


@router.get("/healthz", tags=["ops"])
async def healthz(fleet: FleetDep) -> dict[str, Any]:
    """Liveness, and exactly what isolation tenant code runs under (sandbox level, per-slot uids,
    cgroups, the memory bound, what is given up)."""
    isolation = _isolation(fleet.config.state_dir)
    return {"status": "ok", "sandbox": isolation["sandbox"], "isolation": isolation,
            "auth": fleet.config.auth.enabled}


@router.get("/readyz", tags=["ops"])
async def readyz(fleet: FleetDep) -> Response:
    try:
        await fleet.redis.ping()
    except Exception as err:  # any Redis failure means not ready; the detail is for operators
        return JSONResponse({"ready": False, "redis": type(err).__name__}, status_code=503)
    return JSONResponse({"ready": True})


@router.get("/metrics", tags=["ops"])
async def prometheus_metrics() -> Response:
    """This process's metrics, or the whole fleet's under `atefleet up` (see common.metrics)."""
    return Response(metrics.render_metrics(), media_type=metrics.PROMETHEUS_CONTENT_TYPE)


@router.get("/v1/environments", tags=["discovery"])
async def environments(fleet: FleetDep, principal: PrincipalDep) -> dict[str, Any]:
    visible = [e for e in fleet.config.environments if principal.may_use(e.name, None)]
    return {"environments": [
        {"name": e.name, "template": e.template, "atespace": e.atespace, "skills_dir": e.skills_dir,
         "allowed_tools": list(e.allowed_tools), "idle_timeout_s": e.idle_timeout_s}
        for e in visible]}


@router.get("/v1/environments/{env}/tools", tags=["discovery"])
async def tools(fleet: FleetDep, principal: PrincipalDep, env: str,
                format: Literal["openai", "anthropic"] = Query("openai")) -> dict[str, Any]:
    environment = fleet.environment(env)
    if not principal.may_use(env, None):
        raise Forbidden(f"not allowed to use environment {env!r}")
    names = list(environment.allowed_tools)
    return {"tools": openai_tools(names) if format == "openai" else anthropic_tools(names)}
