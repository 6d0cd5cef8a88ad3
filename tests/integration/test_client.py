"""The resumable client (router.client) against real routers and against a stub
server that records the wire.

Real routers: publish/subscribe with ledgers, connections dropped mid-stream,
client processes SIGKILLed mid-stream and restarted from their state files, a
router killed under a client. Stub server (tests/integration/stubrouter.py): the
attach properties of docs/resumption.md byte for byte, a full in-flight window of
500 resumed in one attach and resent in order, a cut list marked incomplete, and
the failover-server-list followed to a router the client was never told about.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from amqpclients import wait_until
from proton import Message, Terminus, symbol
from stubrouter import StubServer

from eorouter_tools.launcher import PACKAGE_PARENT, read_event_log
from eorouter_tools.topology import RouterNetwork, parse_topology
from router.client import ResumablePublisher, ResumableSubscriber, read_ledger
from router.client.protocol import INCARNATION, INCOMPLETE, RESUME, UNSETTLED
from router.core.tags import outgoing_tag, stream_id

pytestmark = pytest.mark.timeout(120)

HEARTBEAT = 1.0


_wait = wait_until  # (amqpclients)


class Clients:
    """Builds clients in a test's directory and closes them at the end."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.all = []

    def publisher(self, urls, topic, name, **kw) -> ResumablePublisher:
        kw.setdefault("heartbeat", HEARTBEAT)
        pub = ResumablePublisher(
            urls,
            topic,
            container_id=name,
            link_name=f"{name}-link",
            state_path=self.dir / f"{name}.state",
            ledger_path=self.dir / f"{name}.jsonl",
            **kw,
        )
        self.all.append(pub)
        return pub.start()

    def subscriber(self, urls, topic, name, got: list | None = None, **kw) -> ResumableSubscriber:
        kw.setdefault("heartbeat", HEARTBEAT)
        if got is not None:
            kw["on_message"] = lambda m: got.append(m)
        sub = ResumableSubscriber(
            urls,
            topic,
            container_id=name,
            link_name=f"{name}-link",
            state_path=self.dir / f"{name}.state",
            ledger_path=self.dir / f"{name}.jsonl",
            **kw,
        )
        self.all.append(sub)
        return sub.start()

    def ledger(self, name) -> list[dict]:
        path = self.dir / f"{name}.jsonl"
        return read_ledger(path) if path.exists() else []

    def close(self):
        for client in reversed(self.all):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - cleanup
                pass


@pytest.fixture
def clients(tmp_path):
    c = Clients(tmp_path / "clients")
    yield c
    c.close()


# --------------------------------------------------------------------------- ledger checks


def delivered_seqs(ledger: list[dict]) -> list[int]:
    return [line["seq"] for line in ledger if line["event"] == "delivered"]


def final_outcomes(ledger: list[dict]) -> dict[int, str]:
    """seq -> the last outcome the publisher's ledger holds for it."""
    out = {}
    for line in ledger:
        if line["event"] == "outcome":
            out[line["seq"]] = line["outcome"]
    return out


def assert_exactly_once(pub_ledger: list[dict], sub_ledgers: dict[str, list[dict]], n: int) -> None:
    outcomes = final_outcomes(pub_ledger)
    assert sorted(outcomes) == list(range(1, n + 1)), f"outcomes missing for {set(range(1, n + 1)) - set(outcomes)}"
    bad = {seq: o for seq, o in outcomes.items() if o != "accepted"}
    assert not bad, f"not accepted: {bad}"
    for name, ledger in sub_ledgers.items():
        seqs = delivered_seqs(ledger)
        dups = sorted({s for s in seqs if seqs.count(s) > 1})
        assert not dups, f"{name}: handed to the application more than once: {dups[:20]}"
        missing = sorted(set(range(1, n + 1)) - set(seqs))
        assert not missing, f"{name}: never handed to the application: {missing[:20]} ({len(missing)})"
        assert seqs == sorted(seqs), f"{name}: out of publisher order"


# --------------------------------------------------------------------------- real router


