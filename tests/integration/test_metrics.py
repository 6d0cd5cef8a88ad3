"""[metrics]: /metrics, /healthz and /readyz of real router processes, read while
real AMQP clients work (issue 19, part 1 and 2; docs/operations.md)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from amqpclients import unique, wait_until
from prometheus_client.parser import text_string_to_metric_families

from router.config import ConfigError, parse_config

SECRET = {"network": {"secret": "metrics-test-secret"}}


def _metrics_port(router) -> int:
    return next(port for role, _, port in router.listeners if role == "metrics")


def get(router, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{_metrics_port(router)}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(router) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one /metrics."""
    status, text = get(router, "/metrics")
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def wait_for(condition, what: str, timeout: float = 15.0):
    return wait_until(condition, timeout, what, every=0.05)


def test_metrics_show_what_the_clients_do(router_factory, amqp):
    """A subscriber holds 5 deliveries unanswered: the router shows 5 records in
    flight on that topic, one publisher and one subscriber link, two client
    connections, and an oldest record that ages; once the subscriber accepts, the
    publisher has its 5 outcomes and the records are gone."""
    router = router_factory("A", metrics={"port": 0}, delivery={"record_linger": 0.0})
    topic = unique("metrics")
    before = scrape(router)
    sub = amqp.connect(router.url).subscriber(topic)
    sub.wait_attached()
    pub = amqp.connect(router.url).publisher(topic)
    pub.wait_attached()
    sent = [pub.send(f"m{n}") for n in range(5)]
    amqp.wait(lambda: len(sub.received) == 5, what="5 deliveries at the subscriber")
    first = scrape(router)
    assert value(first, "eorouter_topic_records_in_flight", topic=topic) == 5
    assert value(first, "eorouter_topic_unsettled", topic=topic) == 5
    assert value(first, "eorouter_records_in_flight") == 5
    assert value(first, "eorouter_links", role="publisher") == 1
    assert value(first, "eorouter_links", role="subscriber") == 1
    assert value(first, "eorouter_connections", role="client") == 2
    assert value(first, "eorouter_topic_publishers", topic=topic) == 1
    assert value(first, "eorouter_topic_subscriptions", topic=topic) == 1
    age = value(first, "eorouter_topic_oldest_in_flight_seconds", topic=topic)
    time.sleep(0.3)
    later = scrape(router)
    assert value(later, "eorouter_topic_oldest_in_flight_seconds", topic=topic) >= age + 0.25
    assert later[("eorouter_eventlog_bytes_total", ())] > before[("eorouter_eventlog_bytes_total", ())]
    loops = later[("eorouter_loop_iteration_seconds_count", ())]
    assert loops > before[("eorouter_loop_iteration_seconds_count", ())]
    assert later[("eorouter_loop_iteration_seconds_bucket", (("le", "+Inf"),))] == loops
    flushes = later[("eorouter_eventlog_flush_seconds_count", ())]
    assert flushes > 0 and later[("eorouter_eventlog_fsync_seconds_count", ())] == 0  # fsync is off by default

    for rec in list(sub.received):
        sub.accept(rec)
    amqp.wait(lambda: all(s.outcome for s in sent), what="publisher outcomes")
    assert [s.outcome for s in sent] == ["accepted"] * 5
    wait_for(lambda: value(scrape(router), "eorouter_topic_records_in_flight", topic=topic) in (0, None), "the records to go")
    gone = scrape(router)
    assert value(gone, "eorouter_records_in_flight") == 0
    assert value(gone, "eorouter_bytes_held") == 0


def test_counters_equal_what_the_clients_saw(router_factory, amqp):
    """Two subscribers on one topic, 12 messages: the topic's published, copies
    sent and outcome counters equal the clients' own counts, a rejection included
    (one subscriber rejects message 3: its publisher is told rejected)."""
    router = router_factory("A", metrics={"port": 0})
    topic = unique("counted")
    subs = [amqp.connect(router.url).subscriber(topic, name=f"s{i}") for i in range(2)]
    for sub in subs:
        sub.wait_attached()
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"m{n}") for n in range(12)]
    for sub in subs:
        amqp.wait(lambda sub=sub: len(sub.received) == 12, what="12 deliveries")
    for i, sub in enumerate(subs):
        for n, rec in enumerate(list(sub.received)):
            if i == 1 and n == 3:
                sub.reject(rec)
            else:
                sub.accept(rec)
    amqp.wait(lambda: all(s.outcome for s in sent), what="publisher outcomes")
    told = {o: [s.outcome for s in sent].count(o) for o in {s.outcome for s in sent}}
    assert told == {"accepted": 11, "rejected": 1}
    samples = scrape(router)
    assert value(samples, "eorouter_topic_published_total", topic=topic) == 12
    assert value(samples, "eorouter_topic_copies_sent_total", topic=topic) == sum(len(sub.received) for sub in subs) == 24
    assert value(samples, "eorouter_topic_outcomes_total", topic=topic, outcome="accepted") == 11
    assert value(samples, "eorouter_topic_outcomes_total", topic=topic, outcome="rejected") == 1
    assert value(samples, "eorouter_topic_outcomes_total", topic=topic, outcome="released") is None


