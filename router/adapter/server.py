"""The router's event loop: listening sockets, accepted connections, timers, shutdown.

One thread, one ``selectors`` loop. Every accepted socket gets a server-mode
``pn_transport``, a ``pn_connection`` and a ``pn_collector``, driven through
``cproton_ffi.lib``. Each iteration follows the write discipline:

    read sockets -> engine events -> core commands -> eventlog.flush() -> write sockets

so no frame leaves the process before the event-log records of the decisions
that produced it are in the kernel (a SIGKILL cannot lose an event a peer saw).

SASL: a server transport autodetects the protocol header, so clients that open
with the SASL header get a SASL layer offering ANONYMOUS, and clients that skip
SASL and send the plain AMQP header are accepted as well (``pn_transport_require_auth``
stays off).

Inter-router connections (docs/inter-router.md): listeners with role
``inter-router`` accept them, ``[[connector]]`` entries dial them (a non-blocking
``connect``, then a client-mode transport without SASL; re-dialled with backoff,
``network.reconnect_delay`` doubling up to ``network.reconnect_max``, until
shutdown). ``interrouter.py`` runs their handshake and links. Control messages
the core produced during an iteration go out as one transfer per neighbour just
before the event-log flush.
"""

from __future__ import annotations

import errno
import heapq
import logging
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from time import perf_counter
from typing import Any

from cproton_ffi import ffi, lib

from router.adapter import fastpath, sasl, streaming, tls
from router.adapter.endpoints import Conn, condition_of, printable
from router.adapter.engine import Engine
from router.adapter.management import Management
from router.adapter.slow import SlowSubscribers
from router.buckets import Buckets
from router.core.events import ListenersReady, ShutdownRequested, TimerFired

log = logging.getLogger("eorouter.server")

NULL = ffi.NULL
READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
MAX_FEEDS_PER_WRITE = 4  # streaming.FEED_BUDGET each: 4 MiB per connection per loop round
IO_SIZE = 256 * 1024
ACCEPT_BATCH = 64
CLOSE_WAIT = 3.0  # how long closing connections get to finish their close handshake
SHUTDOWN_SLACK = 5.0  # beyond the drain grace, how long we wait for the core's ShutdownComplete

_LISTENER = object()
_ANONYMOUS = sasl.listener_logins(("ANONYMOUS",), False)  # what a listener offers unless its config says more
_WAKEUP = object()

_transport_capacity = lib.pn_transport_capacity
_transport_push = lib.pn_transport_push
_transport_pending = lib.pn_transport_pending
_transport_peek = lib.pn_transport_peek
_transport_pop = lib.pn_transport_pop
_collector_peek = lib.pn_collector_peek
# Compiled socket I/O when built (fastpath.py); None: the Python loops of _read and _write.
_read_into = fastpath.read_into
_write_out = fastpath.write_out


class Listener:
    __slots__ = ("host", "port", "role", "sock", "tls_domain", "logins")

    def __init__(self, host: str, port: int, role: str = "normal", tls_domain=None, logins: sasl.ListenerLogins | None = None):
        self.host = host
        self.port = port
        self.role = role  # "normal" (clients) or "inter-router"
        self.sock: socket.socket | None = None
        self.tls_domain = tls_domain  # its pn_ssl_domain (tls.py), or None: plain AMQP
        self.logins = logins or _ANONYMOUS  # the SASL mechanisms its clients may use (sasl.py)


class Dialer:
    """One ``[[connector]]``: dials its peer, and again after every loss, with backoff."""

    __slots__ = (
        "host",
        "port",
        "name",
        "sock",
        "retry_at",
        "connect_by",
        "delay",
        "base_delay",
        "max_delay",
        "failures",
        "tls_domain",
        "tls_name",
    )

    def __init__(
        self, host: str, port: int, name: str, base_delay: float, max_delay: float, tls_domain=None, tls_name: str | None = None
    ):
        self.host = host
        self.port = port
        self.name = name or f"{host}:{port}"
        self.tls_domain = tls_domain  # its pn_ssl_domain (tls.py), or None: plain AMQP
        self.tls_name = tls_name or host  # the name the server's certificate must carry
        self.sock: socket.socket | None = None  # while a connect is in progress
        self.retry_at = 0.0  # monotonic time of the next dial (0: none scheduled)
        self.connect_by = 0.0  # a connect in progress fails at this monotonic time
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.delay = base_delay  # the next wait; doubles per failed attempt
        self.failures = 0  # attempts since the last connection that came up

    def connected(self) -> None:
        """The connection came up (PeerConnected): the next loss re-dials quickly."""
        self.delay = self.base_delay
        self.failures = 0

    def __repr__(self) -> str:
        return f"<Dialer {self.name}>"


