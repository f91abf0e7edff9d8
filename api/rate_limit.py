"""Per-principal request rate limit: an in-process token bucket answering 429 + Retry-After.

Each principal has a bucket of `api.rate_limit_burst` tokens refilled at `api.rate_limit_per_s`;
a request takes one token or is refused with a `RateLimited` problem whose Retry-After says when
the next token arrives. `rate_limit_per_s: 0` disables the limit.

In-process, not in Redis, on purpose: the check costs well under a microsecond and no round trip,
against a ~3 ms budget for a whole sync call, and it keeps the API usable while Redis is briefly
away. The price: with N API replicas behind a load balancer (or `api.processes` under `atefleet
up`) the limit applies per replica, so a
principal can reach up to N × the configured rate in total; set the per-replica rate to the
fleet-wide target divided by N. The limit protects the fleet from one runaway client, it is not
a billing quota.

Buckets are kept for the most recently active principals only (LRU, `max_principals`): JWT
subjects are unbounded, and a bucket evicted after idling is full again anyway, so eviction only
ever forgets a partially drained bucket of a principal idle longer than everyone else.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from api.problems import RateLimited
from common.config import ApiConfig

#: Principals whose buckets are remembered; older ones are forgotten (their bucket refills anyway).
DEFAULT_MAX_PRINCIPALS = 100_000


class _Bucket:
    __slots__ = ("tokens", "updated_at")

    def __init__(self, tokens: float, updated_at: float) -> None:
        self.tokens = tokens
        self.updated_at = updated_at


class RateLimiter:
    """Token buckets keyed by principal id. Not thread-safe: call it from the event loop only."""

    def __init__(
        self,
        api: ApiConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_principals: int = DEFAULT_MAX_PRINCIPALS,
    ) -> None:
        """`api.rate_limit_per_s` tokens/s per principal, up to `api.rate_limit_burst`; 0/s = off."""
        self.rate_per_s = api.rate_limit_per_s
        self.burst = api.rate_limit_burst
        self._clock = clock
        self._max_principals = max_principals
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    def acquire(self, key: str) -> float:
        """Take one token for `key`: 0.0 when granted, else the seconds until one is available."""
        if not self.enabled:
            return 0.0
        now = self._clock()
        bucket = self._bucket(key, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated_at) * self.rate_per_s)
        bucket.updated_at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / self.rate_per_s

    async def check(self, key: str) -> None:
        """Take one token for `key` or raise RateLimited (429 with Retry-After).

        Async although it never waits, so a shared-store limiter could replace it without
        touching callers.
        """
        wait_s = self.acquire(key)
        if wait_s > 0:
            raise RateLimited(wait_s, f"more than {self.rate_per_s:g} requests/s (burst {self.burst})")

    def _bucket(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            if len(self._buckets) > self._max_principals:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket
