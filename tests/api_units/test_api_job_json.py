"""Job JSON times: `rfc3339` is datetime's millisecond ISO form, to the last digit."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from common.job_json import rfc3339


def by_datetime(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_rfc3339_is_datetimes_iso_form() -> None:
    rng = random.Random(7)
    times = [rng.uniform(-2e9, 4e9) for _ in range(20_000)]
    times += [rng.randrange(4_000_000_000_000) / 1000 for _ in range(20_000)]  # whole ms, as jobs have
    # fractions that round (half to even) across a millisecond or a second
    times += [s + f for s in (1764465251.0, 0.0, -1.0, 86399.0)
              for f in (0.9999995, 0.9999994999, 0.9999996, 0.0000005, 0.0000015, 0.9995, -0.0000005)]
    assert [rfc3339(t) for t in times] == [by_datetime(t) for t in times]
    assert rfc3339(1764465251.082) == "2025-11-30T01:14:11.082Z"
    assert rfc3339(None) is None
