"""Garbage-collector settings for the request loops (API, workers), process-wide.

Their hot paths make next to no reference cycles: a request's or a job's objects are freed by
reference counting. With Python's default (a young collection every 700 net allocations) the
collector still ran every few requests under load, walked every in-flight request's objects,
promoted them, and those promotions set off full collections over the whole start-up heap
(~80,000 objects, ~50 ms each): 15-20% of the API's CPU and ~3% of a worker's, for nothing freed
(py-spy under bench/async.py and bench/e2e.py). Cycles an error path makes (a traceback) are
still collected, only later.
"""

from __future__ import annotations

import gc


def collect_rarely(young_threshold: int) -> None:
    """Leave what exists now (modules, config, the app) out of every later collection, and run a
    young collection every `young_threshold` net allocations. Call once, after start-up."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(young_threshold, *gc.get_threshold()[1:])
