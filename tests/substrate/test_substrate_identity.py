"""Session identity tokens against a real gRPC `SessionIdentity.MintJWT`: a session keeps its token
across resumes (a fleet park must not cost a MintJWT round trip per wake) until half its lifetime
has passed or another principal owns the session; a token whose lifetime cannot be read is kept
for its incarnation only. And locally minted tokens, the same rules."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import jwt
import pytest

from common.ateapi import ateapi_pb2 as pb
from common.ateapi import ateapi_pb2_grpc as pb_grpc
from common.config import Config
from common.substrate import SubstrateClient
from workers.session_identity import AUDIENCE, SessionIdentity, local_signing_key

KEY = b"k" * 32


class CountingIdentity(pb_grpc.SessionIdentityServicer):  # type: ignore[misc]
    """Mints a JWT for `lifetime_s` (none when None), remembering each request."""

    def __init__(self) -> None:
        self.minted: list[tuple[str, str]] = []
        self.lifetime_s: float | None = 3600.0

    async def MintJWT(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        self.minted.append((request.user_id, request.session_id))
        claims: dict[str, Any] = {"sub": request.session_id, "principal": request.user_id,
                                  "aud": list(request.audience), "n": len(self.minted)}
        if self.lifetime_s is not None:
            claims |= {"iat": time.time(), "exp": time.time() + self.lifetime_s}
        return pb.MintJWTResponse(session_jwt=jwt.encode(claims, KEY, algorithm="HS256"))


@pytest.fixture
async def identity_server() -> AsyncIterator[tuple[str, CountingIdentity]]:
    servicer = CountingIdentity()
    server = grpc.aio.server()
    pb_grpc.add_SessionIdentityServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}", servicer
    await server.stop(0)


def _owner(name: str, asked: list[str]) -> Any:
    async def owner() -> str:
        asked.append(name)
        return name
    return owner


async def test_a_minted_token_is_kept_across_resumes_until_half_its_life_or_a_new_owner(
    identity_server: tuple[str, CountingIdentity], monkeypatch: pytest.MonkeyPatch,
) -> None:
    address, servicer = identity_server
    config = Config.model_validate({"ate": {"ateapi": address}})
    asked: list[str] = []
    async with SubstrateClient(address) as substrate:
        ids = SessionIdentity(config, substrate, KEY)
        first = await ids.token("env", "s1", "pod-1", _owner("ann", asked))
        # the same incarnation does not even ask who owns the session
        assert await ids.token("env", "s1", "pod-1", _owner("ann", asked)) == first and asked == ["ann"]
        # a resume (a park and a wake) keeps it: no MintJWT
        assert await ids.token("env", "s1", "pod-2", _owner("ann", asked)) == first
        assert servicer.minted == [("ann", "env/s1")]
        # another principal owns the id now (destroyed, then created again): a new one at once
        bens = await ids.token("env", "s1", "pod-3", _owner("ben", asked))
        assert jwt.decode(bens, options={"verify_signature": False})["principal"] == "ben"
        # half its life gone: the next call gets a new one, even in the same incarnation
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 1801)
        renewed = await ids.token("env", "s1", "pod-3", _owner("ben", asked))
        assert renewed != bens and len(servicer.minted) == 3
        # a token that does not say its lifetime is kept for its incarnation only
        servicer.lifetime_s = None
        plain = await ids.token("env", "s2", "pod-4", _owner("ann", asked))
        assert await ids.token("env", "s2", "pod-4", _owner("ann", asked)) == plain
        assert await ids.token("env", "s2", "pod-5", _owner("ann", asked)) != plain
        assert len(servicer.minted) == 5


async def test_locally_minted_tokens_follow_the_same_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = SessionIdentity(Config(), None, KEY, ttl_s=100)  # type: ignore[arg-type]  # local: no Substrate call
    asked: list[str] = []
    first = await ids.token("env", "s1", "pod-1", _owner("ann", asked))
    claims = jwt.decode(first, local_signing_key(KEY), algorithms=["HS256"], audience=AUDIENCE)
    assert (claims["sub"], claims["principal"], claims["exp"] - claims["iat"]) == ("env/s1", "ann", 100)
    assert await ids.token("env", "s1", "pod-2", _owner("ann", asked)) == first
    bens = await ids.token("env", "s1", "pod-3", _owner("ben", asked))
    assert bens != first
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 51)
    second = await ids.token("env", "s1", "pod-3", _owner("ben", asked))
    assert jwt.decode(second, local_signing_key(KEY), algorithms=["HS256"], audience=AUDIENCE,
                      options={"verify_iat": False})["principal"] == "ben"
    assert second != bens
