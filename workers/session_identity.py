"""Each session's identity: a short-lived signed token its commands can show to services they call.

Seed 002: "Every call carries session identity"; the worker's credential never does. A token is
minted for each incarnation of the actor (every resume gives a new one) and passed with each
tool call as `SESSION_TOKEN_ENV`; the guest hands it to commands as that variable and as a file.

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

import jwt

from common.config import Config
from common.substrate import SubstrateClient

#: The `aud` of every session token.
AUDIENCE = "atefleet-session"
#: A token's lifetime (seconds); a longer-lived session gets a new one at its next resume.
TOKEN_TTL_S = 12 * 3600.0
#: Sessions whose token is kept, most recent last (a worker serves at most a few thousand).
CACHE_MAX = 4096


def local_signing_key(fleet_key: bytes) -> bytes:
    """The HS256 key of locally minted tokens (what a verifier on this host needs)."""
    return hmac.new(fleet_key, b"atefleet session identity v1", hashlib.sha256).digest()


class SessionIdentity:
    """Mints and keeps one token per session incarnation."""

    def __init__(self, config: Config, substrate: SubstrateClient, fleet_key: bytes) -> None:
        self._remote = bool(config.ate.ateapi)
        self._substrate = substrate
        self._key = local_signing_key(fleet_key)
        #: session → (actor incarnation, token)
        self._tokens: dict[str, tuple[str, str]] = {}

    async def token(self, environment: str, session_id: str, incarnation: str,
                    owner: Callable[[], Awaitable[str]]) -> str:
        """The token of this incarnation of the session's actor, minted on first use (`owner()`
        is asked only then)."""
        session = f"{environment}/{session_id}"
        kept = self._tokens.get(session)
        if kept is not None and kept[0] == incarnation:
            return kept[1]
        minted = await self._mint(environment, session_id, await owner())
        self._tokens.pop(session, None)
        self._tokens[session] = (incarnation, minted)
        if len(self._tokens) > CACHE_MAX:
            del self._tokens[next(iter(self._tokens))]
        return minted

    async def _mint(self, environment: str, session_id: str, owner: str) -> str:
        session = f"{environment}/{session_id}"
        if self._remote:
            return await self._substrate.mint_session_jwt([AUDIENCE], environment, owner, session)
        now = int(time.time())
        claims = {"iss": "atefleet", "aud": AUDIENCE, "sub": session, "env": environment, "sid": session_id,
                  "principal": owner, "iat": now, "exp": now + int(TOKEN_TTL_S), "jti": os.urandom(12).hex()}
        return jwt.encode(claims, self._key, algorithm="HS256")
