"""The compiled parts' getattr and setattr by name (router/core/_attrs.h): a plain slot
read and written by its offset, remembered per class and name, and everything else as
Python does it. Here they are held to Python's own getattr/setattr on classes of every
kind, changed as the program runs: the same values, the same errors."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

try:
    _admission = importlib.import_module("router.core._admission")
except ImportError:  # not built: nothing compiled to compare
    _admission = None

pytestmark = pytest.mark.skipif(_admission is None, reason="router.core._admission not built")

MISSING = object()


def python_way(obj, name, value=MISSING):
    try:
        if value is MISSING:
            return ("value", getattr(obj, name))
        setattr(obj, name, value)
        return ("set", value)
    except Exception as exc:  # the error itself is part of what must agree
        return ("error", type(exc).__name__)


def compiled_way(obj, name, value=MISSING):
    try:
        if value is MISSING:
            return ("value", _admission.attribute(obj, name))
        return ("set", _admission.attribute(obj, name, value))
    except Exception as exc:
        return ("error", type(exc).__name__)


def make_classes():
    """Fresh classes each example (a class changed by one example must not leak)."""

    class Slotted:
        __slots__ = ("a", "b")

    class SlottedWithDict:
        __slots__ = ("a", "__dict__")

    class Plain:
        pass

    class Property:
        __slots__ = ("_a",)

        @property
        def a(self):
            return ("property", getattr(self, "_a", None))

        @a.setter
        def a(self, value):
            self._a = value

    class Intercepting:
        __slots__ = ("a",)

        def __getattribute__(self, name):
            if name == "a":
                return "intercepted"
            return object.__getattribute__(self, name)

        def __setattr__(self, name, value):
            object.__setattr__(self, name, ("wrapped", value))

    class SubShadowing(Slotted):
        __slots__ = ()
        a = "a class attribute"  # type: ignore[assignment]  # not a slot any more, for this class

    class SubSlotted(Slotted):
        __slots__ = ("c",)

    return [Slotted, SlottedWithDict, Plain, Property, Intercepting, SubShadowing, SubSlotted]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("get"), st.integers(0, 6), st.sampled_from(["a", "a", "b", "c", "_a", "zz"])),
        st.tuples(st.just("set"), st.integers(0, 6), st.sampled_from(["a", "a", "b", "c", "zz"]), st.integers(0, 3)),
        st.tuples(st.just("del"), st.integers(0, 6), st.sampled_from(["a", "b"])),
        # the class changed as the program runs: an attribute of the class over the slot, and taken away again
        st.tuples(st.just("shadow"), st.integers(0, 6)),
        st.tuples(st.just("unshadow"), st.integers(0, 6)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(steps=steps)
def test_getattr_and_setattr_by_name_agree_with_python(steps):
    classes = make_classes()
    python_objects = [cls() for cls in classes]
    compiled_objects = [cls() for cls in classes]
    shadows: dict[int, object] = {}
    for step in steps:
        kind, index = step[0], step[1]
        cls = classes[index]
        if kind == "shadow":
            # A property over the slot on the class itself: the slot is no longer what "a" means.
            if index not in shadows:
                shadows[index] = cls.__dict__.get("a")
                cls.a = property(lambda self: "shadowed")  # type: ignore[attr-defined]
            continue
        if kind == "unshadow":
            if index in shadows:
                old = shadows.pop(index)
                if old is None:
                    del cls.a  # type: ignore[attr-defined]
                else:
                    cls.a = old  # type: ignore[attr-defined]
            continue
        p, c = python_objects[index], compiled_objects[index]
        if kind == "get":
            assert compiled_way(c, step[2]) == python_way(p, step[2]), step
        elif kind == "set":
            assert compiled_way(c, step[2], step[3]) == python_way(p, step[2], step[3]), step
        else:
            for obj in (p, c):
                try:
                    delattr(obj, step[2])
                except (AttributeError, TypeError):
                    pass
        for name in ("a", "b", "c"):
            assert python_way(c, name) == python_way(p, name), (step, name)


def test_a_slot_read_through_the_cache_follows_its_object():
    """The remembered offset reads each object's own slot, never another's."""

    class Pair:
        __slots__ = ("x",)

    one, two = Pair(), Pair()
    one.x, two.x = 1, 2
    assert [_admission.attribute(o, "x") for o in (one, two, one)] == [1, 2, 1]
    _admission.attribute(two, "x", 3)
    assert (one.x, two.x) == (1, 3)
    del one.x
    with pytest.raises(AttributeError):
        _admission.attribute(one, "x")


@pytest.mark.parametrize("kind", range(7), ids=lambda i: make_classes()[i].__name__)
def test_a_class_changed_after_its_slot_was_read_is_looked_up_again(kind):
    """A property put on the class over the slot after the offset was remembered: read
    and written through it from then on, as Python does; and the slot again once the
    class gets its descriptor back."""
    for steps in (
        [("set", kind, "a", 1), ("get", kind, "a"), ("shadow", kind), ("get", kind, "a"), ("set", kind, "a", 2)],
        [("get", kind, "a"), ("shadow", kind), ("get", kind, "a"), ("unshadow", kind), ("set", kind, "a", 3), ("get", kind, "a")],
    ):
        test_getattr_and_setattr_by_name_agree_with_python.hypothesis.inner_test(steps=steps)


def test_a_class_with_its_own_getattribute_and_setattr_is_not_read_by_offset():
    """A slot is not what the name gives when the class intercepts reads or writes (a
    frozen dataclass's __setattr__ refuses them)."""
    from dataclasses import FrozenInstanceError, dataclass

    Intercepting = make_classes()[4]
    obj = Intercepting()
    _admission.attribute(obj, "a", 5)
    assert _admission.attribute(obj, "a") == "intercepted"
    assert object.__getattribute__(obj, "a") == ("wrapped", 5)

    @dataclass(frozen=True, slots=True)
    class Frozen:
        a: int

    frozen = Frozen(1)
    assert _admission.attribute(frozen, "a") == 1
    with pytest.raises(FrozenInstanceError):
        _admission.attribute(frozen, "a", 2)
    assert frozen.a == 1
