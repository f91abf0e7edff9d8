"""Per-principal token bucket: burst, refill, Retry-After, isolation between principals, eviction."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from api.problems import RateLimited
from api.rate_limit import RateLimiter
from common.config import ApiConfig


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _limiter(rate: float, burst: int, clock: FakeClock, **kwargs: Any) -> RateLimiter:
    return RateLimiter(ApiConfig(rate_limit_per_s=rate, rate_limit_burst=burst), clock=clock, **kwargs)


def test_burst_then_refill() -> None:
    clock = FakeClock()
    limiter = _limiter(2.0, 3, clock)
    # given a full bucket of 3: three requests pass, the fourth waits half a second (2 tokens/s)
    assert [limiter.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.acquire("a") == pytest.approx(0.5)
    # when 0.25 s pass, half a token is back: still 0.25 s to wait
    clock.now += 0.25
    assert limiter.acquire("a") == pytest.approx(0.25)
    # when enough time passes, one token is granted; the bucket never exceeds its burst
    clock.now += 0.25
    assert limiter.acquire("a") == 0.0
    clock.now += 3600
    assert [limiter.acquire("a") for _ in range(4)][-1] > 0


def test_principals_have_separate_buckets() -> None:
    limiter = _limiter(1.0, 1, FakeClock())
    assert limiter.acquire("a") == 0.0
    assert limiter.acquire("a") > 0
    assert limiter.acquire("b") == 0.0


async def test_check_raises_rate_limited_with_retry_after() -> None:
    limiter = _limiter(0.5, 1, FakeClock())
    await limiter.check("a")
    with pytest.raises(RateLimited) as caught:
        await limiter.check("a")
    assert caught.value.status == 429
    assert caught.value.headers["Retry-After"] == "2"


async def test_zero_rate_disables_the_limit() -> None:
    limiter = RateLimiter(ApiConfig())
    assert not limiter.enabled
    for _ in range(1000):
        await limiter.check("a")


def test_idle_buckets_are_forgotten_lru() -> None:
    clock = FakeClock()
    limiter = _limiter(1.0, 1, clock, max_principals=2)
    limiter.acquire("a")
    limiter.acquire("b")
    limiter.acquire("a")  # a is now the most recent
    limiter.acquire("c")  # evicts b, the least recently used
    assert limiter.acquire("b") == 0.0  # b starts over with a full bucket
    assert limiter.acquire("c") > 0  # c was kept


async def test_429_over_http(make_client: Any) -> None:
    key = "ak_rate_0123456789"
    config = {
        "api": {"rate_limit_per_s": 1, "rate_limit_burst": 2},
        "auth": {"api_keys": [{"name": "k", "sha256": hashlib.sha256(key.encode()).hexdigest()}]},
    }
    client = make_client(config)
    headers = {"Authorization": f"Bearer {key}"}
    statuses = [(await client.get("/whoami", headers=headers)).status_code for _ in range(2)]
    assert statuses == [200, 200]
    refused = await client.get("/whoami", headers=headers)
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["type"] == "https://atefleet.dev/problems/rate_limited"
    assert int(refused.headers["retry-after"]) >= 1
    # unauthenticated requests are refused by auth first and take no token
    assert (await client.get("/whoami")).status_code == 401
