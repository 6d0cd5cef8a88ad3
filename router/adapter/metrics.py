"""What an operator reads over HTTP: Prometheus metrics and health checks.

Served when the config has a ``[metrics]`` table (docs/operations.md), on its own
listener: ``/metrics`` (Prometheus text, through ``prometheus_client``),
``/healthz`` (the event loop answers) and ``/readyz`` (listeners bound, event log
writable, and for a network member the routes converged), with JSON bodies.

The HTTP server runs in its own thread (``prometheus_client``'s threading WSGI
server), but it never reads the router's state there: the state belongs to the
event loop, which changes it between any two bytes another thread could read.
Every scrape hands one function to the loop (``Server.call_in_loop``), which takes
a snapshot between two iterations (router/adapter/snapshots.py); a loop that does not get to it in time is what
``/healthz`` reports. The loop itself only counts (router/buckets.py): nothing per
message is added for metrics.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.registry import Collector, CollectorRegistry

from router.adapter.console import PAGE, overview
from router.adapter.snapshots import readiness, snapshot

log = logging.getLogger("eorouter.metrics")

#: Topics with a label of their own, the busiest first (by records in flight, then
#: links); the rest are summed under topic="(other)". Bounded label cardinality.
MAX_TOPIC_LABELS = 100
OTHER_TOPICS = "(other)"
#: How long a scrape or a health check waits for the event loop.
LOOP_ANSWER_TIMEOUT = 2.0


# ---------------------------------------------------------------------------
# Prometheus: on the HTTP thread, from a snapshot
# ---------------------------------------------------------------------------


class RouterCollector(Collector):
    """The router's metrics, from one snapshot per scrape."""

    def __init__(self, take: Callable[[], dict]) -> None:
        self.take = take

    def collect(self) -> Iterable[Metric]:
        s = self.take()
        yield from _links_and_records(s)
        yield from _per_topic(s)
        yield from _happenings(s["happenings"])
        yield from _network_and_memory(s)
        yield from _eventlog_and_loop(s)
        yield GaugeMetricFamily(
            "eorouter_ready", "1 when every readiness check passes (/readyz)", value=0 if any(s["ready"].values()) else 1
        )


def _links_and_records(s: dict) -> Iterable[Metric]:
    """Connections, links, and what the records hold, router-wide."""
    g = GaugeMetricFamily
    yield _labelled(g("eorouter_connections", "Open AMQP connections, by role", labels=["role"]), s["connections"].items())
    yield _labelled(
        g(
            "eorouter_links",
            "Links, by role (durable-detached: a durable subscription kept while its subscriber is away)",
            labels=["role"],
        ),
        s["links"].items(),
    )
    yield g("eorouter_records_in_flight", "Delivery records held (unsettled or lingering)", value=s["records"])
    yield g("eorouter_bytes_held", "Message bytes the records hold", value=s["bytes_held"])


def _per_topic(s: dict) -> Iterable[Metric]:
    """The families labelled by topic (the topics bounded: _bounded_topics)."""
    g = GaugeMetricFamily
    topics = _bounded_topics(s["topics"])
    for name, help_text, key in (
        ("eorouter_topic_records_in_flight", "Delivery records held, per topic", "records"),
        ("eorouter_topic_unsettled", "Records the publisher has not settled, per topic", "unsettled"),
        ("eorouter_topic_bytes_held", "Message bytes held, per topic", "bytes"),
        ("eorouter_topic_publishers", "Attached publisher links, per topic", "publishers"),
        ("eorouter_topic_subscriptions", "Subscriptions (attached or durable), per topic", "subscriptions"),
        (
            "eorouter_topic_oldest_in_flight_seconds",
            "Age of the topic's oldest record: how long the network has been finishing it",
            "oldest_age",
        ),
    ):
        yield _labelled(g(name, help_text, labels=["topic"]), ((t["topic"], t[key]) for t in topics))
    c = CounterMetricFamily
    yield _labelled(
        c("eorouter_topic_published", "Messages its publishers here sent, per topic", labels=["topic"]),
        ((t["topic"], t["published"]) for t in topics),
    )
    yield _labelled(
        c("eorouter_topic_copies_sent", "Copies sent to subscribers here, per topic", labels=["topic"]),
        ((t["topic"], t["copies"]) for t in topics),
    )
    told = c("eorouter_topic_outcomes", "Outcomes publishers here were told, per topic and outcome", labels=["topic", "outcome"])
    for t in topics:
        for outcome, n in sorted(t["outcomes"].items()):
            told.add_metric([t["topic"], outcome], n)
    yield told


