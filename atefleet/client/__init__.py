"""The atefleet Python SDK: `Client` (sync) and `AsyncClient` (asyncio) for the fleet's HTTP API.

    from atefleet.client import Client

    with Client("http://127.0.0.1:7777") as client:
        print(client.session("my-env", "s1", auto_resume=True).bash("uname -a").output)

Installable alone (`pip install ./sdk`: pydantic and httptools only), or with the server. Errors:
`atefleet.client.errors` (one class per problem `type`). Webhooks: `verify_webhook`, and
`asgi_webhook_app` / `wsgi_webhook_app`.
"""

from atefleet.client._api import tool_item
from atefleet.client.aio import AsyncClient, AsyncSession
from atefleet.client.client import Client, Session
from atefleet.client.errors import AtefleetError, JobNotFinished, ProblemError, TransportError
from atefleet.client.models import Environment, Job, JobState, OutputChunk, Problem, SessionInfo, ToolResult
from atefleet.client.webhook_apps import asgi_webhook_app, wsgi_webhook_app
from atefleet.client.webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "AsyncClient", "AsyncSession", "AtefleetError", "Client", "Environment", "Job", "JobNotFinished",
    "JobState", "OutputChunk", "Problem", "ProblemError", "Session", "SessionInfo", "ToolResult",
    "TransportError", "WebhookVerificationError", "asgi_webhook_app", "tool_item", "verify_webhook",
    "wsgi_webhook_app",
]
