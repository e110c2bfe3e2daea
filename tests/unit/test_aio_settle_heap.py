"""A started server's heap: startup's objects frozen out of the cyclic collector, young collections rarer."""

from __future__ import annotations

import gc

from corral import aio


def test_settle_heap_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        aio.settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == aio.SERVING_GC_THRESHOLD
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
