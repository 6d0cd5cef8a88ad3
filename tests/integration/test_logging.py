"""[logging] (issue 19, part 6): levels per logger from the config, JSON lines,
and the slow-subscriber warning, on real router processes."""

from __future__ import annotations

import json
import time

from amqpclients import unique


def _lines(router) -> list[str]:
    return router.stderr_since_start().splitlines()


def test_json_lines_and_per_logger_levels(router_factory, amqp):
    """format = "json": every log line is one JSON object (ts, level, logger,
    message); eorouter.server at WARNING hides its connection lines while the
    other loggers still log at INFO. Nothing is logged per message at INFO."""
    router = router_factory("A", logging={"format": "json", "modules": {"eorouter.server": "WARNING"}})
    topic = unique("logs")
    sub = amqp.connect(router.url).subscriber(topic, auto_accept=True)
    sub.wait_attached()
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"m{n}") for n in range(60)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="60 outcomes")
    records = []
    for line in _lines(router):
        if line.startswith("eorouter: ") or line.startswith("---"):
            continue  # the ready line is plain text by contract (the launcher reads it)
        records.append(json.loads(line))
    assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    assert not [r for r in records if r["logger"] == "eorouter.server" and r["level"] == "INFO"]
    assert [r for r in records if r["logger"] == "eorouter" and r["level"] == "INFO"]  # the others still log
    assert len(records) < 20, records  # a few lines at start, none per message


def test_the_log_level_flag_wins_over_the_config(router_factory):
    router = router_factory("A", start=False, logging={"level": "DEBUG"})
    router.spawn(args=["run", "--config", str(router.write_config()), "--log-level", "warning"])
    router.wait_ready()
    time.sleep(0.2)
    assert " INFO " not in router.stderr_since_start() and " DEBUG " not in router.stderr_since_start()


def test_a_slow_subscriber_is_named(router_factory, amqp):
    """A subscriber that does not answer for longer than slow_subscriber_age is
    named, with its topic and how many records wait for it; one that answers
    is not."""
    router = router_factory("A", logging={"slow_subscriber_age": 0.5, "format": "json"})
    topic = unique("slow")
    quick = amqp.connect(router.url, container_id="quick").subscriber(topic, name="q", auto_accept=True)
    slow = amqp.connect(router.url, container_id="slowpoke").subscriber(topic, name="s")
    quick.wait_attached()
    slow.wait_attached()
    pub = amqp.connect(router.url).publisher(topic)
    for n in range(3):
        pub.send(f"m{n}")
    amqp.wait(lambda: len(slow.received) == 3, what="3 deliveries")

    def warnings():
        return [
            json.loads(line) for line in _lines(router) if line.startswith("{") and json.loads(line)["logger"] == "eorouter.slow"
        ]

    amqp.wait(lambda: warnings(), what="a slow-subscriber warning", timeout=10)
    first = warnings()[0]
    assert first["level"] == "WARNING" and first["subscriber"] == "slowpoke/s" and first["topic"] == topic
    assert first["records"] == 3 and first["oldest_s"] >= 0.5
    assert not [w for w in warnings() if w["subscriber"] == "quick/q"]