def test_health_and_readiness_of_a_lone_router(router_factory):
    router = router_factory("A", metrics={"port": 0})
    status, body = get(router, "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = get(router, "/readyz")
    assert status == 200
    assert json.loads(body) == {"status": "ok", "checks": {"eventlog": None, "listeners": None, "routes": None}}
    assert value(scrape(router), "eorouter_ready") == 1
    status, body = get(router, "/nowhere")
    assert status == 404 and "/metrics" in json.loads(body)["pages"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_network_member_is_ready_once_its_routes_converge(router_factory):
    """B dials A, which is not there yet: /readyz is 503 and names the connector.
    Once A is up and the two have exchanged link state, B is ready and shows A up;
    when A dies, B stays ready (its clients are still served) and shows A down."""
    port = _free_port()
    b = router_factory(
        "B", metrics={"port": 0}, **SECRET, connector=[{"host": "127.0.0.1", "port": port, "role": "inter-router"}]
    )
    status, body = get(b, "/readyz")
    assert status == 503, body
    checks = json.loads(body)["checks"]
    assert checks["listeners"] is None and checks["eventlog"] is None
    assert "connector(s) not up yet" in checks["routes"] and str(port) in checks["routes"]
    assert value(scrape(b), "eorouter_ready") == 0

    a = router_factory(
        "A",
        metrics={"port": 0},
        **SECRET,
        listener=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": port, "role": "inter-router"}],
    )
    wait_for(lambda: get(b, "/readyz")[0] == 200, "B ready", timeout=30)
    samples = scrape(b)
    assert value(samples, "eorouter_peer_up", router="A") == 1
    assert value(samples, "eorouter_routes") == 1
    assert value(samples, "eorouter_connections", role="inter-router") >= 1
    assert value(scrape(a), "eorouter_peer_up", router="B") == 1
    assert value(samples, "eorouter_peer_connects_total", router="A") == 1

    a.kill()
    wait_for(lambda: value(scrape(b), "eorouter_peer_up", router="A") == 0, "B to see A down", timeout=30)
    assert get(b, "/readyz")[0] == 200
    assert get(b, "/healthz")[0] == 200
    down = scrape(b)
    assert value(down, "eorouter_peer_losses_total", router="A") == 1
    assert value(down, "eorouter_peer_connects_total", router="A") == 1


def test_resumed_links_are_counted(router_factory, tmp_path):
    """A publisher and a subscriber (router.client, resumable) lose their
    connections and resume: the router counts each side's first attach, its
    resumed attach and the resumption of its unsettled state."""
    from router.client import ResumablePublisher, ResumableSubscriber

    router = router_factory("A", metrics={"port": 0})
    topic = unique("resumed")
    got: list = []
    sub = ResumableSubscriber(
        [router.url],
        topic,
        container_id="sub-m",
        link_name="sub-m-link",
        state_path=tmp_path / "sub.state",
        on_message=got.append,
    ).start()
    pub = ResumablePublisher(
        [router.url], topic, container_id="pub-m", link_name="pub-m-link", state_path=tmp_path / "pub.state"
    ).start()
    try:
        assert sub.wait_attached(10) and pub.wait_attached(10)
        assert pub.send_async("one").result(timeout=20).state == "accepted"
        pub.kill_connection()
        sub.kill_connection()
        assert pub.wait_attached(20, attaches=2) and sub.wait_attached(20, attaches=2)
        assert pub.send_async("two").result(timeout=20).state == "accepted"
        samples = scrape(router)
        for role in ("publisher", "subscriber"):
            assert value(samples, "eorouter_link_attaches_total", role=role, resumed="false") == 1
            assert value(samples, "eorouter_link_attaches_total", role=role, resumed="true") == 1
            resumed = sum(
                v
                for (name, labels), v in samples.items()
                if name == "eorouter_link_resumptions_total" and ("role", role) in labels
            )
            assert resumed == 1, samples
        assert [m.body for m in got] == ["one", "two"]
    finally:
        pub.close()
        sub.close()


@pytest.mark.parametrize(
    "text, message",
    [
        ('[router]\nid = "A"\n[metrics]\nhost = "127.0.0.1"\n', "metrics.port"),
        ('[router]\nid = "A"\n[metrics]\nport = 70000\n', "a port number from 0 to 65535"),
        ('[router]\nid = "A"\n[metrics]\nport = 9100\npath = "/m"\n', "unknown key"),
    ],
)
def test_a_bad_metrics_table_is_a_clear_config_error(text, message):
    import tomllib

    with pytest.raises(ConfigError) as err:
        parse_config(tomllib.loads(text), "r.toml")
    assert message in str(err.value)


def test_no_metrics_table_no_listener():
    import tomllib

    assert parse_config(tomllib.loads('[router]\nid = "A"\n'), "r.toml").metrics is None
    settings = parse_config(tomllib.loads('[router]\nid = "A"\n[metrics]\nport = 9100\n'), "r.toml").metrics
    assert settings is not None and (settings.host, settings.port) == ("127.0.0.1", 9100)
