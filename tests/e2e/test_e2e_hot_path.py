"""The session routes served in front of FastAPI (api/hot_path.py: a tool call, a session's view)
answer like the rest of the API: same validation, same problem+json, same body limit, same
documentation."""

from __future__ import annotations

import json

from tests.e2e.conftest import RunningFleet

CALL = {"call_id": "c", "type": "function_call",
        "function": {"name": "bash", "arguments": json.dumps({"command": "true"})}}


def assert_problem(response: object, status: int, slug: str) -> dict[str, object]:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    assert response.headers["content-type"] == "application/problem+json"  # type: ignore[attr-defined]
    body: dict[str, object] = response.json()  # type: ignore[attr-defined]
    assert body["type"] == f"https://atefleet.dev/problems/{slug}" and body["status"] == status
    return body


def test_invalid_session_id_is_the_same_422_on_the_hot_route_and_on_fastapi(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        hot = assert_problem(c.post("/v1/environments/my-env/sessions/-bad", json=CALL), 422, "unprocessable")
        viewed = assert_problem(c.get("/v1/environments/my-env/sessions/-bad"), 422, "unprocessable")
        routed = assert_problem(c.post("/v1/environments/my-env/sessions/-bad/resume"), 422, "unprocessable")
    assert hot["errors"][0]["field"] == routed["errors"][0]["field"] == "path.sid"  # type: ignore[index]
    assert viewed["errors"] == hot["errors"]
    assert hot["instance"] == "/v1/environments/my-env/sessions/-bad"


def test_bad_bodies_unknown_environment_and_body_limit(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        base = "/v1/environments/my-env/sessions/hot-1"
        assert_problem(c.post(base, content=b"{not json"), 400, "bad_request")
        body = assert_problem(c.post(base, json={"type": "function_call"}), 422, "invalid_tool_call")
        assert "field" in body
        assert_problem(c.post("/v1/environments/nope/sessions/hot-1", json=CALL), 404, "not_found")
        too_big = assert_problem(c.post(base, content=b"x" * ((16 << 20) + 1)), 413, "payload_too_large")
        assert too_big["max_bytes"] == 16 << 20
        # other methods on the same path are FastAPI's
        assert c.put(base, json=CALL).status_code == 405


def test_the_route_is_documented(fleet: RunningFleet) -> None:
    with fleet.client() as c:
        spec = c.get("/openapi.json").json()
    for method in ("post", "get"):
        route = spec["paths"]["/v1/environments/{env}/sessions/{sid}"][method]
        assert route["security"] == [{"HTTPBearer": []}]
        assert {p["name"] for p in route["parameters"]} == {"env", "sid"}
