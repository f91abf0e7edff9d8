"""Who is calling and what they may touch: bearer API keys and JWTs → a `Principal`.

Credentials arrive as `Authorization: Bearer <token>`:
- API keys are configured as `auth.api_keys[]` with the hex SHA-256 of the key (the key itself is
  never stored); a presented key is hashed and compared with `hmac.compare_digest` against every
  configured hash, so timing does not reveal how much of a hash matched.
- JWTs (three dot-separated parts) are verified with PyJWT: HS256 with the shared secret and/or
  RS256 with the public key, whichever is configured; the key is chosen by the token's `alg`, so an
  RS256 public key can never be used as an HMAC secret (algorithm confusion). `exp` and `sub` are
  required; `iss`/`aud` are checked when configured. Claims:
    `sub`      → the principal id `jwt:<sub>` (recorded on every job)
    `envs`     → list of environment names (or patterns), or "*"; absent = no environment
    `sessions` → optional list of session ids (or patterns), or "*"; absent = all sessions
    `admin: true`, or "admin" in `scope` (space-separated) or `scp` (list) → admin
- Patterns: "*" matches everything, "abc*" is a prefix match, anything else is exact. A session
  pattern containing "/" is matched against "env/session_id", else against the session id.

Without any auth configured every request is the anonymous principal with full access; the fleet
then listens on loopback only (`auth_required` tells the entry point; it enforces the bind).
Failures are `Unauthorized` (401 + `WWW-Authenticate: Bearer`) and `Forbidden` (403) problems.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from api.problems import Forbidden, Unauthorized
from common.config import ApiKey, Config, ConfigError, JWTConfig

PrincipalKind = Literal["api_key", "jwt", "anonymous"]

#: RFC 7518 section 3.2: an HS256 key must be at least as long as the hash output.
HS256_MIN_SECRET_BYTES = 32

#: Clock skew tolerated on `exp`/`nbf`/`iat`, in seconds.
JWT_LEEWAY_S = 10.0

_ALL = frozenset({"*"})


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its id (recorded on jobs) and what it may use."""

    id: str
    kind: PrincipalKind
    environments: frozenset[str]
    sessions: frozenset[str] = _ALL
    admin: bool = False

    def may_use(self, environment: str, session_id: str | None = None) -> bool:
        """Whether this principal may act on the environment (and the session, when given)."""
        if not _matches_any(self.environments, environment):
            return False
        if session_id is None or "*" in self.sessions:
            return True
        return any(matches_pattern(p, f"{environment}/{session_id}" if "/" in p else session_id)
                   for p in self.sessions)

    def check(self, environment: str, session_id: str | None = None) -> None:
        """Raise Forbidden (403) unless `may_use(environment, session_id)`."""
        if not self.may_use(environment, session_id):
            what = f"session '{session_id}' of environment" if session_id is not None else "environment"
            raise Forbidden(f"this principal may not use {what} '{environment}'")

    def may_see(self, owner: str, environment: str, session_id: str) -> bool:
        """Whether this principal may see or touch a job: its own, in a session it may still use."""
        return owner == self.id and self.may_use(environment, session_id)

    def check_admin(self) -> None:
        """Raise Forbidden (403) unless the principal has the admin scope."""
        if not self.admin:
            raise Forbidden("this operation needs the admin scope")


ANONYMOUS = Principal(id="anonymous", kind="anonymous", environments=_ALL, sessions=_ALL, admin=True)


def matches_pattern(pattern: str, value: str) -> bool:
    """"*" matches everything, "abc*" is a prefix match, anything else is exact."""
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return pattern == value


def _matches_any(patterns: frozenset[str], value: str) -> bool:
    # "*" first: one set lookup answers every call of an unrestricted principal (all of them,
    # without auth configured).
    return "*" in patterns or any(matches_pattern(p, value) for p in patterns)


def auth_required(config: Config) -> bool:
    """True when credentials are configured; False means anonymous full access (loopback only)."""
    return config.auth.enabled


