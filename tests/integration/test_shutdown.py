"""The router process's lifecycle: ready line, SIGTERM/SIGINT drain, restart, bad config.

On SIGTERM (or SIGINT) the router stops taking new deliveries, lets in-flight ones
finish for up to ``drain_grace`` seconds, answers every publisher delivery still
unfinished with released + ``eorouter:shutting-down``, flushes the log and exits 0.
A bad config file exits 2 with a one-line message naming the key.
"""

from __future__ import annotations

import signal

import pytest
from amqpclients import unique

from eorouter_tools.launcher import RouterProcess

pytestmark = pytest.mark.timeout(90)

HOLD = 0.5


def _kinds(router):
    return [e["event"] for e in router.events()]


def test_ready_line_once_and_sigterm_exits_zero(router_factory):
    router = router_factory("R")
    assert router.stderr_since_start().count(" ready on ") == 1
    assert "router-started" in _kinds(router)
    router.terminate()  # asserts exit code 0
    assert _kinds(router)[-1] == "router-stopping", "an orderly stop ends the epoch with router-stopping"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_in_flight_publisher_deliveries_released_at_shutdown(router_factory, amqp, signum):
    router = router_factory("R", delivery={"drain_grace": 1.0})
    topic = unique("drain")
    holder = amqp.connect(router.url).subscriber(topic)  # receives, never answers
    starved = amqp.connect(router.url).subscriber(topic, credit=0)  # never gets anything
    pub = amqp.connect(router.url).publisher(topic)
    sent = [pub.send(f"d{i}") for i in range(3)]
    amqp.wait(lambda: len(holder.received) == 3, what="the holding subscriber receives all")
    assert starved.received == []
    router.send_signal(signum)
    amqp.wait(
        lambda: all(s.outcome for s in sent), timeout=15, what="every in-flight publisher delivery answered during shutdown"
    )
    # AMQP's released carries no error condition: the reason is in the event log.
    assert [s.outcome for s in sent] == ["released"] * 3
    assert router.terminate(timeout=15, signum=signum) == 0
    story = router.events()
    assert "router-stopping" in [e["event"] for e in story]
    for rec in holder.received:
        outcomes = [e for e in story if e["event"] == "pub-outcome" and e.get("delivery") == rec.tag.hex()]
        assert len(outcomes) == 1, f"one logged publisher outcome for {rec.tag.hex()}: {outcomes}"
        assert outcomes[0]["outcome"] == "released"
        assert outcomes[0]["condition"] == "eorouter:shutting-down", outcomes[0]


def test_in_flight_delivery_may_finish_within_grace(router_factory, amqp):
    router = router_factory("R", delivery={"drain_grace": 10.0})
    topic = unique("graceful")
    sub = amqp.connect(router.url).subscriber(topic)
    pub = amqp.connect(router.url).publisher(topic)
    sent = pub.send("finishing")
    amqp.wait(lambda: len(sub.received) == 1, what="subscriber receives")
    router.send_signal(signal.SIGTERM)
    amqp.wait(lambda: "router-stopping" in _kinds(router), timeout=10, what="the router to log that it is stopping")
    assert router.is_running(), "the router must wait (up to drain_grace) for in-flight deliveries"
    late = pub.send("late", wait_credit=False) if pub.credit > 0 else None
    if late is not None:  # a delivery arriving during the drain is released at once
        amqp.wait(lambda: late.outcome, timeout=5, what="outcome of a delivery sent during the drain")
        assert late.outcome == "released"
        assert sent.outcome is None, "the in-flight one is still waiting for its subscriber"
    sub.accept(sub.received[0])
    amqp.wait(lambda: sent.outcome, timeout=10, what="outcome during the drain")
    assert sent.outcome == "accepted", "an in-flight delivery finished within the grace period"
    code = router.wait_exit(timeout=15)
    assert code == 0, f"exit code {code}; stderr:\n{router.stderr_tail()}"
    router.terminate()  # already exited: records that the exit was expected, re-checks 0