def _network_and_memory(s: dict) -> Iterable[Metric]:
    """The router network as this router sees it, and what it remembers for failover."""
    g = GaugeMetricFamily
    yield _labelled(
        g("eorouter_peer_up", "1 while a connection to that router is up", labels=["router"]),
        ((r, 1 if up else 0) for r, up in s["peers"].items()),
    )
    yield g("eorouter_routes", "Routers reachable from here (the routing table's size)", value=s["routes"])
    yield g("eorouter_routers_known", "Routers in the link-state database, this one included", value=s["routers_known"])
    yield g("eorouter_settled_tags", "Settled tags remembered for resumed publishers' resends", value=s["settled_tags"])
    yield g("eorouter_placeholders", "Placeholders held for resuming subscribers", value=s["placeholders"])


def _eventlog_and_loop(s: dict) -> Iterable[Metric]:
    """The event log's writes and the event loop's iterations."""
    ev = s["eventlog"]
    yield CounterMetricFamily("eorouter_eventlog_bytes", "Event log bytes written", value=ev["bytes"])
    yield CounterMetricFamily("eorouter_eventlog_rotations", "Event log files rotated", value=ev["rotations"])
    for name, help_text, h in (
        ("eorouter_eventlog_flush_seconds", "One flush of the event log (one write per loop iteration)", ev["flush"]),
        ("eorouter_eventlog_fsync_seconds", "One fsync of the event log ([eventlog] fsync = true)", ev["fsync"]),
        ("eorouter_loop_iteration_seconds", "One iteration of the event loop, its wait excluded", s["loop"]),
    ):
        yield HistogramMetricFamily(name, help_text, buckets=h["buckets"], sum_value=h["sum"])


