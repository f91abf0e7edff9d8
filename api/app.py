"""The API application: clients opened in the lifespan, routes, problem handlers, body limit.

The API is stateless: everything it knows is in Redis. Each process holds one `RedisClient`
(common/redis), one `Queue`, and one `JobWaiter` (one pub/sub subscription shared by every
request that waits for a job), all opened in the lifespan and closed there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp

from api.auth import Authenticator
from api.body_limit import BodyLimitMiddleware
from api.fleet import Fleet
from api.hot_path import HotPath
from api.mcp import McpEndpoint
from api.policy import Policies
from api.problems import install_problem_handlers
from api.quotas import StreamSlots
from api.rate_limit import RateLimiter
from api.routes_audit import router as audit_router
from api.routes_capacity import router as capacity_router
from api.routes_dlq import router as dlq_router
from api.routes_jobs import router as jobs_router
from api.routes_meta import router as meta_router
from api.routes_sessions import router as sessions_router
from api.ui.routes import install_ui
from common.audit import AuditLog
from common.config import Config
from common.queue import JobWaiter, Queue
from common.redis.client import RedisClient
from common.redis.settings import role_settings
from common.secret_box import SecretBox, load_key

#: Blocking stream reads (SSE) in flight per API process, each on a connection of its own; past
#: it a stream is a 503.
STREAM_READS_MAX = 1024


def create_app(config: Config, redis_url: str | None = None) -> ASGIApp:
    """The API as served: the body limit, then the tool-call route (`api.hot_path`), then FastAPI."""
    settings = role_settings("api", redis_url or config.redis.url)
    mcp = McpEndpoint()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = RedisClient(settings, max_blocking=STREAM_READS_MAX)
        queue = Queue(client, config)
        waiter = JobWaiter(queue)
        waiter.start()  # subscribed before the first sync call, which then needs no record read
        audit = AuditLog(client, queue.keys, config.audit)
        audit.start()
        app.state.fleet = Fleet(config=config, redis=client, queue=queue, waiter=waiter,
                                auth=Authenticator(config), limiter=RateLimiter(config.api),
                                secret_box=SecretBox(load_key(config.state_dir)), audit=audit,
                                policies=Policies(config), streams=StreamSlots())
        try:
            async with mcp.running():  # the MCP endpoint's task group
                yield
        finally:
            await waiter.close()
            await audit.aclose()
            await client.aclose()

    app = FastAPI(title="atefleet", version="0.1.0", lifespan=lifespan,
                  description="Run AI agents' tool calls in per-session sandboxed actors on Agent Substrate.")
    install_problem_handlers(app)
    # Routes are matched in this order: the most used first.
    app.include_router(sessions_router)
    app.include_router(jobs_router)
    app.include_router(audit_router)
    app.include_router(meta_router)
    app.include_router(dlq_router)
    install_ui(app)  # the operator UI at /ui (api/ui)
    app.include_router(capacity_router)
    app.mount("/mcp", mcp)  # MCP over Streamable HTTP, one endpoint per session (api/mcp.py)
    return BodyLimitMiddleware(HotPath(app), max_bytes=config.api.body_max_bytes)
