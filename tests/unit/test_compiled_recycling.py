"""What the compiled core keeps for reuse when it dies (router/core/_recycle.h): the
commands Forward and Received and the delivery records (router/core/_admission.c),
Completed, SendOutcome and SubOutcomes (router/core/_answers.c). Whoever made an instance
(the compiled core, or Python code), its death must free what it holds at once, leave no
reference to its class behind beyond the few instances kept, and a subclass's instances
must be torn down as before. (That a kept instance comes back with the right values:
tests/unit/test_core_compiled.py, whose twin cores compare every command and record.)"""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from router.core import compiled
from router.core.commands import Completed, Forward, Received, SendOutcome, SubOutcomes
from router.core.records import DeliveryRecord

pytestmark = pytest.mark.skipif(compiled.on_message is None, reason=f"compiled core: {compiled.status}")

KEPT_AT_MOST = 256  # RECYCLE_KEEP


class Item:
    """An item whose end can be watched (a weak reference)."""


def _make(cls, item):
    if cls is DeliveryRecord:
        record = DeliveryRecord(b"t", "topic", 1, b"p", "pub", "link", b"t", "inc", 0, 1, 1, None)
        record.payload = item  # (a slot, as every field)
        return record
    return cls(*([item] + [None] * (len(cls._fields) - 1)))


@pytest.mark.parametrize("cls", [Forward, Received, Completed, SendOutcome, SubOutcomes, DeliveryRecord])
def test_a_dead_command_frees_its_items_and_keeps_at_most_a_few_class_references(cls):
    gc.collect()
    before = sys.getrefcount(cls)
    for _round in range(3):
        items = [Item() for _ in range(1000)]
        watched = [weakref.ref(i) for i in items]
        commands = [_make(cls, i) for i in items]
        del items
        assert all(w() is not None for w in watched)
        del commands  # every one dies: kept or freed, its item goes with it
        assert all(w() is None for w in watched)
        # The kept instances hold their class (up to the limit), nothing more piles up.
        assert 0 <= sys.getrefcount(cls) - before <= KEPT_AT_MOST
    gc.collect()  # the kept instances are out of the collector's sight, and harmless to it


def test_a_subclass_of_a_kept_command_dies_as_before():
    class Mine(Forward):
        __slots__ = ()

    gc.collect()
    before = sys.getrefcount(Mine), sys.getrefcount(Forward)
    item = Item()
    watched = weakref.ref(item)
    for _ in range(2000):
        Mine(item, b"t", b"p", False)
    del item
    assert watched() is None
    assert (sys.getrefcount(Mine), sys.getrefcount(Forward)) == before


def test_a_subclass_of_the_kept_records_dies_as_before():
    class Mine(DeliveryRecord):
        __slots__ = ("mine",)

    gc.collect()
    before = sys.getrefcount(Mine), sys.getrefcount(DeliveryRecord)
    theirs, mine = Item(), Item()
    watched = weakref.ref(theirs), weakref.ref(mine)
    for _ in range(2000):
        record = Mine(b"t", "topic", 1, theirs, "pub", "link", b"t", "inc", 0, 1, 1, None)
        record.mine = mine
    del record, theirs, mine
    assert [w() for w in watched] == [None, None]  # the base's slots and its own freed
    assert (sys.getrefcount(Mine), sys.getrefcount(DeliveryRecord)) == before