def test_restart_bumps_epoch_and_boot(router_factory, amqp):
    router = router_factory("R")
    first_epoch = router.epoch
    router.terminate()
    router.restart()
    assert router.epoch == first_epoch + 1
    started = [e for e in router.events() if e["event"] == "router-started"]
    assert len(started) == 2
    assert started[0]["epoch"] + 1 == started[1]["epoch"]
    assert started[0]["boot"] != started[1]["boot"]
    # After SIGKILL too: the epoch is persisted before the router says it is ready.
    router.kill()
    router.restart()
    assert router.epoch == first_epoch + 2


def test_second_router_on_the_same_data_dir_refuses_to_start(router_factory):
    first = router_factory("R")
    second = router_factory("S", start=False, router={"data_dir": str(first.data_dir)})
    second.spawn()
    code = second.wait_exit(timeout=20)
    message = second.stderr_since_start().strip()
    second.expected_exit = code
    assert code not in (None, 0), f"second router on a used data_dir: exit {code}; stderr:\n{message}"
    assert "in use" in message, message
    first.check_alive("a refused second router must not disturb the first")


def test_a_port_in_use_names_the_address_and_the_listener(router_factory):
    first = router_factory("P")
    second = router_factory(
        "Q", start=False, listener=[{"host": "127.0.0.1", "port": 0}, {"host": "127.0.0.1", "port": first.port}]
    )
    second.spawn()
    code = second.wait_exit(timeout=20)
    second.expected_exit = code
    message = second.stderr_since_start().strip()
    assert code == 1, f"exit {code}; stderr:\n{message}"
    # Its one line (after the INFO line of the listener it did bind) says which one failed.
    assert message.splitlines()[-1] == (
        f"eorouter: cannot listen on 127.0.0.1:{first.port} (normal listener): Address already in use"
    ), message
    assert "Traceback" not in message
    first.check_alive("a refused second router must not disturb the first")


# --------------------------------------------------------------------------- bad config

BAD_CONFIGS = {
    # name: (config text or None for "missing file", word the one-line message must contain)
    "not-toml": ('[router\nid = "R"\n', None),
    "missing-router-id": ("router.id", "id"),
    "port-not-an-integer": ("listener.port", "port"),
    "unknown-no-subscribers-answer": ("delivery.no_subscribers", "no_subscribers"),
    "negative-max-message-size": ("limits.max_message_size", "max_message_size"),
    "missing-file": (None, None),
}


def _bad_text(router: RouterProcess, which: str) -> str:
    from eorouter_tools.launcher import merge_config, to_toml

    config = router.config
    if which == "router.id":
        config = merge_config(config, {"router": {"id": None}})
    elif which == "listener.port":
        config = merge_config(config, {"listener": [{"host": "127.0.0.1", "port": "abc"}]})
    elif which == "delivery.no_subscribers":
        config = merge_config(config, {"delivery": {"no_subscribers": "maybe"}})
    elif which == "limits.max_message_size":
        config = merge_config(config, {"limits": {"max_message_size": -1}})
    return to_toml(config)


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_exits_2_with_one_line(router_factory, case):
    router = router_factory("R", start=False)
    what, word = BAD_CONFIGS[case]
    if case == "missing-file":
        router.spawn(args=["run", "--config", str(router.workdir / "no-such-file.toml")])
    elif what.startswith("["):
        router.spawn(config_text=what)
    else:
        router.spawn(config_text=_bad_text(router, what))
    code = router.wait_exit(timeout=20)
    router.expected_exit = 2
    message = router.stderr_since_start().strip()
    assert code == 2, f"exit code {code}; stderr:\n{message}"
    assert message, "a bad config must say what is wrong"
    assert len(message.splitlines()) == 1, f"expected one line, got:\n{message}"
    assert "Traceback" not in message
    if word:
        assert word in message, f"the message should name {word!r}: {message}"
