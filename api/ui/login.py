"""The UI's login: a bearer token kept in a cookie, the admin check, and CSRF tokens for actions.

Browsers cannot attach `Authorization` to page loads or EventSource, so the login form stores the
token the operator pastes in an HttpOnly, SameSite=Strict cookie scoped to `/ui` (Secure when the
request came over https); every UI request authenticates it exactly as the API authenticates a
header (`Authenticator`, rate limit), then requires the admin scope. Without auth configured the
API listens on loopback only and everyone is the anonymous admin, so no login is needed.

Actions are POSTs carrying a CSRF token derived from the cookie's token (HMAC with a per-process
key, compared in constant time): SameSite=Strict already keeps the cookie off cross-site requests,
and the token also stops a same-site page (another app on the host) from posting with it.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from fastapi import Request
from starlette.datastructures import FormData

from api.auth import Principal
from api.fleet import Fleet, caller
from api.problems import Forbidden

#: The cookie holding the operator's bearer token.
COOKIE = "atefleet_ui"
#: How long the cookie lasts (s): a working day; the token itself may expire sooner (JWT).
COOKIE_MAX_AGE_S = 12 * 3600

#: Per-process key for CSRF tokens: they only need to hold for this process's pages, and a form
#: served by another API process fails once and is reloaded.
_CSRF_KEY = os.urandom(32)


class LoginRequired(Exception):
    """No valid token: the page answers a redirect to the login form."""


def token_of(request: Request) -> str:
    return request.cookies.get(COOKIE, "")


async def ui_principal(request: Request) -> Principal:
    """The operator behind a UI request (cookie, else an Authorization header); admin only.

    Raises LoginRequired when auth is on and no token came, Unauthorized for a bad one, Forbidden
    without the admin scope."""
    fleet: Fleet = request.app.state.fleet
    token = token_of(request)
    headers = {"authorization": f"Bearer {token}"} if token else dict(request.headers)
    if fleet.config.auth.enabled and not headers.get("authorization"):
        raise LoginRequired
    principal = await caller(fleet, headers)
    if not principal.admin:
        raise Forbidden("the operator UI needs the admin scope")
    return principal


def csrf_token(request: Request) -> str:
    return hmac.new(_CSRF_KEY, token_of(request).encode(), hashlib.sha256).hexdigest()


def check_csrf(request: Request, form: FormData) -> None:
    """Refuse an action whose form lacks this cookie's CSRF token, or that came from another origin."""
    origin = request.headers.get("origin")
    if origin and origin.split("://", 1)[-1] != request.headers.get("host"):
        raise Forbidden("cross-origin form posts are refused")
    given = form.get("csrf")
    if not isinstance(given, str) or not hmac.compare_digest(given, csrf_token(request)):
        raise Forbidden("this form is stale or forged (CSRF token); reload the page")
