"""Label cardinality stays bounded (router/adapter/metrics.py, docs/operations.md):
at most MAX_TOPIC_LABELS topic labels, the busiest kept, the rest summed."""

from __future__ import annotations

from router.adapter.metrics import MAX_TOPIC_LABELS, OTHER_TOPICS, _bounded_topics


def _topic(i: int, records: int) -> dict:
    return {
        "topic": f"t{i}",
        "records": records,
        "unsettled": records,
        "bytes": 10 * records,
        "publishers": 1,
        "subscriptions": 2,
        "oldest_age": float(i),
        "published": 100 + i,
        "copies": 200 + i,
        "outcomes": {"accepted": i},
    }


def test_few_topics_each_keep_their_label():
    topics = [_topic(i, i) for i in range(5)]
    assert _bounded_topics(topics) == topics


def test_many_topics_keep_the_busiest_and_sum_the_rest():
    topics = [_topic(i, i) for i in range(1000)]
    shown = _bounded_topics(topics)
    assert len(shown) == MAX_TOPIC_LABELS
    kept, other = shown[:-1], shown[-1]
    assert [t["topic"] for t in kept] == [f"t{i}" for i in range(999, 999 - (MAX_TOPIC_LABELS - 1), -1)]
    rest = [t for t in topics if t["topic"] not in {k["topic"] for k in kept}]
    assert other["topic"] == OTHER_TOPICS
    for key in ("records", "unsettled", "bytes", "publishers", "subscriptions", "published", "copies"):
        assert other[key] == sum(t[key] for t in rest)
    assert other["oldest_age"] == max(t["oldest_age"] for t in rest)
    assert other["outcomes"] == {"accepted": sum(t["outcomes"]["accepted"] for t in rest)}
    # every count is still there, once: nothing lost, nothing counted twice
    assert sum(t["published"] for t in shown) == sum(t["published"] for t in topics)
