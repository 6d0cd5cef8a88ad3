"""The connection side shared by ResumablePublisher and ResumableSubscriber.

Each client owns one proton ``Container`` running on its own daemon thread. The
application talks to it through a command queue and an ``EventInjector`` (the
pure-Python reactor's ``Container.wakeup()`` does nothing); everything proton and
every state change happens on that thread.

Connection life cycle (one connection, one session, one link at a time):

    connect(url) -> router's open (merge its failover-server-list)
                 -> attach our link (resume properties once attached before)
                 -> router's attach (read its resume answer)  => "attached"
    transport lost / heartbeat expired / router closed or detached us
                 -> drop everything of that connection, next URL after a backoff

Reconnection is ours (``reconnect=False`` for proton) so that the URL list can
grow from what routers advertise and every attach carries fresh resume state.
Dead routers are noticed through the AMQP heartbeat (``heartbeat=`` seconds; the
router sends empty frames at half of it), and a connect that has not produced
an attached link within ``connect_timeout`` is abandoned.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any

from cproton import ffi, lib
from proton import Connection, Delivery, Endpoint, Handler, symbol
from proton.reactor import ApplicationEvent, Container, EventInjector

from router.client.iohandler import new_container
from router.client.ledger import Ledger
from router.client.protocol import (
    RESUME,
    Backoff,
    ResumeAnswer,
    failover_urls,
    merge_urls,
    normalise_url,
    read_answer,
    resume_properties,
    unsettled_budget,
)

log = logging.getLogger("eorouter.client")

OUTCOME_NAMES = {
    int(Delivery.ACCEPTED): "accepted",
    int(Delivery.REJECTED): "rejected",
    int(Delivery.RELEASED): "released",
    int(Delivery.MODIFIED): "modified",
}
STATE_CODES = {name: code for code, name in OUTCOME_NAMES.items()}

STOLEN = "amqp:link:stolen"
# A router refusing our attach with one of these will refuse it again: stop.
FATAL_REFUSALS = frozenset(
    {
        "amqp:invalid-field",
        "amqp:not-found",
        "amqp:unauthorized-access",
        "amqp:not-implemented",
        "amqp:not-allowed",
        "amqp:precondition-failed",
        "amqp:decode-error",
    }
)


class ClientError(RuntimeError):
    """The client stopped for good (its link was stolen by another process with the
    same identity, a router refused the link, or the state file is unusable)."""


def raw_tag(dlv) -> bytes:
    """A delivery's tag as bytes (proton-python's ``Delivery.tag`` decodes it as UTF-8
    and fails on the router's binary tags)."""
    tag = lib.pn_delivery_tag(dlv._impl)
    return bytes(ffi.unpack(tag.start, tag.size))


def _symbols(props: dict) -> dict:
    return {symbol(k): v for k, v in props.items()}


class _Wakeup(Handler):
    def __init__(self, client: ResumableClient):
        super().__init__()
        self.client = client

    def on_eorouter_client_wakeup(self, event) -> None:
        self.client._drain_commands()

    def on_timer_task(self, event) -> None:  # not used: timers have their own handlers
        pass


class _Timer(Handler):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.cancelled = False

    def on_timer_task(self, event) -> None:
        if not self.cancelled:
            self.fn()


class _ConnHandler(Handler):
    """Engine events of one connection (and its session and link); events of a
    connection we have given up on are ignored."""

    def __init__(self, client: ResumableClient, gen: int):
        super().__init__()
        self.client = client
        self.gen = gen

    def _live(self) -> bool:
        return self.gen == self.client._gen and not self.client._stopping

    def on_connection_remote_open(self, event) -> None:
        if self._live():
            self.client._on_connection_open(event.connection)

    def on_link_remote_open(self, event) -> None:
        if self._live() and event.link == self.client._link:
            self.client._on_link_open(event.link)

    def on_link_flow(self, event) -> None:
        if self._live() and event.link == self.client._link and self.client._attached:
            self.client._on_flow(event.link)

    def on_delivery(self, event) -> None:
        if self._live() and event.link == self.client._link:
            self.client._on_delivery(event.link, event.delivery)

    def on_link_remote_close(self, event) -> None:
        self._link_gone(event, closed=True)

    def on_link_remote_detach(self, event) -> None:
        self._link_gone(event, closed=False)

    def _link_gone(self, event, closed: bool) -> None:
        if not self._live() or event.link != self.client._link:
            return
        cond = event.link.remote_condition
        name = str(cond.name) if cond is not None and cond.name else None
        desc = cond.description if cond is not None else None
        self.client._lost(f"link {'closed' if closed else 'detached'} by router: {name} {desc or ''}".strip(), condition=name)

    def on_connection_remote_close(self, event) -> None:
        if self._live():
            cond = event.connection.remote_condition
            self.client._lost(f"connection closed by router: {cond.name if cond else None}")

    def on_transport_error(self, event) -> None:
        if self._live():
            cond = event.transport.condition
            self.client._lost(f"transport error: {cond.name if cond else None} {cond.description if cond else ''}".strip())

    def on_transport_closed(self, event) -> None:
        if self._live():
            self.client._lost("transport closed")


