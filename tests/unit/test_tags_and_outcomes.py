"""Properties of the tag codec and of the outcome rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core import outcomes, tags
from router.core.errors import ProtocolError
from router.core.outcomes import Outcome

names = st.text(min_size=0, max_size=40)
pub_tags = st.binary(min_size=0, max_size=32)
streams = st.tuples(names, names, names)


@given(streams, pub_tags)
def test_tag_fits_amqp_and_is_deterministic(stream, pub_tag):
    sid = tags.stream_id(*stream)
    tag = tags.outgoing_tag(sid, pub_tag)
    assert len(tag) <= tags.MAX_TAG_SIZE
    assert tag == tags.outgoing_tag(tags.stream_id(*stream), bytes(pub_tag))
    assert tags.stream_of(tag) == sid


@given(streams, streams, pub_tags, pub_tags)
def test_distinct_inputs_give_distinct_tags(a, b, tag_a, tag_b):
    if (a, tag_a) == (b, tag_b):
        return
    assert tags.outgoing_tag(tags.stream_id(*a), tag_a) != tags.outgoing_tag(tags.stream_id(*b), tag_b)


@given(names, names, st.lists(names, min_size=2, max_size=5, unique=True), pub_tags)
def test_incarnations_separate_the_same_link_name(container, link, incarnations, pub_tag):
    made = {tags.outgoing_tag(tags.stream_id(container, link, inc), pub_tag) for inc in incarnations}
    assert len(made) == len(incarnations)


def test_field_boundaries_cannot_be_shifted():
    # ("ab", "c") and ("a", "bc") must not hash alike: every field is length-prefixed.
    assert tags.stream_id("ab", "c", "1") != tags.stream_id("a", "bc", "1")


@given(st.binary(max_size=15))
def test_short_publisher_tags_are_carried_inline(pub_tag):
    tag = tags.outgoing_tag(tags.stream_id("c", "l", "i"), pub_tag)
    assert tags.inline_publisher_tag(tag) == pub_tag


@given(st.binary(min_size=16, max_size=32))
def test_long_publisher_tags_are_hashed(pub_tag):
    tag = tags.outgoing_tag(tags.stream_id("c", "l", "i"), pub_tag)
    assert len(tag) == 32 and tags.inline_publisher_tag(tag) is None


def test_over_long_publisher_tag_is_a_protocol_error():
    with pytest.raises(ProtocolError) as err:
        tags.outgoing_tag(tags.stream_id("c", "l", "i"), b"x" * 33)
    assert err.value.condition == "amqp:invalid-field"


terminal = st.sampled_from(sorted(outcomes.TERMINAL))
outcome_values = st.builds(Outcome, terminal, st.none(), st.none(), st.booleans(), st.booleans())


@given(st.lists(outcome_values, min_size=1, max_size=8))
def test_aggregate_accepts_only_when_all_accepted(values):
    result = outcomes.aggregate(values)
    codes = {v.code for v in values}
    if codes == {outcomes.ACCEPTED}:
        assert result.code == outcomes.ACCEPTED
    else:
        assert result.code != outcomes.ACCEPTED
        severity = [outcomes.ACCEPTED, outcomes.RELEASED, outcomes.MODIFIED, outcomes.REJECTED]
        assert result.code == max(codes, key=severity.index)
    if result.code == outcomes.MODIFIED:
        modified = [v for v in values if v.code == outcomes.MODIFIED]
        assert result.delivery_failed == any(v.delivery_failed for v in modified)
        assert result.undeliverable_here == any(v.undeliverable_here for v in modified)


@given(st.lists(outcome_values, min_size=1, max_size=8), st.randoms())
def test_aggregate_ignores_order(values, rnd):
    shuffled = list(values)
    rnd.shuffle(shuffled)
    assert outcomes.aggregate(values).code == outcomes.aggregate(shuffled).code


def test_aggregate_of_nothing_is_the_callers_decision():
    with pytest.raises(ValueError):
        outcomes.aggregate([])
