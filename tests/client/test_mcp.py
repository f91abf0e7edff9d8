"""The MCP endpoint (`/mcp/{env}/{sid}`, api/mcp.py) end to end, driven by the `mcp` SDK's own client."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.client.conftest import KEY_ALICE, KEY_BOB, RunningFleet


def mcp_client(url: str, token: str | None = None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return Client(streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)))


async def test_tools_list_and_call_through_the_queue(fleet: RunningFleet) -> None:
    sid = f"mcp-{uuid.uuid4().hex[:8]}"
    async with mcp_client(f"{fleet.url}/mcp/my-env/{sid}") as client:
        # tools/list: the environment's allowed tools with their JSON schemas
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "bash" in tools and "read_file" in tools
        assert tools["bash"].input_schema["required"] == ["command"]
        # tools/call: runs in the session, which must be running as for any HTTP call
        resumed = httpx.post(f"{fleet.url}/v1/environments/my-env/sessions/{sid}/resume", timeout=120)
        assert resumed.status_code == 200
        progress: list[tuple[float, str | None]] = []

        async def on_progress(done: float, total: float | None, message: str | None) -> None:
            progress.append((done, message))

        result = await client.call_tool("bash", {"command": "for i in 1 2 3; do echo $i; sleep 0.3; done"},
                                        progress_callback=on_progress)
        assert not result.is_error
        assert result.content[0].text == "1\n2\n3\n"  # type: ignore[union-attr]
        # long output arrives as progress notifications while the job runs
        assert "".join(m or "" for _, m in progress) == "1\n2\n3\n"
        failed = await client.call_tool("bash", {"command": "exit 4"})
        assert failed.is_error
        # the call went through the queue: the job is in the session's history like any other
        shown = httpx.get(f"{fleet.url}/v1/environments/my-env/sessions/{sid}", timeout=30).json()
        assert shown["state"] == "running"


async def test_skills_are_prompts(fleet: RunningFleet) -> None:
    sid = f"mcp-skills-{uuid.uuid4().hex[:8]}"
    httpx.post(f"{fleet.url}/v1/environments/my-env/sessions/{sid}/resume", timeout=120).raise_for_status()
    async with mcp_client(f"{fleet.url}/mcp/my-env/{sid}") as client:
        prompts = (await client.list_prompts()).prompts
        assert [(p.name, p.description) for p in prompts] == [("hello", "Says hello.")]
        prompt = await client.get_prompt("hello")
        assert "echo hello" in prompt.messages[0].content.text  # type: ignore[union-attr]


async def test_problems_become_tool_errors(fleet: RunningFleet) -> None:
    # Given a session that was never resumed, a call is refused by the fleet's own checks
    async with mcp_client(f"{fleet.url}/mcp/my-env/mcp-cold-{uuid.uuid4().hex[:8]}") as client:
        result = await client.call_tool("read_file", {"path": "x"})
        assert result.is_error
        problem: dict[str, Any] = json.loads(result.content[0].text)  # type: ignore[union-attr]
        assert problem["type"].endswith("/session_not_running")
        # a tool the environment does not allow is answered in-band, as on the HTTP route
        refused = await client.call_tool("not_a_tool", {})
        assert refused.is_error


async def test_auto_resume_endpoint(fleet: RunningFleet) -> None:
    # Given ?auto_resume=true, a call to a session never resumed resumes it for the call
    url = f"{fleet.url}/mcp/my-env/mcp-auto-{uuid.uuid4().hex[:8]}?auto_resume=true"
    async with mcp_client(url) as client:
        result = await client.call_tool("bash", {"command": "echo woke"})
        assert not result.is_error and result.content[0].text == "woke\n"  # type: ignore[union-attr]


@pytest.mark.parametrize("path", ["/mcp/no-such-env/s1", "/mcp/my-env", "/mcp/my-env/bad%20id"])
def test_bad_targets_are_problems(fleet: RunningFleet, path: str) -> None:
    answer = httpx.post(f"{fleet.url}{path}", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert answer.status_code in (404, 422) and answer.headers["content-type"] == "application/problem+json"


async def test_same_bearer_auth(auth_fleet: RunningFleet) -> None:
    # Without a token: 401 problem+json before MCP sees the request
    anonymous = httpx.post(f"{auth_fleet.url}/mcp/my-env/s1", json={"jsonrpc": "2.0", "id": 1,
                                                                     "method": "tools/list"})
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
    # alice may not use other-env; bob may
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    refused = httpx.post(f"{auth_fleet.url}/mcp/other-env/s1", json=listing,
                         headers={"Authorization": f"Bearer {KEY_ALICE}"})
    assert refused.status_code in (403, 404)
    async with mcp_client(f"{auth_fleet.url}/mcp/other-env/s1", KEY_BOB) as client:
        assert (await client.list_tools()).tools