class Authenticator:
    """Turns an Authorization header into a Principal according to `config.auth`."""

    def __init__(self, config: Config) -> None:
        """Load keys once. Raises ConfigError for unreadable or too-weak key material."""
        self._enabled = config.auth.enabled
        self._api_keys: tuple[tuple[bytes, ApiKey], ...] = tuple(
            (bytes.fromhex(k.sha256), k) for k in config.auth.api_keys
        )
        self._jwt = config.auth.jwt
        self._jwt_keys: dict[str, Any] = _load_jwt_keys(config.auth.jwt)

    def authenticate(self, authorization_header: str | None) -> Principal:
        """The caller's Principal. Raises Unauthorized for a missing, malformed or invalid token."""
        if not self._enabled:
            return ANONYMOUS
        token = _bearer_token(authorization_header)
        if _looks_like_jwt(token) and self._jwt_keys:
            return self._from_jwt(token)
        key = self._match_api_key(token)
        if key is None:
            raise Unauthorized("the bearer token is not valid", token_given=True)
        return Principal(
            id=f"key:{key.name}",
            kind="api_key",
            environments=frozenset(key.environments),
            sessions=frozenset(key.sessions),
            admin=key.admin,
        )

    def _match_api_key(self, token: str) -> ApiKey | None:
        digest = hashlib.sha256(token.encode()).digest()
        found: ApiKey | None = None
        # Compare against every key (no early exit) so timing does not depend on which one matched.
        for stored, key in self._api_keys:
            if hmac.compare_digest(digest, stored):
                found = key
        return found

    def _from_jwt(self, token: str) -> Principal:
        try:
            alg = jwt.get_unverified_header(token).get("alg")
            key = self._jwt_keys.get(str(alg))
            if key is None:
                raise Unauthorized(f"JWT algorithm {alg!r} is not accepted", token_given=True)
            claims = jwt.decode(
                token,
                key,
                algorithms=[str(alg)],
                issuer=self._jwt.issuer or None,
                audience=self._jwt.audience or None,
                leeway=JWT_LEEWAY_S,
                options={"require": ["exp", "sub"], "verify_aud": bool(self._jwt.audience)},
            )
        except jwt.ExpiredSignatureError as err:
            raise Unauthorized("the JWT has expired", token_given=True) from err
        except jwt.PyJWTError as err:
            raise Unauthorized(f"the JWT is not valid: {err}", token_given=True) from err
        return _principal_from_claims(claims)


def _bearer_token(header: str | None) -> str:
    if not header:
        raise Unauthorized("an Authorization: Bearer token is required")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("the Authorization header must be 'Bearer <token>'", token_given=True)
    return token


def _looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2


def _claim_set(claims: dict[str, Any], name: str, absent: frozenset[str]) -> frozenset[str]:
    value = claims.get(name)
    if value is None:
        return absent
    if value == "*":
        return _ALL
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise Unauthorized(f"the JWT claim '{name}' must be a list of strings or \"*\"", token_given=True)


def _is_admin(claims: dict[str, Any]) -> bool:
    scope = claims.get("scope")
    scp = claims.get("scp")
    return (
        claims.get("admin") is True
        or (isinstance(scope, str) and "admin" in scope.split())
        or (isinstance(scp, list) and "admin" in scp)
    )


def _principal_from_claims(claims: dict[str, Any]) -> Principal:
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise Unauthorized("the JWT 'sub' claim must be a non-empty string", token_given=True)
    return Principal(
        id=f"jwt:{subject}",
        kind="jwt",
        environments=_claim_set(claims, "envs", frozenset()),
        sessions=_claim_set(claims, "sessions", _ALL),
        admin=_is_admin(claims),
    )


def _load_jwt_keys(cfg: JWTConfig) -> dict[str, Any]:
    """Verification key per accepted algorithm; only configured algorithms are accepted."""
    keys: dict[str, Any] = {}
    if cfg.hs256_secret_file:
        keys["HS256"] = _load_hs256_secret(cfg.hs256_secret_file)
    if cfg.rs256_public_key_file:
        path = Path(cfg.rs256_public_key_file)
        try:
            keys["RS256"] = load_pem_public_key(path.read_bytes())
        except (OSError, ValueError) as err:
            raise ConfigError(f"auth.jwt.rs256_public_key_file: cannot load a PEM public key: {err}") from err
    return keys


def _load_hs256_secret(value: str) -> bytes:
    """The secret is the named file's content when it exists, else the value itself (see config)."""
    path = Path(value)
    if path.is_file():
        secret = path.read_bytes().strip()
    elif value.startswith(("/", "./", "../", "~")):
        raise ConfigError(f"auth.jwt.hs256_secret_file: file {value} does not exist")
    else:
        secret = value.encode()
    if len(secret) < HS256_MIN_SECRET_BYTES:
        raise ConfigError(
            f"auth.jwt.hs256_secret_file: the secret must be at least {HS256_MIN_SECRET_BYTES} bytes"
        )
    return secret


#: Declares the bearer scheme in /openapi.json; errors are ours (auto_error off), not FastAPI's.
