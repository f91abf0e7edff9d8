"""Each session's identity: a short-lived signed token its commands can show to services they call.

Seed 002: "Every call carries session identity"; the worker's credential never does. A token is
passed with each tool call as `SESSION_TOKEN_ENV`; the guest hands it to commands as that variable
and as a file. A worker process keeps a session's token across resumes (the fleet's parks are
invisible but for latency, and a wake then costs no MintJWT round trip) until half its lifetime has
passed, when the next call gets a new one; a session that another principal now owns (destroyed,
then created again) gets a new one at once. A token whose lifetime cannot be read is kept for its
incarnation only (every resume gives a new one). Tokens are never kept in Redis: each worker
process mints its own.

- Against a real Substrate (`ate.ateapi` set), the token is `SessionIdentity.MintJWT`'s, for the
  audience `atefleet-session`, app = the environment, user = the session's owner, session =
  `env/sid`. The call carries the fleet's own Substrate credential, which never reaches a guest.
- Against the embedded local Substrate, it is an equivalent HS256 JWT signed with a key derived
  from the fleet key (`common.secret_box`): claims `iss` `atefleet`, `aud` `atefleet-session`,
  `sub` `env/sid`, `env`, `sid`, `principal` (the owner), `iat`, `exp`, `jti`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import jwt

from common.config import Config
from common.substrate import SubstrateClient

#: The `aud` of every session token.
AUDIENCE = "atefleet-session"
#: A locally minted token's lifetime (seconds).
TOKEN_TTL_S = 12 * 3600.0
#: Sessions whose token is kept, most recent last (a worker serves at most a few thousand).
CACHE_MAX = 4096


def local_signing_key(fleet_key: bytes) -> bytes:
    """The HS256 key of locally minted tokens (what a verifier on this host needs)."""
    return hmac.new(fleet_key, b"atefleet session identity v1", hashlib.sha256).digest()


@dataclass(frozen=True)
class _Kept:
    """A session's token, for whom and which incarnation it was minted, and when it is renewed
    (None: its lifetime is unknown, so only its own incarnation keeps it)."""

    token: str
    owner: str
    incarnation: str
    renew_at: float | None


def renew_at(token: str) -> float | None:
    """Half-way through the token's lifetime (unix s), from its own `iat` and `exp`; None if it
    does not say. Read, not verified: the worker only decides when to ask for a new one."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
        issued, expires = float(claims["iat"]), float(claims["exp"])
    except (jwt.InvalidTokenError, KeyError, TypeError, ValueError):
        return None
    return issued + (expires - issued) / 2


class SessionIdentity:
    """Mints and keeps one token per session (see the module docstring)."""

    def __init__(self, config: Config, substrate: SubstrateClient, fleet_key: bytes,
                 ttl_s: float = TOKEN_TTL_S) -> None:
        self._remote = bool(config.ate.ateapi)
        self._substrate = substrate
        self._key = local_signing_key(fleet_key)
        self._ttl_s = ttl_s
        self._tokens: dict[str, _Kept] = {}

    async def token(self, environment: str, session_id: str, incarnation: str,
                    owner: Callable[[], Awaitable[str]]) -> str:
        """The session's token for this incarnation of its actor (`owner()` is asked only when
        the incarnation is new to it)."""
        session = f"{environment}/{session_id}"
        kept = self._tokens.get(session)
        fresh = kept is not None and (kept.renew_at is None or time.time() < kept.renew_at)
        if kept is not None and fresh and kept.incarnation == incarnation:
            return kept.token
        who = await owner()
        if kept is not None and fresh and kept.renew_at is not None and kept.owner == who:
            kept = replace(kept, incarnation=incarnation)
        else:
            token = await self._mint(environment, session_id, who)
            kept = _Kept(token, who, incarnation, renew_at(token))
        self._tokens.pop(session, None)
        self._tokens[session] = kept
        if len(self._tokens) > CACHE_MAX:
            del self._tokens[next(iter(self._tokens))]
        return kept.token

    async def _mint(self, environment: str, session_id: str, owner: str) -> str:
        session = f"{environment}/{session_id}"
        if self._remote:
            return await self._substrate.mint_session_jwt([AUDIENCE], environment, owner, session)
        now = int(time.time())
        claims = {"iss": "atefleet", "aud": AUDIENCE, "sub": session, "env": environment, "sid": session_id,
                  "principal": owner, "iat": now, "exp": now + int(self._ttl_s), "jti": os.urandom(12).hex()}
        return jwt.encode(claims, self._key, algorithm="HS256")
