"""What the sync and async clients share: `ClientCore` (settings, plans, a transport) and
`SessionCore` (a session's identity and call options, and the plans behind its methods). Each
client class only runs plans, with its own runner over its own transport."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from atefleet.client._api import (
    Settings,
    call_op,
    envelope,
    lifecycle_op,
    submit_op,
    tool_item,
    tool_result,
    view_op,
)
from atefleet.client._plans import Plan, Plans
from atefleet.client._tools import ToolMethods
from atefleet.client.models import Job, SessionInfo, ToolResult
from atefleet.client.tool_shapes import as_item, request_body, result_item, shape_of

R = TypeVar("R")
X = TypeVar("X")


def settings_from_env(base_url: str | None, token: str | None, **options: Any) -> Settings:
    """Settings from arguments, else `$ATEFLEET_API_URL` / `$ATEFLEET_TOKEN`, else the defaults."""
    url = base_url or os.environ.get("ATEFLEET_API_URL") or Settings.base_url
    return Settings(base_url=url.rstrip("/"), token=token or os.environ.get("ATEFLEET_TOKEN"), **options)


class ClientCore(Generic[X]):
    #: The transport class: (base URL, fixed headers, TLS context, connect timeout) -> transport.
    transport_class: Callable[[str, Mapping[str, str], ssl.SSLContext | None, float], X]

    def __init__(self, base_url: str | None = None, token: str | None = None, *,
                 tls: ssl.SSLContext | None = None, **options: Any) -> None:
        self.settings = settings_from_env(base_url, token, **options)
        self._plans = Plans(self.settings)
        self._transport = self.transport_class(self.settings.base_url, self.settings.headers(), tls,
                                               self.settings.connect_timeout_s)


class SessionCore(ToolMethods[R]):
    def __init__(self, plans: Plans, env: str, sid: str, *, auto_resume: bool,
                 env_variables: Mapping[str, str] | None) -> None:
        self._plans = plans
        self.env, self.sid = env, sid
        self.auto_resume = auto_resume
        self.env_variables = dict(env_variables or {})

    def body(self, item: Mapping[str, Any]) -> dict[str, Any]:
        """A call body for this session: `item` with its auto_resume and env_variables."""
        return envelope(item, auto_resume=self.auto_resume, env_variables=self.env_variables)

    def _plan_lifecycle(self, action: str, **flags: bool) -> Plan[dict[str, Any]]:
        """resume / suspend / destroy, with the flags that are set as query parameters."""
        params = {name: True for name, on in flags.items() if on} or None
        return self._plans.followed(lifecycle_op(self.env, self.sid, action, params))

    def _plan_view(self) -> Plan[SessionInfo]:
        return self._plans.call(view_op(self.env, self.sid))

    def _plan_tool(self, name: str, arguments: dict[str, Any]) -> Plan[ToolResult]:
        op = call_op(self.env, self.sid, self.body(tool_item(name, arguments)))
        return tool_result((yield from self._plans.followed(op)))

    def _plan_call(self, item: Any) -> Plan[dict[str, Any]]:
        """A model's tool call (OpenAI Responses / Chat Completions / Anthropic / seed item), and
        the result item that model API expects next (see `atefleet.client.tool_shapes`)."""
        raw = as_item(item)
        shape = shape_of(raw)
        op = call_op(self.env, self.sid, self.body(request_body(raw, shape)))
        answer = yield from self._plans.followed(op)
        return result_item(answer, raw, shape)

    def _plan_submit(self, name: str, arguments: dict[str, Any], callback_url: str | None,
                     callback_secret_id: str | None) -> Plan[Job]:
        body = envelope(tool_item(name, arguments), auto_resume=self.auto_resume,
                        env_variables=self.env_variables, callback_url=callback_url,
                        callback_secret_id=callback_secret_id)
        return self._plans.call(submit_op(self.env, self.sid, body))