class Server:
    """Owns the sockets and the proton objects; the Engine translates, the core decides."""

    def __init__(
        self,
        *,
        router_id: str,
        core,
        eventlog,
        listeners,
        max_message_size: int,
        idle_timeout: float = 0.0,
        drain_grace: float = 5.0,
        connectors=(),
        network=None,
        slow_subscriber_age: float = 0.0,
        policy=None,
        sasl_settings=None,
        data_dir=None,
    ):
        self.router_id = router_id
        self.core = core
        self.eventlog = eventlog
        self.listeners = [
            Listener(
                item.host,
                item.port,
                getattr(item, "role", "normal"),
                tls.server_domain(item.tls, f"listener {item.host}:{item.port}")
                if getattr(item, "tls", None) is not None
                else None,
                sasl.listener_logins(
                    getattr(item, "sasl_mechanisms", ("ANONYMOUS",)), getattr(item, "sasl_allow_plain_in_clear", False)
                ),
            )
            for item in listeners
        ]
        # Cyrus's configuration, when a listener checks passwords (SaslError when it cannot).
        offered = {m for item in listeners for m in getattr(item, "sasl_mechanisms", ())}
        users_db = getattr(sasl_settings, "users_db", None)
        self.sasl_conf_dir = sasl.prepare(data_dir, users_db, offered) if data_dir is not None else None
        self.idle_timeout_ms = int(max(0.0, idle_timeout) * 1000)
        self.drain_grace = drain_grace
        base_delay = getattr(network, "reconnect_delay", 0.5)
        max_delay = getattr(network, "reconnect_max", 2.0)
        self.dialers = [
            Dialer(
                c.host,
                c.port,
                getattr(c, "name", ""),
                base_delay,
                max_delay,
                tls.client_domain(c.tls, f"connector {c.host}:{c.port}") if getattr(c, "tls", None) is not None else None,
                c.tls.server_name if getattr(c, "tls", None) is not None else None,
            )
            for c in connectors
        ]
        # How long a connect, and then the inter-router handshake, may take.
        self.handshake_timeout = idle_timeout if idle_timeout > 0 else 10.0
        self.engine = Engine(
            core,
            eventlog,
            max_message_size=max_message_size,
            router_id=router_id,
            secret=getattr(network, "secret", None),
            handshake_timeout=self.handshake_timeout,
        )
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}
        self._last_conn_id = 0
        self._container = router_id.encode("utf-8")
        self._rbuf = bytearray(IO_SIZE)
        self._rcdata = ffi.from_buffer(self._rbuf)
        self._wbuf = bytearray(IO_SIZE)
        self._wcdata = ffi.from_buffer(self._wbuf)
        self._wview = memoryview(self._wbuf)
        self._redo: set[Conn] = set()  # connections with engine events to drain next iteration
        self._next_tick = 0  # earliest pn_transport_tick deadline, monotonic ms (0: none)
        self._tick_heap: list[tuple[int, int, Conn]] = []  # (deadline ms, conn_id, Conn)
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        # Work other threads hand to the loop (call_in_loop: the metrics and health
        # endpoints read the core's state only from here), and how long each
        # iteration of the loop worked (not counting its wait in select()).
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self.loop_seconds = Buckets()
        self.routes_converged = False  # set once by the readiness check (router/adapter/snapshots.py)
        self.engine.management = Management(self)
        self.engine.policy = policy
        self.engine.realm = getattr(sasl_settings, "realm", None)
        self.login_failure_delay = getattr(sasl_settings, "login_failure_delay", 1.0)
        self._held: list[tuple[float, int, Conn]] = []  # (until, conn_id, conn): failed logins' answers, delayed
        self.slow = SlowSubscribers(slow_subscriber_age)
        # Shutdown state
        self.stop_requested = False
        self.hard_stop = False
        self._phase = "running"  # running -> draining -> closing -> done
        self._phase_deadline = 0.0

    # ------------------------------------------------------------------ setup
    def bind(self) -> list[tuple[str, int]]:
        """Bind every listener (port 0: an ephemeral port); return the bound addresses."""
        bound = []
        for lst in self.listeners:
            sock = socket.socket(socket.AF_INET6 if ":" in lst.host else socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((lst.host, lst.port))
                sock.listen(128)
            except OSError as exc:
                sock.close()
                # "Address already in use" alone does not say which of the listeners.
                where = f"[{lst.host}]:{lst.port}" if ":" in lst.host else f"{lst.host}:{lst.port}"
                raise OSError(exc.errno, f"cannot listen on {where} ({lst.role} listener): {exc.strerror or exc}") from exc
            sock.setblocking(False)
            lst.sock = sock
            lst.port = sock.getsockname()[1]
            self.sel.register(sock, READ, _LISTENER)
            bound.append((lst.host, lst.port))
            log.info("listening on %s:%d (%s)", lst.host, lst.port, lst.role)
        # Other routers offer these to their clients as a failover list.
        self.engine.now = time.time()
        self.engine.timer(
            ListenersReady(
                tuple(
                    (lst.host, lst.port, "amqps" if lst.tls_domain is not None else "amqp")
                    for lst in self.listeners
                    if lst.role == "normal"
                )
            )
        )
        return bound

    def wakeup_socket(self) -> int:
        """A socket fd for ``signal.set_wakeup_fd``: a signal wakes the select()."""
        if self._wake_w is None:
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self.sel.register(self._wake_r, READ, _WAKEUP)
        return self._wake_w.fileno()

    def request_stop(self) -> None:
        """Signal handler side: the first call starts a graceful shutdown, a second one
        makes the loop exit at once (after flushing the event log)."""
        if self.stop_requested:
            self.hard_stop = True
        self.stop_requested = True

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        """Serve until shut down; returns the process exit code."""
        engine = self.engine
        peers = engine.peers
        eventlog = self.eventlog
        for dialer in self.dialers:
            self._dial(dialer)
        try:
            while True:
                timeout = self._timeout()
                ready = self.sel.select(timeout)
                started = perf_counter()
                now = time.time()
                engine.now = now
                if self.hard_stop:
                    # Exit 0 only when nothing was cut short: the core had answered
                    # every publisher delivery already.
                    log.warning("second signal: exiting now")
                    return 0 if self.engine.shutdown_complete else 1
                active = self._redo
                self._redo = set()
                self._handle_ready(ready, active)
                if self._calls:
                    self._run_calls()
                if self._next_tick:
                    self._tick(active)
                if self._held:
                    self._release_held(active)
                if self.dialers or peers.handshakes:
                    self._inter_router_timers()
                if self.stop_requested and self._phase == "running":
                    self._begin_drain()
                deadline = self.core.next_deadline()
                if deadline is not None and now >= deadline:
                    self._core_timer(TimerFired())
                if self.slow.due(now):
                    self.slow.check(self.core, now)
                self._process(active)
                if peers.batches:  # this iteration's control messages: one transfer per neighbour
                    peers.flush()
                    active |= engine.touched
                    engine.touched.clear()
                eventlog.flush()
                for conn in active:
                    if not conn.dead and not conn.held:
                        try:
                            self._write(conn)
                        except Exception:
                            self._io_failed(conn, "writing")
                for conn in active:
                    if conn.dead:
                        self._teardown(conn)
                self.loop_seconds.observe(perf_counter() - started)
                if self._phase != "running" and self._advance_shutdown(now):
                    return 0
        finally:
            eventlog.flush()

    def _handle_ready(self, ready: list, active: set) -> None:
        """What select() found: bytes in (the connection joins ``active``), a new
        connection, a wake-up, a finished dial."""
        for key, mask in ready:
            data = key.data
            if data.__class__ is Conn:
                if mask & READ:
                    try:
                        self._read(data)
                    except Exception:
                        self._io_failed(data, "reading")
                active.add(data)
            elif data is _LISTENER:
                self._accept(key.fileobj)
            elif data is _WAKEUP:
                self._drain_wakeup()
            elif data.__class__ is Dialer:
                self._dial_done(data)

    def _timeout(self) -> float | None:
        if self._redo or (self.stop_requested and self._phase == "running") or self.hard_stop:
            return 0.0
        now = time.time()
        timeout = 5.0
        deadline = self.core.next_deadline()
        if deadline is not None:
            timeout = min(timeout, deadline - now)
        if self._next_tick:
            timeout = min(timeout, (self._next_tick - _mono_ms()) / 1000.0)
        if self.dialers or self.engine.peers.handshakes:
            soonest = self._next_inter_router_deadline()
            if soonest is not None:
                timeout = min(timeout, soonest - time.monotonic())
        if self._held:
            timeout = min(timeout, self._held[0][0] - time.monotonic())
        if self._phase != "running":
            timeout = min(timeout, 0.1)
        return max(0.0, timeout)

    def _process(self, active: set) -> None:
        """Drain engine events of every active connection, and of every connection the
        core's commands touched, until no collector has anything left."""
        engine = self.engine
        touched = engine.touched
        pending = set(active)
        pending |= touched
        touched.clear()
        while pending:
            conn = pending.pop()
            if conn.dead:
                active.add(conn)
                continue
            engine.drain(conn)
            active.add(conn)
            if touched:
                pending |= touched
                touched.clear()
        silent = engine.silent
        if silent:
            for conn in silent:
                if not conn.dead:
                    log.info(
                        "connection %d (%s): peer silent past the idle timeout: closing the socket "
                        "without waiting to send our close",
                        conn.conn_id,
                        conn.peer,
                    )
                    self._cut(conn)
            silent.clear()
        opened = engine.opened
        if opened:  # the peer's open frame set its idle timeout: schedule keepalives
            now_ms = _mono_ms()
            for conn in opened:
                if not conn.dead:
                    self._tick_one(conn, now_ms)
            opened.clear()

    def _hold_answer(self, conn: Conn) -> None:
        """A failed login's answer (and the close after it) leaves only after the
        login failure delay: each guess costs a client that long, while the loop
        serves everyone else."""
        conn.authenticating = False
        conn.held = True
        self.engine.login_failed(conn)
        heapq.heappush(self._held, (time.monotonic() + self.login_failure_delay, conn.conn_id, conn))

    def _release_held(self, active: set) -> None:
        now = time.monotonic()
        held = self._held
        while held and held[0][0] <= now:
            _, _, conn = heapq.heappop(held)
            conn.held = False
            active.add(conn)

    def _core_timer(self, event) -> None:
        try:
            self.engine.timer(event)
        except Exception:
            log.exception("core failed on %s", type(event).__name__)
        # What it touched is drained by _process in this same iteration.

    # ------------------------------------------------------------------ connections
    def _accept(self, lsock: socket.socket) -> None:
        if self._phase != "running":
            return
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                log.warning("accept failed: %s", exc)
                return
            try:
                listener = self._listener_of(lsock)
                self._open_connection(
                    sock,
                    addr,
                    listener.role if listener else "normal",
                    tls_domain=listener.tls_domain if listener else None,
                    logins=listener.logins if listener else _ANONYMOUS,
                )
            except Exception:
                log.exception("could not set up a connection from %s", addr)
                sock.close()

    def _listener_of(self, lsock: socket.socket) -> Listener | None:
        for lst in self.listeners:
            if lst.sock is lsock:
                return lst
        return None

    def _open_connection(
        self,
        sock: socket.socket,
        addr,
        role: str = "normal",
        dialer: Dialer | None = None,
        tls_domain=None,
        logins: sasl.ListenerLogins | None = None,
    ) -> Conn:
        """Wrap a connected socket in a transport, connection and collector. Accepted
        sockets get a server transport; dialled ones (``dialer``) a client transport
        without SASL (the acceptor autodetects the plain AMQP header)."""
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = lib.pn_transport()
        if dialer is None:
            lib.pn_transport_set_server(transport)
            if tls_domain is not None:
                tls.secure(transport, tls_domain)
            # A SASL layer for clients that send the SASL header; clients that skip SASL are
            # accepted only where ANONYMOUS is (authentication not required there).
            sasl.secure(transport, logins or _ANONYMOUS, self.sasl_conf_dir if role == "normal" else None)
        elif dialer.tls_domain is not None:
            tls.secure(transport, dialer.tls_domain, dialer.tls_name)
        if self.idle_timeout_ms:
            lib.pn_transport_set_idle_timeout(transport, self.idle_timeout_ms)
        connection = lib.pn_connection()
        lib.pn_connection_set_container(connection, self._container)
        if dialer is not None:
            lib.pn_connection_set_hostname(connection, dialer.host.encode("utf-8"))
        collector = lib.pn_collector()
        lib.pn_connection_collect(connection, collector)
        lib.pn_transport_bind(transport, connection)
        self._last_conn_id += 1
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        conn = Conn(self._last_conn_id, sock, peer, transport, connection, collector)
        conn.tls = tls_domain is not None or (dialer is not None and dialer.tls_domain is not None)
        conn.authenticating = dialer is None and logins is not None and logins.checks_passwords
        self.conns[conn.fd] = conn
        self.sel.register(sock, READ, conn)
        now_ms = _mono_ms()
        if self.idle_timeout_ms:
            conn.handshake_at = now_ms + self.idle_timeout_ms
        if dialer is not None:
            self.engine.peers.start_connector(conn, dialer)
            self._redo.add(conn)  # our protocol header and open go out next iteration
            log.info("connection %d dialled to %s (connector %s)", conn.conn_id, peer, dialer.name)
        elif role == "inter-router":
            self.engine.peers.start_acceptor(conn)
            log.info("inter-router connection %d accepted from %s", conn.conn_id, peer)
        else:
            log.info("connection %d accepted from %s", conn.conn_id, peer)
        self._tick_one(conn, now_ms)
        return conn

    # ------------------------------------------------------------------ connectors
    def _dial(self, dialer: Dialer) -> None:
        """Start a non-blocking connect; _dial_done finishes it when the socket is writable."""
        dialer.retry_at = 0.0
        if self._phase != "running" or self.stop_requested:
            return
        try:
            family, type_, proto, _, address = socket.getaddrinfo(dialer.host, dialer.port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, type_, proto)
        except OSError as exc:
            self._dial_failed(dialer, f"cannot resolve or create a socket: {exc}")
            return
        sock.setblocking(False)
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY, errno.EINTR):
            sock.close()
            self._dial_failed(dialer, os.strerror(err))
            return
        dialer.sock = sock
        dialer.connect_by = time.monotonic() + self.handshake_timeout
        self.sel.register(sock, WRITE, dialer)

    def _dial_done(self, dialer: Dialer) -> None:
        sock = dialer.sock
        dialer.sock = None
        if sock is None:
            return
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            sock.close()
            self._dial_failed(dialer, os.strerror(err))
            return
        if self._phase != "running":
            sock.close()
            return
        try:
            self._open_connection(sock, (dialer.host, dialer.port), "inter-router", dialer)
        except Exception:
            log.exception("connector %s: could not set up the connection", dialer.name)
            sock.close()
            self._schedule_dial(dialer)

    def _dial_failed(self, dialer: Dialer, why: str) -> None:
        dialer.failures += 1
        level = logging.INFO if dialer.failures == 1 or dialer.failures % 30 == 0 else logging.DEBUG
        log.log(
            level,
            "connector %s: cannot connect to %s:%d: %s (attempt %d; next in %.1fs)",
            dialer.name,
            dialer.host,
            dialer.port,
            why,
            dialer.failures,
            dialer.delay,
        )
        self._schedule_dial(dialer)

    def _schedule_dial(self, dialer: Dialer) -> None:
        if self._phase != "running" or self.stop_requested:
            return
        dialer.retry_at = time.monotonic() + dialer.delay
        dialer.delay = min(dialer.delay * 2, dialer.max_delay)

    def _next_inter_router_deadline(self) -> float | None:
        """Earliest re-dial or handshake deadline, monotonic seconds."""
        times = [d.retry_at for d in self.dialers if d.retry_at]
        times += [d.connect_by for d in self.dialers if d.sock is not None]
        handshake = self.engine.peers.next_deadline()
        if handshake is not None:
            times.append(handshake)
        return min(times) if times else None

    def _inter_router_timers(self) -> None:
        now = time.monotonic()
        for dialer in self.dialers:
            if dialer.retry_at and now >= dialer.retry_at:
                self._dial(dialer)
            elif dialer.sock is not None and now >= dialer.connect_by:  # e.g. SYNs dropped
                sock, dialer.sock = dialer.sock, None
                try:
                    self.sel.unregister(sock)
                except (KeyError, ValueError):
                    pass
                sock.close()
                self._dial_failed(dialer, f"no connection within {self.handshake_timeout:g}s")
        peers = self.engine.peers
        if peers.handshakes:
            deadline = peers.next_deadline()
            if deadline is not None and now >= deadline:
                peers.expire(now)  # touched connections are drained by _process

    def _read(self, conn: Conn) -> None:
        """What the socket has, into the transport (compiled: fastpath.read_into, which
        takes the same steps as the rest of this method)."""
        if _read_into is not None:
            try:
                n = _read_into(conn.transport_address, conn.fd, IO_SIZE)
            except OSError as exc:
                self._socket_failed(conn, "read", exc)
                return
            if n >= 0:  # bytes read (now processed), or nothing to read now
                return
            if n == fastpath.IO_EOF:
                lib.pn_transport_close_tail(conn.transport)
                self._tail_closed(conn)
            elif not conn.tail_closed:  # IO_CLOSED: the transport takes no more input
                self._tail_closed(conn)
            return
        transport = conn.transport
        capacity = _transport_capacity(transport)
        if capacity <= 0:
            if capacity < 0 and not conn.tail_closed:
                self._tail_closed(conn)
            return
        try:
            n = conn.sock.recv_into(self._rbuf, min(capacity, IO_SIZE))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._socket_failed(conn, "read", exc)
            return
        if n == 0:
            lib.pn_transport_close_tail(transport)
            self._tail_closed(conn)
            return
        _transport_push(transport, self._rcdata, n)

    def _write(self, conn: Conn) -> None:
        transport = conn.transport
        if conn.authenticating and sasl.login_failed(transport):
            self._hold_answer(conn)
            return
        sock = conn.sock
        feeds = 0  # rounds of large-message pieces this call (a few, then the others' turn)
        while True:
            # Compiled: every send until the transport has nothing more or the socket
            # takes less, in one call (fastpath.write_out); the branches below then see
            # pending < 0, pending == 0 or a short send as the Python loop does.
            if _write_out is not None:
                try:
                    status = _write_out(conn.transport_address, conn.fd, IO_SIZE)
                except OSError as exc:
                    self._socket_failed(conn, "write", exc)
                    return
                pending = -1 if status == fastpath.IO_CLOSED else 0
                if status == fastpath.IO_BLOCKED:
                    if not conn.want_write:
                        conn.want_write = True
                        self._update_interest(conn)
                    break
            else:
                pending = _transport_pending(transport)
            if pending < 0:  # our side is done (close sent or transport error)
                if not conn.head_closed:
                    conn.head_closed = True
                    try:
                        sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    if not conn.tail_closed:  # don't wait for the peer's half of the close
                        lib.pn_transport_close_tail(transport)
                        self._tail_closed(conn)
                    self._redo.add(conn)
                break
            if pending == 0:
                # Everything written: feed the next pieces of large messages, if any
                # (router/adapter/streaming.py), and write again.
                if conn.streaming:
                    if feeds == MAX_FEEDS_PER_WRITE:
                        self._redo.add(conn)  # more to go: on the next round of the loop
                    elif self._feed_streams(conn):
                        feeds += 1
                        continue
                if conn.want_write:
                    conn.want_write = False
                    self._update_interest(conn)
                break
            n = pending if pending < IO_SIZE else IO_SIZE
            _transport_peek(transport, self._wcdata, n)
            try:
                sent = sock.send(self._wview[:n])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._socket_failed(conn, "write", exc)
                return
            if sent:
                _transport_pop(transport, sent)
            if sent < n:
                if not conn.want_write:
                    conn.want_write = True
                    self._update_interest(conn)
                break
        if _collector_peek(conn.collector) != NULL:
            self._redo.add(conn)

    @staticmethod
    def _feed_streams(conn: Conn) -> bool:
        """Feed each link's large messages a budget's worth; True when bytes moved."""
        moved = 0
        for link in list(conn.streaming):
            moved += streaming.feed(link, streaming.FEED_BUDGET)
        return moved > 0

    def _io_failed(self, conn: Conn, what: str) -> None:
        """A bug while moving bytes for one connection: drop that connection only."""
        log.exception("connection %d (%s): error while %s; dropping it", conn.conn_id, conn.peer, what)
        try:
            self._cut(conn)
        except Exception:
            log.exception("connection %d: could not cut it cleanly", conn.conn_id)
            try:
                self.engine.AMQP_connection_lost(conn)
            finally:
                conn.dead = True
                self._redo.add(conn)

    def _socket_failed(self, conn: Conn, what: str, exc: OSError) -> None:
        """A read or write on the socket failed (reset, broken pipe, ...): the connection ends."""
        log.info("connection %d (%s): %s failed: %s", conn.conn_id, conn.peer, what, exc)
        self._cut(conn)

    def _tail_closed(self, conn: Conn) -> None:
        conn.tail_closed = True
        self._update_interest(conn)
        self._redo.add(conn)

    def _cut(self, conn: Conn) -> None:
        """The socket failed: close both ends of the transport (the engine then reports
        the connection lost)."""
        transport = conn.transport
        if not conn.tail_closed:
            lib.pn_transport_close_tail(transport)
            conn.tail_closed = True
        if not conn.head_closed:
            lib.pn_transport_close_head(transport)
            conn.head_closed = True
        self._update_interest(conn)
        self._redo.add(conn)

    def _update_interest(self, conn: Conn) -> None:
        mask = (0 if conn.tail_closed else READ) | (WRITE if conn.want_write and not conn.head_closed else 0)
        try:
            if mask:
                self.sel.modify(conn.sock, mask, conn)
            else:
                self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            if mask:
                self.sel.register(conn.sock, mask, conn)

    def _teardown(self, conn: Conn) -> None:
        """Free everything of a closed connection (the engine already told the core).
        Once only: a connection torn down in one iteration can still be in the next
        one's active set, and its fd may by then belong to a newly accepted one."""
        if self.conns.get(conn.fd) is not conn:
            return
        del self.conns[conn.fd]
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        name, desc = condition_of(lib.pn_transport_condition(conn.transport))
        transport, connection, collector = conn.transport, conn.connection, conn.collector
        conn.transport = conn.connection = conn.collector = None
        conn.transport_address = 0  # the compiled I/O refuses it (ValueError) rather than touch freed memory
        lib.pn_transport_unbind(transport)
        lib.pn_connection_collect(connection, NULL)
        lib.pn_connection_release(connection)
        lib.pn_decref(connection)
        lib.pn_decref(transport)
        lib.pn_collector_free(collector)
        if name and name != "amqp:connection:framing-error":
            log.info("connection %d (%s) closed: %s: %s", conn.conn_id, conn.peer, printable(name), printable(desc))
        else:
            log.info("connection %d (%s) closed", conn.conn_id, conn.peer)
        dialer = conn.ir.dialer if conn.ir is not None else None
        if dialer is not None:  # re-dial (quickly if it had come up: Dialer.connected())
            self._schedule_dial(dialer)

    # ------------------------------------------------------------------ timers
    def _tick(self, active: set) -> None:
        """Run pn_transport_tick for every connection whose deadline has come (idle
        timeout detection, keepalive frames). Deadlines sit in a heap; an entry is
        stale when the connection's deadline moved since it was pushed."""
        now_ms = _mono_ms()
        heap = self._tick_heap
        while heap and heap[0][0] <= now_ms:
            deadline, _, conn = heapq.heappop(heap)
            if conn.dead or conn.tick_at != deadline or self.conns.get(conn.fd) is not conn:
                continue
            conn.tick_at = 0  # its entry is gone: whatever deadline comes back is pushed
            self._tick_one(conn, now_ms)
            active.add(conn)
        self._next_tick = heap[0][0] if heap else 0

    def _tick_one(self, conn: Conn, now_ms: int) -> None:
        deadline = lib.pn_transport_tick(conn.transport, now_ms)
        if conn.handshake_at:
            # Proton's idle timer only runs once the AMQP layer is up (after the
            # protocol header and SASL): until then, a silent peer is ours to cut.
            if deadline:
                conn.handshake_at = 0
            elif now_ms >= conn.handshake_at:
                conn.handshake_at = 0
                log.info("connection %d (%s): no AMQP open within the idle timeout", conn.conn_id, conn.peer)
                cond = lib.pn_transport_condition(conn.transport)
                lib.pn_condition_set_name(cond, b"amqp:resource-limit-exceeded")
                lib.pn_condition_set_description(cond, b"no AMQP open within the idle timeout")
                self._cut(conn)
            else:
                deadline = conn.handshake_at
        if deadline != conn.tick_at:
            conn.tick_at = deadline
            if deadline:
                heapq.heappush(self._tick_heap, (deadline, conn.conn_id, conn))
                if not self._next_tick or deadline < self._next_tick:
                    self._next_tick = deadline

    # ------------------------------------------------------------------ shutdown
    def _begin_drain(self) -> None:
        log.info("shutdown requested: draining (grace %.1fs)", self.drain_grace)
        for dialer in self.dialers:  # no new inter-router connections; live ones keep working
            dialer.retry_at = 0.0
            if dialer.sock is not None:
                try:
                    self.sel.unregister(dialer.sock)
                except (KeyError, ValueError):
                    pass
                dialer.sock.close()
                dialer.sock = None
        for lst in self.listeners:
            if lst.sock is not None:
                try:
                    self.sel.unregister(lst.sock)
                except (KeyError, ValueError):
                    pass
                lst.sock.close()
                lst.sock = None
        self._phase = "draining"
        self._phase_deadline = time.time() + self.drain_grace + SHUTDOWN_SLACK
        self._core_timer(ShutdownRequested(grace=self.drain_grace))

    def _advance_shutdown(self, now: float) -> bool:
        """Returns True once the process may exit."""
        if self._phase == "draining":
            if not self.engine.shutdown_complete and now < self._phase_deadline:
                return False
            if not self.engine.shutdown_complete:
                log.warning("the core did not complete its shutdown in time; closing anyway")
            self._phase = "closing"
            self._phase_deadline = now + CLOSE_WAIT
            for conn in list(self.conns.values()):
                self.engine.close_connection(conn, None, None)
            self._redo |= self.engine.touched
            self.engine.touched.clear()
            if self.conns:
                return False
        if self._phase == "closing":
            if self.conns and now < self._phase_deadline:
                return False
            for conn in list(self.conns.values()):
                if not conn.lost:
                    self.engine.AMQP_connection_lost(conn)
                self._teardown(conn)
            self.eventlog.flush()
            self._phase = "done"
            log.info("shutdown complete")
            return True
        return True

    def close(self) -> None:
        """Release every socket and proton object (after run() returned)."""
        for conn in list(self.conns.values()):
            conn.dead = True
            self._teardown(conn)
        for lst in self.listeners:
            if lst.sock is not None:
                lst.sock.close()
                lst.sock = None
        for dialer in self.dialers:
            if dialer.sock is not None:
                dialer.sock.close()
                dialer.sock = None
        for wake in (self._wake_r, self._wake_w):
            if wake is not None:
                wake.close()
        self._wake_r = self._wake_w = None
        self.sel.close()

    def call_in_loop(self, fn: Callable[[], Any], timeout: float) -> Any:
        """(From another thread.) Run ``fn`` on the loop's thread, between two
        iterations, and return its result; TimeoutError when the loop does not get
        to it within ``timeout`` seconds (a stuck loop: /healthz says so)."""
        done: Future = Future()
        self._calls.append((fn, done))
        wake = self._wake_w
        if wake is not None:
            try:
                wake.send(b"\0")
            except (BlockingIOError, InterruptedError):
                pass  # the socket is full of wake-ups already: the loop will look
        return done.result(timeout)

    def _run_calls(self) -> None:
        calls = self._calls
        while calls:
            fn, done = calls.popleft()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller's thread, which reports it
                done.set_exception(exc)

    def _drain_wakeup(self) -> None:
        wake = self._wake_r
        if wake is None:
            return
        try:
            while wake.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass


def _mono_ms() -> int:
    return int(time.monotonic() * 1000)


__all__ = ["Server", "Listener", "Dialer"]
