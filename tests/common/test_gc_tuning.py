"""The request loops' garbage collector settings (API and worker processes)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from common.gc_tuning import collect_rarely


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_collect_rarely_freezes_the_startup_heap_and_raises_the_young_threshold(restored_gc: None) -> None:
    older = gc.get_threshold()[1:]
    collect_rarely(12_345)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (12_345, *older)
