"""Every problem type renders as RFC 9457 problem+json with its status, type URI and headers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from api import problems as p
from common.problem_types import PROBLEM_TYPES
from common.queue import PROBLEM_CANCELLED, PROBLEM_INVALID_RESULT, PROBLEM_RETRIES_EXHAUSTED

TYPE = "https://atefleet.dev/problems/"

CASES: list[tuple[p.ApiProblem, int, str]] = [
    (p.BadRequest("bad"), 400, "bad_request"),
    (p.Unauthorized("who"), 401, "unauthorized"),
    (p.Forbidden("no"), 403, "forbidden"),
    (p.NotFound("gone"), 404, "not_found"),
    (p.JobExpired("old", job_id="j1"), 404, "job_expired"),
    (p.MethodNotAllowed("nope"), 405, "method_not_allowed"),
    (p.Conflict("clash"), 409, "conflict"),
    (p.BackgroundProcessesRunning("busy", processes=[{"pid": 7, "command": "sleep 9"}]), 409,
     "background_processes_running"),
    (p.PayloadTooLarge("big"), 413, "payload_too_large"),
    (p.Unprocessable("odd"), 422, "unprocessable"),
    (p.IdempotencyConflict("reused", job_id="j2"), 422, "idempotency_conflict"),
    (p.InvalidToolCall("bad args", field="function.arguments"), 422, "invalid_tool_call"),
    (p.ToolNotAllowed("rm", "my-env"), 422, "tool_not_allowed"),
    (p.RateLimited(0.2), 429, "rate_limited"),
    (p.InternalError(), 500, "internal"),
    (p.Unavailable("later", retry_after_s=3), 503, "unavailable"),
    (p.ApiProblem(409, "session_not_running", "Not running", "resume it", session_state="new"), 409,
     "session_not_running"),
]


async def _raise(problem: p.ApiProblem) -> httpx.Response:
    """GET a route that raises `problem`."""
    app = FastAPI()
    p.install_problem_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise problem

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        return await client.get("/boom")


@pytest.mark.parametrize(("problem", "status", "slug"), CASES, ids=[c[2] for c in CASES])
async def test_each_problem_renders_as_problem_json(problem: p.ApiProblem, status: int, slug: str) -> None:
    # given a route raising the problem; when it is called
    response = await _raise(problem)
    # then the answer is problem+json with the stable type and the status in both places
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == TYPE + slug
    assert body["status"] == status
    assert body["title"]
    assert body["instance"] == "/boom"


async def test_extensions_and_special_headers() -> None:
    body = (await _raise(p.BackgroundProcessesRunning("x", processes=[{"pid": 7}]))).json()
    assert body["processes"] == [{"pid": 7}]
    assert (await _raise(p.ToolNotAllowed("rm", "e"))).json()["tool"] == "rm"
    assert (await _raise(p.InvalidToolCall("x", field="f"))).json()["field"] == "f"
    # Retry-After is whole seconds, rounded up, at least 1
    assert (await _raise(p.RateLimited(0.2))).headers["retry-after"] == "1"
    assert (await _raise(p.RateLimited(2.01))).headers["retry-after"] == "3"
    assert (await _raise(p.Unavailable("x", retry_after_s=3))).headers["retry-after"] == "3"
    assert "retry-after" not in (await _raise(p.Unavailable("x"))).headers
    assert (await _raise(p.Unauthorized())).headers["www-authenticate"] == 'Bearer realm="atefleet"'
    given = (await _raise(p.Unauthorized(token_given=True))).headers["www-authenticate"]
    assert given == 'Bearer realm="atefleet", error="invalid_token"'


def test_extensions_may_not_shadow_standard_members() -> None:
    with pytest.raises(ValueError, match="status"):
        p.Conflict("x", status=200)


def test_from_dict_round_trips_a_stored_error() -> None:
    original = p.JobExpired("expired after 1 day", job_id="j9")
    rebuilt = p.ApiProblem.from_dict(original.to_dict())
    assert (rebuilt.status, rebuilt.type_slug, rebuilt.title, rebuilt.detail) == (
        404, "job_expired", original.title, "expired after 1 day")
    assert rebuilt.extensions == {"job_id": "j9"}
    assert rebuilt.to_dict() == original.to_dict()
    assert p.ApiProblem.from_dict({"type": "about:blank"}).type_slug == "internal"


class _Item(BaseModel):
    name: str
    count: int


def _framework_app() -> FastAPI:
    app = FastAPI()
    p.install_problem_handlers(app)

    @app.post("/items")
    async def create(item: _Item) -> dict[str, Any]:
        return item.model_dump()

    @app.get("/crash")
    async def crash() -> None:
        raise RuntimeError("secret internals")

    return app


async def test_validation_errors_become_422_listing_fields(asgi_client: Any) -> None:
    response = await asgi_client(_framework_app()).post("/items", json={"name": 3})
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == TYPE + "unprocessable"
    fields = {e["field"] for e in body["errors"]}
    assert fields == {"body.name", "body.count"}
    assert all(e["message"] for e in body["errors"])


async def test_undecodable_json_is_400(asgi_client: Any) -> None:
    client = asgi_client(_framework_app())
    response = await client.post("/items", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["type"] == TYPE + "bad_request"


async def test_unknown_route_and_wrong_method_are_problems(asgi_client: Any) -> None:
    client = asgi_client(_framework_app())
    missing = await client.get("/nowhere")
    wrong = await client.delete("/items")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json()["type"] == TYPE + "not_found"
    assert wrong.status_code == 405
    assert wrong.json()["type"] == TYPE + "method_not_allowed"
    assert wrong.headers["allow"] == "POST"


async def test_unexpected_errors_are_500_without_internals(asgi_client: Any) -> None:
    response = await asgi_client(_framework_app(), raise_app_exceptions=False).get("/crash")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == TYPE + "internal"
    assert "secret internals" not in response.text


def test_as_problem_maps_what_a_route_can_raise() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    known = p.NotFound("gone")
    assert p.as_problem(known) is known
    for redis_down in (RedisConnectionError("refused"), RedisTimeoutError("slow")):
        problem = p.as_problem(redis_down)
        assert problem.status == 503 and problem.headers["Retry-After"] == "1"
    unexpected = p.as_problem(ValueError("internal detail"))
    assert isinstance(unexpected, p.InternalError)
    assert "internal detail" not in str(unexpected.to_dict())


def test_an_undocumented_slug_is_refused() -> None:
    with pytest.raises(ValueError, match="not documented"):
        p.ApiProblem(418, "teapot", "I'm a teapot")


def test_a_job_out_of_retries_answers_its_own_type_on_the_sync_route() -> None:
    # Given the error a job out of retries stores (the queue's own problem)
    stored = {"type": PROBLEM_RETRIES_EXHAUSTED, "title": "Infrastructure retries exhausted", "status": 503}
    # When the sync route rebuilds it, then the type is the same one GET /v1/jobs/{id} shows
    rebuilt = p.ApiProblem.from_dict({**stored, "job_id": "j"})
    assert rebuilt.to_dict()["type"] == PROBLEM_RETRIES_EXHAUSTED == TYPE + "retries_exhausted"


def test_every_queue_and_worker_problem_type_is_documented() -> None:
    for uri in (PROBLEM_RETRIES_EXHAUSTED, PROBLEM_CANCELLED, PROBLEM_INVALID_RESULT):
        assert uri.removeprefix(TYPE) in PROBLEM_TYPES