class ResumableClient:
    """Base of the publisher and the subscriber. Subclasses implement the ``_on_*``
    link hooks and ``_make_link``; everything prefixed ``_`` runs on the client thread."""

    role = ""

    def __init__(
        self,
        urls,
        topic: str,
        *,
        container_id: str,
        link_name: str,
        state,
        ledger_path,
        heartbeat: float = 2.0,
        connect_timeout: float = 5.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 2.0,
        unsettled_cap: int | None = None,
        ledger_fsync: bool = False,
        ssl_domain=None,
        user: str | None = None,
        password: str | None = None,
        sasl_mechanisms: str | None = None,
    ):
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("at least one router URL is needed")
        if ssl_domain is None and any(str(u).strip().startswith("amqps://") for u in urls):
            raise ValueError("amqps:// URLs need ssl_domain (a proton SSLDomain with the routers' CA)")
        self.configured_urls = [normalise_url(u) for u in urls]
        self.urls = list(self.configured_urls)
        self.topic = topic
        self.container_id = container_id
        self.link_name = link_name
        self.state = state
        self.ledger = Ledger(ledger_path, client=container_id, link=link_name, role=self.role, topic=topic, fsync=ledger_fsync)
        self.heartbeat = heartbeat
        self.connect_timeout = connect_timeout
        self.backoff = Backoff(backoff_initial, backoff_max)
        self.unsettled_cap = unsettled_cap
        # A proton SSLDomain: every router of the list is reached over TLS with it
        # (docs/client.md, "TLS"); None: plain AMQP.
        self.ssl_domain = ssl_domain
        # A SASL login (docs/security.md, "Logins"): user (name@realm) and password for
        # PLAIN or SCRAM, the mechanisms to try (space-separated; None: whatever both offer).
        self.user = user
        self.password = password
        self.sasl_mechanisms = sasl_mechanisms
        # connection state (client thread)
        self._gen = 0
        self._url_index = -1
        self._conn: Connection | None = None
        self._link = None
        self._attached = False
        self._stopping = False
        self._connect_timer: _Timer | None = None
        self._refused = False
        self._previous_router: str | None = None  # the router of the last attached link
        # observable state (read by any thread)
        self.router: str | None = None  # URL of the router the link is attached to
        self.attaches = 0
        self.error: ClientError | None = None
        self.last_resume: dict | None = None  # what our last resuming attach reported
        self.last_answer: ResumeAnswer | None = None
        # (time.time(), event, detail): the last 1000 connection events, for tests and debugging
        self.history: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=1000)
        self._cond = threading.Condition()
        self._commands: collections.deque = collections.deque()
        self._inject_lock = threading.Lock()
        self._wakeup_pending = False
        self._thread: threading.Thread | None = None
        self._container: Container | None = None
        self._injector: EventInjector | None = None
        self._stopped = threading.Event()

    # ------------------------------------------------------------------ application side

    def start(self) -> ResumableClient:
        if self._thread is not None:
            return self
        self._injector = EventInjector()
        self._container = new_container(_Wakeup(self))
        self._container.container_id = self.container_id
        self._container.selectable(self._injector)
        self._thread = threading.Thread(target=self._run, name=f"eorouter-{self.role}-{self.link_name}", daemon=True)
        self._thread.start()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def _call(self, fn, *args) -> None:
        """Run ``fn(*args)`` on the client thread (one wakeup per batch of commands)."""
        self._commands.append((fn, args))
        with self._inject_lock:
            if self._wakeup_pending or self._injector is None or self._stopped.is_set():
                return
            self._wakeup_pending = True
            self._injector.trigger(ApplicationEvent("eorouter_client_wakeup"))

    def wait_for(self, predicate, timeout: float | None = None) -> bool:
        """Block until ``predicate()`` is true (re-checked on every state change); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not predicate():
                if self.error is not None:
                    raise self.error
                if self._stopped.is_set():
                    return bool(predicate())
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(0.1 if remaining is None else min(remaining, 0.1))
            return True

    def wait_attached(self, timeout: float | None = 10.0, attaches: int = 1) -> bool:
        """Until the link has been attached ``attaches`` times in total (1: the first attach)."""
        return self.wait_for(lambda: self.attaches >= attaches and self._attached, timeout)

    @property
    def attached(self) -> bool:
        return self._attached

    def close(self, timeout: float = 5.0) -> None:
        """Detach the link (its terminus stays resumable), close the connection, stop the
        thread. The state file keeps everything needed to resume later."""
        self._shutdown(close_terminus=False, timeout=timeout)

    def kill_connection(self) -> None:
        """Drop the current TCP connection without any AMQP goodbye (tests: what a
        network failure looks like from here); the client fails over as usual."""
        self._call(self._abort_connection, "killed by the application")

    def _shutdown(self, close_terminus: bool, timeout: float) -> None:
        if self._thread is None:
            self.state.close()
            self.ledger.close()
            return
        if not self._stopped.is_set():
            self._call(self._begin_stop, close_terminus)
            self._stopped.wait(timeout)
            if not self._stopped.is_set():
                self._call(self._force_stop)
                self._stopped.wait(2.0)
        self._thread.join(timeout=2.0)
        with self._inject_lock:
            if not self._thread.is_alive() and self._injector is not None:
                for fd in self._injector.pipe:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._injector = None
        self.state.close()
        self.ledger.close()

    # ------------------------------------------------------------------ client thread

    def _run(self) -> None:
        try:
            self._call(self._connect_next)
            container = self._container
            assert container is not None  # made by start() before this thread runs
            container.run()
        except Exception as exc:  # noqa: BLE001 - surface anything the thread died of
            log.exception("eorouter client thread failed")
            self._fail(ClientError(f"client thread failed: {exc!r}"))
        finally:
            self._stopped.set()
            self._notify()

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _note(self, event: str, detail: str = "") -> None:
        self.history.append((time.time(), event, detail))
        log.info("%s %s/%s: %s %s", self.role, self.container_id, self.link_name, event, detail)

    def _fail(self, error: ClientError) -> None:
        if self.error is None:
            self.error = error
        self._note("error", str(error))
        self._notify()

    def _drain_commands(self) -> None:
        with self._inject_lock:
            self._wakeup_pending = False
        while self._commands:
            fn, args = self._commands.popleft()
            fn(*args)
        self._after_commands()

    def _after_commands(self) -> None:
        pass

    def _schedule(self, delay: float, fn) -> _Timer:
        timer = _Timer(fn)
        container = self._container
        assert container is not None  # the client thread's: it exists while timers are set
        container.schedule(delay, timer)
        return timer

    def _connect_next(self) -> None:
        if self._stopping:
            return
        self._gen += 1
        self._url_index = (self._url_index + 1) % len(self.urls)
        url = self.urls[self._url_index]
        self._note("connect", url)
        self._attached = False
        self._refused = False
        self._link = None
        kwargs: dict[str, Any] = {"heartbeat": self.heartbeat} if self.heartbeat else {}
        if self.ssl_domain is not None:  # proton applies the domain to amqps:// URLs only
            kwargs["ssl_domain"] = self.ssl_domain
        if self.user is not None:
            kwargs.update(user=self.user, password=self.password, sasl_enabled=True)
        if self.sasl_mechanisms is not None:
            kwargs["allowed_mechs"] = self.sasl_mechanisms
        target = f"amqps://{url}" if self.ssl_domain is not None else url
        container = self._container
        assert container is not None
        self._conn = container.connect(
            url=target, handler=_ConnHandler(self, self._gen), reconnect=False, container_id=self.container_id, **kwargs
        )
        gen = self._gen
        if self._connect_timer is not None:
            self._connect_timer.cancelled = True
        self._connect_timer = self._schedule(self.connect_timeout, lambda: self._connect_timed_out(gen))

    def _connect_timed_out(self, gen: int) -> None:
        if gen == self._gen and not self._attached and not self._stopping:
            self._abort_connection(f"no attached link within {self.connect_timeout} s")

    def _abort_connection(self, reason: str) -> None:
        conn = self._conn
        if conn is None:
            return
        transport = conn.transport
        if transport is not None:
            transport.close_head()
            transport.close_tail()
        self._lost(reason)

    def _on_connection_open(self, connection) -> None:
        advertised = failover_urls(connection.remote_properties, tls=self.ssl_domain is not None)
        if advertised:
            merged = merge_urls(self.urls, advertised)
            if merged != self.urls:
                current = self.urls[self._url_index]
                self.urls = merged
                self._url_index = self.urls.index(current)
                self._note("failover-list", ",".join(self.urls))
        session = connection.session()
        session.open()
        link = self._make_link(session)
        props = self._resume_props(connection)
        if props is not None:
            link.properties = _symbols(props)
        self._link = link
        link.open()

    def _resume_props(self, connection) -> dict | None:
        """Properties for our attach. The very first attach of this identity says only
        that we resume after a failure (``eorouter:resume`` false): a router then
        settles a publisher's deliveries in two steps (docs/delivery-rule.md)."""
        if not self.state.attached_once:
            self.last_resume = None
            return {RESUME: False}
        transport = connection.transport
        remote_max = transport.remote_max_frame_size if transport is not None else 0
        kw = {"cap": self.unsettled_cap} if self.unsettled_cap is not None else {}
        budget = unsettled_budget(remote_max, name=self.link_name, address=self.topic, **kw)
        props, reported, incomplete = resume_properties(self.state.entries(), budget, incarnation=self._incarnation())
        self.last_resume = {
            "properties": props,
            "reported": reported,
            "incomplete": incomplete,
            "budget": budget,
            "remote_max_frame": remote_max,
        }
        return props

    def _incarnation(self) -> str | None:
        return None

    def _on_link_open(self, link) -> None:
        if self._link_refused(link):
            self._refused = True
            return
        if self._connect_timer is not None:
            self._connect_timer.cancelled = True
        try:
            answer = read_answer(link.remote_properties)
        except ValueError as err:
            self._note("bad-answer", str(err))
            answer = ResumeAnswer(None, None, False)
        self.last_answer = answer
        url = self.urls[self._url_index]
        resumed = self.last_resume is not None
        failed_over = self._previous_router is not None
        self.router = url
        self._attached = True
        self.attaches += 1
        self.backoff.reset()
        if failed_over:
            previous: dict[str, Any] = {"from": self._previous_router}  # "from" is a keyword
            self.ledger.write("failover", router=url, **previous)
        self._previous_router = url
        self._note("attached", f"{url} resumed={resumed}")
        self._attached_hook(link, answer, resumed)
        self.state.record_attached()
        self._notify()

    def _link_refused(self, link) -> bool:
        """A router refuses an attach by answering with no terminus, then detaching."""
        terminus = link.remote_target if self.role == "publisher" else link.remote_source
        if terminus is None or terminus.type == 0:  # PN_UNSPECIFIED: refused
            return True
        return False

    def _lost(self, reason: str, condition: str | None = None) -> None:
        """The current connection or link is gone: forget it and fail over."""
        if self._stopping:
            return
        self._gen += 1  # every later event of the old connection is ignored
        was_attached = self._attached
        self._attached = False
        self._link = None
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if conn.state & Endpoint.LOCAL_ACTIVE:
                    conn.close()
                transport = conn.transport
                if transport is not None:
                    transport.close_head()
                    transport.close_tail()
            except Exception:  # noqa: BLE001 - the connection is being thrown away
                pass
        if self._connect_timer is not None:
            self._connect_timer.cancelled = True
            self._connect_timer = None
        self.router = None
        self._note("lost", reason)
        self._lost_hook(was_attached)
        if condition == STOLEN or (self._refused and condition in FATAL_REFUSALS):
            if condition == STOLEN:
                text = (
                    f"link {self.container_id}/{self.link_name} was taken over by another attach with "
                    f"the same container-id and link name; stopping"
                )
            else:
                text = f"router refused link {self.container_id}/{self.link_name}: {reason}"
            self._fail(ClientError(text))
            self._begin_stop(False)
            return
        delay = self.backoff.next_delay(len(self.urls))
        self._notify()
        self._schedule(delay, self._connect_next) if delay > 0 else self._connect_next()

    def _begin_stop(self, close_terminus: bool) -> None:
        if self._stopping:
            return
        self._stop_hook()
        self._stopping = True
        link, conn = self._link, self._conn
        if link is not None and self._attached:
            if close_terminus:
                link.close()
            else:
                link.detach()
        if conn is not None:
            conn.close()
        self._attached = False
        self._notify()
        # give the frames a moment to leave, then stop the reactor
        self._schedule(0.2, self._force_stop)

    def _force_stop(self) -> None:
        self._stopping = True
        conn = self._conn
        self._conn = None
        if conn is not None and conn.transport is not None:
            conn.transport.close_head()
            conn.transport.close_tail()
        if self._injector is not None:
            self._injector.close()
        if self._container is not None:
            self._container.stop()

    # hooks
    def _make_link(self, session):
        raise NotImplementedError

    def _attached_hook(self, link, answer: ResumeAnswer, resumed: bool) -> None:
        pass

    def _lost_hook(self, was_attached: bool) -> None:
        pass

    def _stop_hook(self) -> None:
        pass

    def _on_flow(self, link) -> None:
        pass

    def _on_delivery(self, link, dlv) -> None:
        pass
