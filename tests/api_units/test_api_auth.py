"""Bearer auth: API keys by hash, JWT HS256/RS256 with issuer/audience, 401/403 problems."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from api.auth import ANONYMOUS, Authenticator, Principal, auth_required
from api.problems import Forbidden, Unauthorized
from common.config import ConfigError, parse_config

PROBLEMS = "https://atefleet.dev/problems/"
KEY = "ak_live_0123456789abcdef"
ADMIN_KEY = "ak_admin_fedcba9876543210"
HS_SECRET = "s3cr3t-that-is-at-least-32-bytes-long!!"
ISSUER = "https://issuer.test"
AUDIENCE = "atefleet"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _key_config() -> dict[str, Any]:
    return {"auth": {"api_keys": [
        {"name": "ci", "sha256": _sha(KEY), "environments": ["my-env"], "sessions": ["s-*"]},
        {"name": "ops", "sha256": _sha(ADMIN_KEY), "admin": True},
    ]}}


@pytest.fixture(scope="module")
def rsa_pair() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) generated for this test run."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private_pem, public_pem


@pytest.fixture
def jwt_config(tmp_path: Path, rsa_pair: tuple[bytes, bytes]) -> dict[str, Any]:
    secret_file = tmp_path / "hs256.secret"
    secret_file.write_text(HS_SECRET + "\n")
    public_file = tmp_path / "rs256.pem"
    public_file.write_bytes(rsa_pair[1])
    return {"auth": {"jwt": {"hs256_secret_file": str(secret_file), "rs256_public_key_file": str(public_file),
                             "issuer": ISSUER, "audience": AUDIENCE}}}


def _claims(**overrides: Any) -> dict[str, Any]:
    claims = {"sub": "agent-7", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 300,
              "envs": ["my-env"]}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _hs(**overrides: Any) -> str:
    return jwt.encode(_claims(**overrides), HS_SECRET, algorithm="HS256")


def _rs(private_pem: bytes, **overrides: Any) -> str:
    return jwt.encode(_claims(**overrides), private_pem, algorithm="RS256")


CALL = {"call_id": "c1", "type": "function_call", "function": {"name": "bash", "arguments": "{}"}}


# --- over HTTP: the dependency, 401 and 403 answers ------------------------------------------


async def test_api_key_accepted_and_env_checked(make_client: Any) -> None:
    client = make_client(_key_config())
    ok = await client.post("/v1/environments/my-env/sessions/s-1", json=CALL, headers=_bearer(KEY))
    assert ok.status_code == 200
    assert ok.json()["call_id"] == "c1"
    other_env = await client.post("/v1/environments/prod/sessions/s-1", json=CALL, headers=_bearer(KEY))
    assert other_env.status_code == 403
    assert other_env.headers["content-type"] == "application/problem+json"
    assert other_env.json()["type"] == PROBLEMS + "forbidden"
    other_session = await client.post("/v1/environments/my-env/sessions/x-1", json=CALL, headers=_bearer(KEY))
    assert other_session.status_code == 403


@pytest.mark.parametrize(
    ("headers", "challenge"),
    [
        ({}, 'Bearer realm="atefleet"'),
        (_bearer("wrong-key"), 'Bearer realm="atefleet", error="invalid_token"'),
        ({"Authorization": f"Basic {KEY}"}, 'Bearer realm="atefleet", error="invalid_token"'),
        ({"Authorization": "Bearer "}, 'Bearer realm="atefleet", error="invalid_token"'),
    ],
    ids=["missing", "wrong-key", "wrong-scheme", "empty-token"],
)
async def test_bad_credentials_are_401_with_bearer_challenge(
    make_client: Any, headers: dict[str, str], challenge: str
) -> None:
    response = await make_client(_key_config()).get("/whoami", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == challenge
    assert response.json()["type"] == PROBLEMS + "unauthorized"


async def test_jwt_over_http(
    make_client: Any, jwt_config: dict[str, Any], rsa_pair: tuple[bytes, bytes]
) -> None:
    client = make_client(jwt_config)
    who = await client.get("/whoami", headers=_bearer(_rs(rsa_pair[0], scope="read admin")))
    assert who.json() == {"id": "jwt:agent-7", "kind": "jwt", "admin": True}
    expired = await client.get("/whoami", headers=_bearer(_hs(exp=int(time.time()) - 3600)))
    assert expired.status_code == 401
    assert "expired" in expired.json()["detail"]


async def test_without_auth_everyone_is_anonymous_with_full_access(make_client: Any) -> None:
    client = make_client()
    who = await client.get("/whoami", headers=_bearer("anything"))
    assert who.json() == {"id": "anonymous", "kind": "anonymous", "admin": True}
    ran = await client.post("/v1/environments/any/sessions/any", json=CALL)
    assert ran.status_code == 200


# --- the Authenticator directly -------------------------------------------------------------


def test_api_key_principal() -> None:
    auth = Authenticator(parse_config(_key_config()))
    ci = auth.authenticate(f"Bearer {KEY}")
    assert ci == Principal(id="key:ci", kind="api_key", environments=frozenset({"my-env"}),
                           sessions=frozenset({"s-*"}), admin=False)
    ops = auth.authenticate(f"bearer  {ADMIN_KEY} ")  # scheme is case-insensitive, spaces tolerated
    assert ops.admin and ops.may_use("any-env", "any-session")
    with pytest.raises(Forbidden):
        ci.check_admin()
    ops.check_admin()


def test_hs256_and_rs256(jwt_config: dict[str, Any], rsa_pair: tuple[bytes, bytes]) -> None:
    auth = Authenticator(parse_config(jwt_config))
    hs = auth.authenticate(f"Bearer {_hs(sessions=['a', 'b'])}")
    assert (hs.id, hs.kind, hs.environments, hs.sessions, hs.admin) == (
        "jwt:agent-7", "jwt", frozenset({"my-env"}), frozenset({"a", "b"}), False)
    rs = auth.authenticate(f"Bearer {_rs(rsa_pair[0], envs='*', admin=True)}")
    assert rs.may_use("whatever", "x") and rs.admin
    assert auth.authenticate(f"Bearer {_hs(scp=['admin'])}").admin


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"iss": "https://evil.test"}, "issuer"),
        ({"aud": "someone-else"}, "audience"),
        ({"exp": None}, "exp"),
        ({"sub": None}, "sub"),
        ({"exp": int(time.time()) - 3600}, "expired"),
        ({"nbf": int(time.time()) + 3600}, "not yet valid"),
        ({"envs": "my-env"}, "envs"),
    ],
    ids=["issuer", "audience", "no-exp", "no-sub", "expired", "not-before", "envs-not-list"],
)
def test_invalid_jwts_are_401(jwt_config: dict[str, Any], overrides: dict[str, Any], reason: str) -> None:
    auth = Authenticator(parse_config(jwt_config))
    with pytest.raises(Unauthorized) as caught:
        auth.authenticate(f"Bearer {_hs(**overrides)}")
    assert reason in caught.value.detail.lower() or reason in str(caught.value.__cause__).lower()
    assert caught.value.headers["WWW-Authenticate"].endswith('error="invalid_token"')


def test_wrong_signatures_and_algorithms_are_401(
    jwt_config: dict[str, Any], rsa_pair: tuple[bytes, bytes], tmp_path: Path
) -> None:
    auth = Authenticator(parse_config(jwt_config))
    other_private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode(_claims(), other_private, algorithm="RS256")
    unsigned = jwt.encode(_claims(), None, algorithm="none")
    wrong_secret = jwt.encode(_claims(), "another-secret-that-is-32-bytes-long!!", algorithm="HS256")
    for token in (forged, unsigned, wrong_secret, "a.b.c"):
        with pytest.raises(Unauthorized):
            auth.authenticate(f"Bearer {token}")
    # Algorithm confusion: with only RS256 configured, an HS256 token signed with the public key
    # must not verify (the key is picked by algorithm, and HS256 has none).
    rs_only = dict(jwt_config["auth"]["jwt"], hs256_secret_file="")
    rs_auth = Authenticator(parse_config({"auth": {"jwt": rs_only}}))
    confused = _hmac_jwt(_claims(), rsa_pair[1])
    with pytest.raises(Unauthorized, match="not accepted"):
        rs_auth.authenticate(f"Bearer {confused}")


def _hmac_jwt(claims: dict[str, Any], key: bytes) -> str:
    """An HS256 JWT built by hand: PyJWT itself refuses to use a PEM key as an HMAC secret."""
    import base64
    import hmac
    import json

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    signing_input = f"{header}.{b64(json.dumps(claims).encode())}"
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def test_jwt_without_envs_claim_may_use_nothing(jwt_config: dict[str, Any]) -> None:
    principal = Authenticator(parse_config(jwt_config)).authenticate(f"Bearer {_hs(envs=None)}")
    assert not principal.may_use("my-env")
    with pytest.raises(Forbidden, match="environment 'my-env'"):
        principal.check("my-env", "s1")


def test_api_keys_and_jwt_together(jwt_config: dict[str, Any]) -> None:
    both = {"auth": {**_key_config()["auth"], "jwt": jwt_config["auth"]["jwt"]}}
    auth = Authenticator(parse_config(both))
    assert auth.authenticate(f"Bearer {KEY}").kind == "api_key"
    assert auth.authenticate(f"Bearer {_hs()}").kind == "jwt"


# --- patterns, job visibility, config -------------------------------------------------------


def test_patterns_and_job_visibility() -> None:
    p = Principal(id="key:a", kind="api_key", environments=frozenset({"dev-*", "prod"}),
                  sessions=frozenset({"run-*", "prod/fixed"}))
    assert p.may_use("dev-1", "run-9") and p.may_use("prod", "fixed") and p.may_use("prod")
    assert not p.may_use("dev-1", "fixed")  # "prod/fixed" is scoped to env prod
    assert not p.may_use("production")
    assert p.may_see("key:a", "dev-1", "run-1")
    assert not p.may_see("key:b", "dev-1", "run-1")  # another principal's job
    assert not p.may_see("key:a", "other", "run-1")  # access since withdrawn
    assert ANONYMOUS.may_use("x", "y") and ANONYMOUS.may_see("anonymous", "x", "y")


def test_auth_required_and_bad_key_material(tmp_path: Path) -> None:
    assert not auth_required(parse_config({}))
    assert auth_required(parse_config(_key_config()))
    short = tmp_path / "short"
    short.write_text("too-short")
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        Authenticator(parse_config({"auth": {"jwt": {"hs256_secret_file": str(short)}}}))
    with pytest.raises(ConfigError, match="does not exist"):
        Authenticator(parse_config({"auth": {"jwt": {"hs256_secret_file": str(tmp_path / "missing")}}}))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    with pytest.raises(ConfigError, match="PEM"):
        Authenticator(parse_config({"auth": {"jwt": {"rs256_public_key_file": str(not_pem)}}}))
    inline = Authenticator(parse_config({"auth": {"jwt": {"hs256_secret_file": HS_SECRET}}}))
    token = jwt.encode(_claims(iss=None, aud=None), HS_SECRET)
    assert inline.authenticate(f"Bearer {token}").id == "jwt:agent-7"