def test_publish_subscribe_exactly_once_with_ledgers(router_factory, clients):
    router = router_factory("A")
    got1, got2 = [], []
    s1 = clients.subscriber([router.url], "orders", "sub-1", got1)
    s2 = clients.subscriber([router.url], "orders", "sub-2", got2)
    assert s1.wait_attached(10) and s2.wait_attached(10)
    pub = clients.publisher([router.url], "orders", "pub-1")
    assert pub.wait_attached(10)
    first = pub.send({"n": 0}, timeout=10)
    assert first.accepted and first.seq == 1 and first.tag == b"1"
    outcomes = pub.send_many([f"m{i}" for i in range(2, 301)], timeout=30)
    assert {o.state for o in outcomes} == {"accepted"}
    assert [o.seq for o in outcomes] == list(range(2, 301))
    _wait(lambda: not s1.state.unsettled and not s2.state.unsettled, what="router settles every delivery")
    assert [m.seq for m in got1] == list(range(1, 301)) and [m.seq for m in got2] == list(range(1, 301))
    assert got1[0].body == {"n": 0}
    pub.close(), s1.close(), s2.close()

    pub_ledger = clients.ledger("pub-1")
    assert_exactly_once(pub_ledger, {"sub-1": clients.ledger("sub-1"), "sub-2": clients.ledger("sub-2")}, 300)
    # the ledger format (docs/ledger.md)
    fields = [
        "ts",
        "client",
        "link",
        "role",
        "event",
        "topic",
        "delivery",
        "pub_tag",
        "seq",
        "outcome",
        "router",
        "incarnation",
        "digest",
        "message_id",
    ]
    sent = [line for line in pub_ledger if line["event"] == "sent"]
    assert len(sent) == 300 and list(sent[0])[: len(fields)] == fields
    assert sent[0]["client"] == "pub-1" and sent[0]["link"] == "pub-1-link" and sent[0]["role"] == "publisher"
    assert sent[0]["pub_tag"] == b"1".hex() and sent[0]["router"] == router.url and sent[0]["topic"] == "orders"
    assert sent[0]["incarnation"] == pub.incarnation
    stream = stream_id("pub-1", "pub-1-link", pub.incarnation)
    delivered = [line for line in clients.ledger("sub-1") if line["event"] == "delivered"]
    for line in delivered:
        pub_tag = bytes.fromhex(line["pub_tag"])
        assert line["delivery"] == outgoing_tag(stream, pub_tag).hex()
        assert pub_tag == str(line["seq"]).encode()
        assert line["outcome"] == "accepted" and line["role"] == "subscriber"
    # the same message has the same digest on both sides
    assert sent[5]["digest"] == delivered[5]["digest"]
    # the router logged the same delivery ids
    received = {e["delivery"] for e in read_event_log(router.data_dir) if e["event"] == "received"}
    assert {line["delivery"] for line in delivered} <= received


def test_connection_drops_mid_stream_are_invisible_to_the_application(router_factory, clients):
    """Both clients lose their connection (abruptly, several times) while 600
    messages are in flight; they resume on the same router: every message accepted,
    each handed to the subscriber once, in order."""
    router = router_factory("A")
    got = []
    sub = clients.subscriber([router.url], "drops", "sub-d", got)
    assert sub.wait_attached(10)
    pub = clients.publisher([router.url], "drops", "pub-d")
    assert pub.wait_attached(10)
    futures = []
    kills = {"pub": 0, "sub": 0}
    for i in range(600):
        futures.append(pub.send_async(f"m{i}"))
        # Each kill waits for the previous one's resumption, so that it drops an
        # attached link (a kill during a reconnect would only cut the reconnect).
        if i in (150, 400):
            assert pub.wait_attached(20, attaches=kills["pub"] + 1)
            kills["pub"] += 1
            pub.kill_connection()
        if i in (250, 500):
            assert sub.wait_attached(20, attaches=kills["sub"] + 1)
            kills["sub"] += 1
            sub.kill_connection()
        if i % 50 == 0:
            time.sleep(0.02)
    results = [f.result(timeout=60) for f in futures]
    assert {r.state for r in results} == {"accepted"}
    _wait(lambda: not sub.state.unsettled, what="router settles every delivery")
    assert pub.wait_attached(20, attaches=3) and sub.wait_attached(20, attaches=3)
    pub.close(), sub.close()
    assert_exactly_once(clients.ledger("pub-d"), {"sub-d": clients.ledger("sub-d")}, 600)
    assert [m.seq for m in got] == list(range(1, 601))
    resumed = [line for line in clients.ledger("pub-d") if line["event"] == "resumed"]
    assert len(resumed) == pub.attaches - 1
    # the router saw the publisher come back under the same incarnation
    attached = [e for e in read_event_log(router.data_dir) if e["event"] == "link-attached" and e["container"] == "pub-d"]
    assert [e["resumed"] for e in attached] == [False] + [True] * (len(attached) - 1)
    assert {e["incarnation"] for e in attached} == {pub.incarnation}
    subs = [e for e in read_event_log(router.data_dir) if e["event"] == "link-attached" and e["container"] == "sub-d"]
    assert subs[0]["durable"] == 2 and all(e["resumed"] for e in subs[1:])