def _happenings(counts: dict[tuple, int]) -> Iterable[Metric]:
    """The counted events (Engine.happened) as counters."""
    c = CounterMetricFamily
    families = {
        "link-attached": c(
            "eorouter_link_attaches",
            "Links attached here, by role and whether they resumed "
            "(resumed: a client failing over, or reconnecting, with its unsettled state)",
            labels=["role", "resumed"],
        ),
        "resume-requested": c(
            "eorouter_link_resumptions",
            "Resumed links' unsettled state taken over here, by role and result (incomplete: some of it was not known here)",
            labels=["role", "result"],
        ),
        "failover-in": c(
            "eorouter_failovers_in",
            "Subscribers that came here from another router (attached or "
            "retained there: a client failing over), by role and the router they left",
            labels=["role", "from_router"],
        ),
        "announcement": c(
            "eorouter_peer_announcements",
            "Subscriber announcements learnt (each once, however many neighbours flood it), "
            "by the router whose subscriber it announces and what: attached, detached",
            labels=["router", "kind"],
        ),
        "peer-connected": c(
            "eorouter_peer_connects", "Connections to that router that came up (reconnects: all but the first)", labels=["router"]
        ),
        "peer-lost": c("eorouter_peer_losses", "Connections to that router lost", labels=["router"]),
        "peer-restarted": c("eorouter_peer_restarts", "Times that router came back with a new epoch", labels=["router"]),
        "announce-timeout": c("eorouter_announce_timeouts", "Subscriber announcements other routers did not confirm in time"),
        "origin-taken-over": c(
            "eorouter_origins_taken_over", "Deliveries whose origin moved here, or from here, after a router failed"
        ),
        "subscription-expired": c(
            "eorouter_subscriptions_expired", "Durable subscriptions expired while their subscriber was away"
        ),
        "login-failed": c(
            "eorouter_login_failures",
            "Client logins refused for wrong credentials (each answered only after [sasl] login_failure_delay), by mechanism",
            labels=["mechanism"],
        ),
        "connection-refused": c(
            "eorouter_connections_refused",
            "Client connections the [policy] refused at open, by why: unauthorized (no group admits the user), "
            "limit (its connection limit)",
            labels=["why"],
        ),
    }
    for key, n in sorted(counts.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        kind, *labels = key
        family = families[kind]
        if kind == "link-attached":
            labels = [str(labels[0]), "true" if labels[1] else "false"]
        elif kind == "resume-requested":
            labels = [str(labels[0]), "incomplete" if labels[1] else "complete"]
        family.add_metric([str(x) for x in labels], n)
    yield from families.values()


def _labelled(family: Any, pairs: Iterable[tuple[str, float]]) -> Any:
    for label, value in pairs:
        family.add_metric([str(label)], value)
    return family


def _bounded_topics(topics: list[dict]) -> list[dict]:
    if len(topics) <= MAX_TOPIC_LABELS:
        return topics
    ranked = sorted(topics, key=lambda t: (-t["records"], -(t["publishers"] + t["subscriptions"]), t["topic"]))
    kept, rest = ranked[: MAX_TOPIC_LABELS - 1], ranked[MAX_TOPIC_LABELS - 1 :]
    other: dict[str, Any] = {"topic": OTHER_TOPICS, "oldest_age": max(t["oldest_age"] for t in rest)}
    for key in ("records", "unsettled", "bytes", "publishers", "subscriptions", "published", "copies"):
        other[key] = sum(t[key] for t in rest)
    outcomes: dict[str, int] = {}
    for t in rest:
        for outcome, n in t["outcomes"].items():
            outcomes[outcome] = outcomes.get(outcome, 0) + n
    other["outcomes"] = outcomes
    return [*kept, other]


# ---------------------------------------------------------------------------
# The HTTP listener
# ---------------------------------------------------------------------------


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass  # a scrape a second is not news; errors still reach the router's log


class MetricsServer:
    """The HTTP listener of one router (started by router/cli.py after bind())."""

    def __init__(self, server: Any, host: str, port: int) -> None:
        self.server = server
        server.wakeup_socket()  # call_in_loop wakes the loop through it
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(self._snapshot))
        self._metrics_app = make_wsgi_app(self.registry)
        self.httpd = make_server(host, port, self._app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self.host, self.port = host, self.httpd.server_port
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="eorouter-metrics", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("console, metrics and health on http://%s:%d/ (/, /metrics, /healthz, /readyz)", self.host, self.port)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _snapshot(self) -> dict:
        return self.server.call_in_loop(lambda: snapshot(self.server), LOOP_ANSWER_TIMEOUT)

    def _app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return self._health(start_response)
        if path == "/readyz":
            return self._ready(start_response)
        if path == "/":
            data = PAGE.encode()
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(data)))])
            return [data]
        if path == "/api/overview":
            try:
                return _json(start_response, 200, self.server.call_in_loop(lambda: overview(self.server), LOOP_ANSWER_TIMEOUT))
            except TimeoutError:
                return _json(start_response, 503, {"status": "failing", "checks": {"event-loop": self._no_answer()}})
        if path == "/metrics":
            try:
                return self._metrics_app(environ, start_response)
            except TimeoutError:
                return _json(start_response, 503, {"status": "failing", "checks": {"event-loop": self._no_answer()}})
        return _json(
            start_response,
            404,
            {"error": f"no such page: {path}", "pages": ["/", "/api/overview", "/metrics", "/healthz", "/readyz"]},
        )

    def _health(self, start_response: Callable) -> Iterable[bytes]:
        started = time.monotonic()
        try:
            self.server.call_in_loop(lambda: None, LOOP_ANSWER_TIMEOUT)
        except TimeoutError:
            return _json(start_response, 503, {"status": "failing", "checks": {"event-loop": self._no_answer()}})
        return _json(
            start_response,
            200,
            {"status": "ok", "checks": {"event-loop": None}, "answered_in_s": round(time.monotonic() - started, 6)},
        )

    def _ready(self, start_response: Callable) -> Iterable[bytes]:
        try:
            checks = self.server.call_in_loop(lambda: readiness(self.server), LOOP_ANSWER_TIMEOUT)
        except TimeoutError:
            checks = {"event-loop": self._no_answer()}
        failing = {k: v for k, v in checks.items() if v}
        return _json(start_response, 503 if failing else 200, {"status": "failing" if failing else "ok", "checks": checks})

    @staticmethod
    def _no_answer() -> str:
        return f"the event loop did not answer within {LOOP_ANSWER_TIMEOUT:g} s"


def _json(start_response: Callable, status: int, body: dict) -> list[bytes]:
    reasons = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}
    data = json.dumps(body, sort_keys=True).encode() + b"\n"
    start_response(f"{status} {reasons[status]}", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
