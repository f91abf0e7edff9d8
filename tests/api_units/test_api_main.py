"""The API process's garbage collector settings."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from api.main import GC_YOUNG_THRESHOLD, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tune_gc_freezes_the_startup_heap_and_raises_the_young_threshold(restored_gc: None) -> None:
    older = gc.get_threshold()[1:]
    tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *older)
