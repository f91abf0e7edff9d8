"""A tiny FastAPI app wired with the API's request-side building blocks, as the real app wires them."""

# No `from __future__ import annotations`: FastAPI must see the local `Caller` alias evaluated.


import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Annotated, Any

import httpx
import pytest
import uvicorn
from fastapi import Body, FastAPI, Request
from starlette.types import ASGIApp

from api.auth import Authenticator
from api.body_limit import BodyLimitMiddleware
from api.fleet import PrincipalDep as Caller
from api.http_protocol import HttpProtocol
from api.problems import install_problem_handlers
from api.rate_limit import RateLimiter
from api.tool_calls import decode_json_body, parse_tool_call
from common.audit import AuditLog
from common.config import Config, parse_config
from common.queue.keys import Keys
from common.tool_calls import render_result

ClientFactory = Callable[..., httpx.AsyncClient]


def client_for(app: FastAPI, *, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    """An httpx client talking ASGI to `app` in-process (no sockets)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://api.test")


def build_app(config: Config, *, limiter: RateLimiter | None = None) -> FastAPI:
    """Routes exercising auth, the rate limit, the body limit and tool call parsing."""
    app = FastAPI()
    install_problem_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.api.body_max_bytes)
    # The real app keeps these on `app.state.fleet` (api.fleet.Fleet); the dependency reads them there.
    # No audit stream here (no Redis): records go nowhere, as with `audit.stream_maxlen: 0`.
    audit = AuditLog(None, Keys(config.redis_prefix), config.audit.model_copy(update={"stream_maxlen": 0}))  # type: ignore[arg-type]
    app.state.fleet = SimpleNamespace(auth=Authenticator(config), limiter=limiter or RateLimiter(config.api),
                                      audit=audit)

    @app.get("/whoami")
    async def whoami(caller: Caller) -> dict[str, Any]:
        return {"id": caller.id, "kind": caller.kind, "admin": caller.admin}

    @app.post("/v1/environments/{env}/sessions/{sid}")
    async def execute(caller: Caller, env: str, sid: str, request: Request) -> dict[str, Any]:
        caller.check(env, sid)
        # Like the seed's Go decoder: JSON whatever the Content-Type (curl -d sends a form type).
        call = parse_tool_call(decode_json_body(await request.body()))
        return render_result(call, {"output": f"ran {call.name}", "exit_code": 0, "duration_ms": 1.5})

    @app.post("/echo-size")
    async def echo_size(body: Annotated[dict[str, Any], Body()]) -> dict[str, int]:
        return {"keys": len(body)}

    return app


AsgiClientFactory = Callable[..., httpx.AsyncClient]


@pytest.fixture
async def asgi_client() -> AsyncIterator[AsgiClientFactory]:
    """`asgi_client(app, raise_app_exceptions=True)` → an httpx client on `app`, closed after the test."""
    clients: list[httpx.AsyncClient] = []

    def make(app: FastAPI, *, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
        clients.append(client_for(app, raise_app_exceptions=raise_app_exceptions))
        return clients[-1]

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def make_client(asgi_client: AsgiClientFactory) -> ClientFactory:
    """`make_client(config_dict | None, limiter=None)` → an httpx client on the tiny app."""

    def make(config: dict[str, Any] | None = None, *, limiter: RateLimiter | None = None) -> Any:
        return asgi_client(build_app(parse_config(config or {}), limiter=limiter))

    return make


Serve = Callable[[ASGIApp], Awaitable[tuple[str, int]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """`await serve(app)` → (host, port) of uvicorn serving `app` over the API's HTTP protocol on
    loopback, in this event loop; stopped after the test."""
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(app: ASGIApp) -> tuple[str, int]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, http=HttpProtocol, lifespan="off", log_config=None))
        servers.append((server, asyncio.create_task(server.serve(sockets=[sock]))))
        while not server.started:
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()
        return host, port

    yield start
    for server, task in servers:
        server.should_exit = True
        await task