def _client_cmd(kind: str, urls, topic: str, name: str, directory: Path, *extra) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "router.client",
        kind,
        "--topic",
        topic,
        "--container-id",
        name,
        "--link",
        f"{name}-link",
        "--state",
        str(directory / f"{name}.state"),
        "--ledger",
        str(directory / f"{name}.jsonl"),
        "--heartbeat",
        str(HEARTBEAT),
        "--timeout",
        "60",
    ]
    for url in urls:
        cmd += ["--url", url]
    return cmd + [str(x) for x in extra]


def _spawn(cmd, directory: Path, tag: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_PARENT)}
    return subprocess.Popen(
        cmd, cwd=directory, env=env, stdout=open(directory / f"{tag}.out", "w"), stderr=open(directory / f"{tag}.err", "w")
    )


def _finish(proc: subprocess.Popen, directory: Path, tag: str, timeout: float = 60) -> dict:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{tag} did not finish: {(directory / f'{tag}.err').read_text()[-3000:]}")
    out = (directory / f"{tag}.out").read_text().strip().splitlines()
    assert code == 0, f"{tag} exited {code}: {out[-3:]} {(directory / f'{tag}.err').read_text()[-3000:]}"
    return json.loads(out[-1])


def test_publisher_process_killed_mid_stream_resumes_from_its_state_file(router_factory, clients):
    router = router_factory("A")
    got = []
    sub = clients.subscriber([router.url], "restart-p", "sub-r", got)
    assert sub.wait_attached(10)
    d = clients.dir
    cmd = _client_cmd("publish", [router.url], "restart-p", "pub-proc", d, "--count", 400, "--rate", 400, "--window", 50)
    proc = _spawn(cmd, d, "pub1")
    _wait(lambda: len(final_outcomes(clients.ledger("pub-proc"))) >= 100, what="100 outcomes before the kill")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = clients.ledger("pub-proc")
    assert len(final_outcomes(before)) < 400, "the kill came too late to test anything"
    summary = _finish(_spawn(cmd, d, "pub2"), d, "pub2")
    assert summary["complete"] and summary["unsettled"] == 0
    _wait(lambda: len(got) >= 400 and not sub.state.unsettled, what="subscriber gets all 400")
    sub.close()
    assert_exactly_once(clients.ledger("pub-proc"), {"sub-r": clients.ledger("sub-r")}, 400)
    # the second run resumed (same incarnation) and resent what the first left unsettled
    resumed = [line for line in clients.ledger("pub-proc") if line["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["incarnation"] == summary["incarnation"]
    attached = [e for e in read_event_log(router.data_dir) if e["event"] == "link-attached" and e["container"] == "pub-proc"]
    assert [e["resumed"] for e in attached] == [False, True]
    assert attached[0]["incarnation"] == attached[1]["incarnation"] == summary["incarnation"]


def test_subscriber_process_killed_mid_stream_resumes_from_its_state_file(router_factory, clients):
    router = router_factory("A")
    d = clients.dir
    cmd = _client_cmd("subscribe", [router.url], "restart-s", "sub-proc", d, "--expect", 300, "--delay", 0.004, "--prefetch", 20)
    proc = _spawn(cmd, d, "sub1")
    _wait(lambda: (d / "sub1.out").exists() and "ready" in (d / "sub1.out").read_text(), what="subscriber ready")
    pub = clients.publisher([router.url], "restart-s", "pub-s")
    assert pub.wait_attached(10)
    futures = [pub.send_async(f"m{i}") for i in range(300)]
    _wait(lambda: len(delivered_seqs(clients.ledger("sub-proc"))) >= 80, what="80 delivered before the kill")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(delivered_seqs(clients.ledger("sub-proc"))) < 300, "the kill came too late to test anything"
    summary = _finish(_spawn(cmd, d, "sub2"), d, "sub2")
    assert summary["complete"], summary
    results = [f.result(timeout=30) for f in futures]
    assert {r.state for r in results} == {"accepted"}
    pub.close()
    assert_exactly_once(clients.ledger("pub-s"), {"sub-proc": clients.ledger("sub-proc")}, 300)
    attached = [e for e in read_event_log(router.data_dir) if e["event"] == "link-attached" and e["container"] == "sub-proc"]
    assert [e["resumed"] for e in attached] == [False, True]


def test_client_stays_with_its_state_across_a_clean_restart(router_factory, clients):
    """close() and a new client object on the same state file: same incarnation, tag
    counter and seq go on; the subscriber's durable subscription kept what was sent
    while it was away."""
    router = router_factory("A")
    got = []
    sub = clients.subscriber([router.url], "clean", "sub-c", got)
    pub = clients.publisher([router.url], "clean", "pub-c")
    assert pub.send("one", timeout=10).accepted
    incarnation = pub.incarnation
    pub.close()
    _wait(lambda: not sub.state.unsettled, what="settled")
    sub.close()
    pub2 = clients.publisher([router.url], "clean", "pub-c")
    assert pub2.wait_attached(10) and pub2.incarnation == incarnation
    fut = pub2.send_async("two")
    time.sleep(0.3)
    assert not fut.done()  # the subscriber is away and durable: the outcome waits for it
    got2 = []
    sub2 = clients.subscriber([router.url], "clean", "sub-c", got2)
    assert fut.result(timeout=10).accepted and fut.result().tag == b"2" and fut.result().seq == 2
    _wait(lambda: got2, what="the message sent while away")
    assert [m.body for m in got] == ["one"] and [m.body for m in got2] == ["two"]
    pub2.close(), sub2.close()


def _network(tmp_path, ids=("A", "B", "C")) -> RouterNetwork:
    lines = [f'[[router]]\nid = "{r}"' for r in ids]
    links = [f'[[link]]\nbetween = ["{a}", "{b}"]' for i, a in enumerate(ids) for b in ids[i + 1 :]]
    net = RouterNetwork(tmp_path / "net", parse_topology("\n".join(lines + links)), overrides={"router": {"idle_timeout": 2.0}})
    return net


def test_publisher_fails_over_when_its_router_is_killed(tmp_path, clients):
    """Publisher on A (failover list A, C), subscriber on B. A is SIGKILLed mid-stream:
    the publisher resumes on C; nothing lost, nothing duplicated."""
    net = _network(tmp_path)
    try:
        net.start()
        a, b, c = (net.routers[r] for r in "ABC")
        got = []
        sub = clients.subscriber([b.url], "fo", "sub-fo", got)
        assert sub.wait_attached(10)
        pub = clients.publisher([a.url, c.url], "fo", "pub-fo")
        assert pub.wait_attached(10)
        futures = []
        for i in range(400):
            futures.append(pub.send_async(f"m{i}"))
            if i == 150:
                _wait(lambda: len(pub.outcomes) >= 100, what="traffic flowing")
                killed_at = time.time()
                a.kill()
            time.sleep(0.002)
        results = [f.result(timeout=60) for f in futures]
        reattached = [t for t, event, _ in pub.history if event == "attached" and t > killed_at]
        assert reattached, pub.history
        print(f"publisher resumed on {c.url} {reattached[0] - killed_at:.2f} s after the kill")
        assert {r.state for r in results} == {"accepted"}
        _wait(
            lambda: not sub.state.unsettled,
            what="the router to settle every delivery to the subscriber: "
            f"{[(t[16:].hex(), s) for t, s in sub.state.entries()]} still unsettled",
        )
        pub.close(), sub.close()
        assert_exactly_once(clients.ledger("pub-fo"), {"sub-fo": clients.ledger("sub-fo")}, 400)
        assert pub.router is None or pub.router == c.url
    finally:
        net.stop()


def test_subscriber_fails_over_when_its_router_is_killed(tmp_path, clients):
    """Subscriber on B (failover list B, C), publisher on A. B is SIGKILLed mid-stream:
    the subscriber resumes on C and gets the rest, each message once."""
    net = _network(tmp_path)
    try:
        net.start()
        a, b, c = (net.routers[r] for r in "ABC")
        got = []
        sub = clients.subscriber([b.url, c.url], "fo2", "sub-fo2", got)
        assert sub.wait_attached(10)
        pub = clients.publisher([a.url], "fo2", "pub-fo2")
        assert pub.wait_attached(10)
        futures = []
        for i in range(400):
            futures.append(pub.send_async(f"m{i}"))
            if i == 150:
                _wait(lambda: len(got) >= 100, what="traffic flowing")
                b.kill()
            time.sleep(0.002)
        results = [f.result(timeout=60) for f in futures]
        assert {r.state for r in results} == {"accepted"}
        _wait(lambda: not sub.state.unsettled, what="settled")
        pub.close(), sub.close()
        assert_exactly_once(clients.ledger("pub-fo2"), {"sub-fo2": clients.ledger("sub-fo2")}, 400)
    finally:
        net.stop()


# --------------------------------------------------------------------------- stub server: the wire


@pytest.fixture
def stubs():
    started = []

    def make(**kw) -> StubServer:
        stub = StubServer(**kw).start()
        started.append(stub)
        return stub

    yield make
    for stub in started:
        stub.stop()


def test_attach_properties_carry_the_documented_values(stubs, clients):
    tag_a, tag_b = b"\x11" * 16 + b"\x011", b"\x11" * 16 + b"\x012"
    stub = stubs(
        outcome=None,
        subscriber_messages=[
            (tag_a, Message(body="a", properties={"seq": 1}).encode()),
            (tag_b, Message(body="b", properties={"seq": 2}).encode()),
        ],
    )
    pub = clients.publisher([stub.url], "wire", "pub-w")
    assert pub.wait_attached(10)
    for i in range(3):
        pub.send_async(f"m{i}")
    got = []
    sub = clients.subscriber([stub.url], "wire", "sub-w", got)
    assert sub.wait_attached(10)
    stub.wait(lambda: len(stub.transfers) == 3 and len(got) == 2, what="3 transfers and 2 deliveries")
    first_pub, first_sub = stub.attaches[0], stub.attaches[1]
    # first attaches: eorouter:resume false (we will resume), nothing else
    assert first_pub.role == "publisher" and first_pub.name == "pub-w-link" and first_pub.address == "wire"
    assert first_pub.container_id == "pub-w" and first_pub.properties == {RESUME: False}
    assert first_pub.rcv_settle_mode == 1  # second: the two-step settlement
    assert first_sub.role == "subscriber" and first_sub.properties == {RESUME: False}
    assert first_sub.durable == Terminus.DELIVERIES  # unsettled-state
    assert first_sub.expiry_policy == Terminus.EXPIRE_NEVER
    assert first_sub.rcv_settle_mode == 1  # second
    assert pub.incarnation == "stub-inc-1"

    stub.drop_connections()
    assert pub.wait_attached(10, attaches=2) and sub.wait_attached(10, attaches=2)
    resumed = {a.role: a for a in stub.attaches[2:]}
    p = resumed["publisher"]
    assert all(type(k) is symbol for k in p.raw_keys)
    assert p.properties[RESUME] is True
    assert p.properties[INCARNATION] == "stub-inc-1"
    assert p.properties[UNSETTLED] == [[b"1", "none"], [b"2", "none"], [b"3", "none"]]
    assert INCOMPLETE not in p.properties
    s = resumed["subscriber"]
    assert all(type(k) is symbol for k in s.raw_keys)
    assert s.properties[RESUME] is True and INCARNATION not in s.properties
    assert s.properties[UNSETTLED] == [[tag_a, "accepted"], [tag_b, "accepted"]]
    assert s.durable == Terminus.DELIVERIES and s.rcv_settle_mode == 1
    # the stub (like a router) sends both again: recognised, answered, not handed over again
    _wait(lambda: sub.duplicates == 2, what="resent deliveries recognised")
    assert [m.body for m in got] == ["a", "b"]
    # the publisher resent its three with their original tags
    stub.wait(lambda: len(stub.transfers) == 6, what="3 resends")
    assert [t.tag for t in stub.transfers] == [b"1", b"2", b"3"] * 2
    assert [t.payload for t in stub.transfers[3:]] == [t.payload for t in stub.transfers[:3]]


def test_subscriber_forgets_what_the_router_left_out_of_its_answer(stubs, clients):
    """The router's answer lists the tags it knows unsettled; a reported tag missing
    from it is settled (dropped from the unsettled state, kept for dedup)."""
    tags = [b"\x22" * 16 + b"\x01" + bytes([48 + i]) for i in range(1, 4)]

    def answer(attach):
        if attach.properties and attach.properties.get(RESUME):
            return {UNSETTLED: [[tags[1], "accepted"]]}
        return None

    stub = stubs(answer=answer, subscriber_messages=[(t, Message(body=i).encode()) for i, t in enumerate(tags)])
    got = []
    sub = clients.subscriber([stub.url], "forget", "sub-f", got)
    _wait(lambda: len(got) == 3, what="3 deliveries")
    assert [t for t, _ in sub.state.entries()] == tags
    stub.subscriber_messages = []
    stub.drop_connections()
    assert sub.wait_attached(10, attaches=2)
    assert [t for t, _ in sub.state.entries()] == [tags[1]]
    assert all(sub.state.seen(t) == "accepted" for t in tags)
    resumed = [line for line in clients.ledger("sub-f") if line["event"] == "resumed"]
    assert resumed[-1]["reported"] == 3 and resumed[-1]["known"] == 1 and resumed[-1]["settled"] == 2


def _full_window(stubs, clients, max_frame, name):
    stub = stubs(outcome=None, max_frame=max_frame, credit=1000)
    pub = clients.publisher([stub.url], "window", name)
    assert pub.wait_attached(10)
    for i in range(500):
        pub.send_async(f"message {i}")
    stub.wait(lambda: len(stub.transfers) == 500, what="500 transfers in flight")
    stub.drop_connections()
    assert pub.wait_attached(10, attaches=2)
    stub.wait(lambda: len(stub.transfers) == 1000, what="500 resent")
    first, again = stub.transfers[:500], stub.transfers[500:]
    assert [t.tag for t in again] == [t.tag for t in first] == [str(i).encode() for i in range(1, 501)]
    assert [t.payload for t in again] == [t.payload for t in first]
    return stub, pub, stub.attaches[-1]


def test_a_full_window_of_500_resumes_in_one_attach(stubs, clients):
    stub, pub, attach = _full_window(stubs, clients, None, "pub-500")
    assert attach.properties[UNSETTLED] == [[str(i).encode(), "none"] for i in range(1, 501)]
    assert INCOMPLETE not in attach.properties
    assert pub.last_resume["remote_max_frame"] == 32768  # proton's default


def test_a_list_too_big_for_the_frame_is_cut_and_marked_incomplete(stubs, clients):
    stub, pub, attach = _full_window(stubs, clients, 2048, "pub-cut")
    reported = attach.properties[UNSETTLED]
    assert attach.properties[INCOMPLETE] is True
    assert 0 < len(reported) < 500
    assert reported == [[str(i).encode(), "none"] for i in range(1, len(reported) + 1)]


def test_the_failover_server_list_is_followed(stubs, clients):
    """The client knows only stub A; A advertises B. When A goes away, the client
    goes to B (and records the failover in its ledger)."""
    b = stubs(outcome="accepted")
    a = stubs(outcome=None, failover=[("127.0.0.1", b.port)])
    pub = clients.publisher([a.url], "fl", "pub-fl")
    assert pub.wait_attached(10)
    fut = pub.send_async("x")
    a.wait(lambda: a.transfers, what="a transfer to A")
    assert pub.urls == [a.url, b.url]
    a.stop()
    assert fut.result(timeout=15).accepted
    assert pub.router == b.url
    assert b.attaches[0].properties[UNSETTLED] == [[b"1", "none"]]
    failover = [line for line in clients.ledger("pub-fl") if line["event"] == "failover"]
    assert failover and failover[0]["router"] == b.url and failover[0]["from"] == a.url


def test_a_subscriber_window_of_500_worst_case_tags_resumes_in_one_attach(stubs, clients):
    """500 deliveries held unsettled, each with a 32-byte tag (the hashed form of
    docs/tags.md, the longest a router sends): one attach still carries them all."""
    tags = [b"\x33" * 16 + b"\xff" + i.to_bytes(15, "big") for i in range(500)]
    stub = stubs(subscriber_messages=[(t, Message(body=i).encode()) for i, t in enumerate(tags)])
    got = []
    sub = clients.subscriber([stub.url], "window-s", "sub-500", got, prefetch=500)
    _wait(lambda: len(got) == 500, what="500 deliveries")
    stub.subscriber_messages = []
    stub.drop_connections()
    assert sub.wait_attached(10, attaches=2)
    attach = stub.attaches[-1]
    assert attach.properties[UNSETTLED] == [[t, "accepted"] for t in tags]
    assert INCOMPLETE not in attach.properties
