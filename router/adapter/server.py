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
"""

from __future__ import annotations

import heapq
import logging
import selectors
import socket
import time

from cproton_ffi import ffi, lib

from router.adapter.endpoints import Conn, condition_of
from router.adapter.engine import Engine
from router.core.events import ShutdownRequested, TimerFired

log = logging.getLogger("eorouter.server")

NULL = ffi.NULL
READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
IO_SIZE = 256 * 1024
ACCEPT_BATCH = 64
CLOSE_WAIT = 3.0  # how long closing connections get to finish their close handshake
SHUTDOWN_SLACK = 5.0  # beyond the drain grace, how long we wait for the core's ShutdownComplete

_LISTENER = object()
_WAKEUP = object()

_transport_capacity = lib.pn_transport_capacity
_transport_push = lib.pn_transport_push
_transport_pending = lib.pn_transport_pending
_transport_peek = lib.pn_transport_peek
_transport_pop = lib.pn_transport_pop
_collector_peek = lib.pn_collector_peek


class Listener:
    __slots__ = ("host", "port", "role", "sock")

    def __init__(self, host: str, port: int, role: str = "client"):
        self.host = host
        self.port = port
        self.role = role
        self.sock: socket.socket | None = None


class Server:
    """Owns the sockets and the proton objects; the Engine translates, the core decides."""

    def __init__(self, *, router_id: str, core, eventlog, listeners, max_message_size: int,
                 idle_timeout: float = 0.0, drain_grace: float = 5.0):
        self.router_id = router_id
        self.core = core
        self.eventlog = eventlog
        self.listeners = [Listener(item.host, item.port, getattr(item, "role", "client"))
                          for item in listeners]
        self.idle_timeout_ms = int(max(0.0, idle_timeout) * 1000)
        self.drain_grace = drain_grace
        self.engine = Engine(core, eventlog, max_message_size=max_message_size)
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
        self._tick_heap: list = []  # (deadline ms, conn_id, Conn)
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
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
            sock = socket.socket(socket.AF_INET6 if ":" in lst.host else socket.AF_INET,
                                 socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((lst.host, lst.port))
            sock.listen(128)
            sock.setblocking(False)
            lst.sock = sock
            lst.port = sock.getsockname()[1]
            self.sel.register(sock, READ, _LISTENER)
            bound.append((lst.host, lst.port))
            log.info("listening on %s:%d (%s)", lst.host, lst.port, lst.role)
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
        eventlog = self.eventlog
        try:
            while True:
                timeout = self._timeout()
                ready = self.sel.select(timeout)
                now = time.time()
                engine.now = now
                if self.hard_stop:
                    # Exit 0 only when nothing was cut short: the core had answered
                    # every publisher delivery already.
                    log.warning("second signal: exiting now")
                    return 0 if self.engine.shutdown_complete else 1
                active = self._redo
                self._redo = set()
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
                if self._next_tick:
                    self._tick(active)
                if self.stop_requested and self._phase == "running":
                    self._begin_drain()
                deadline = self.core.next_deadline()
                if deadline is not None and now >= deadline:
                    self._core_timer(TimerFired())
                self._process(active)
                eventlog.flush()
                for conn in active:
                    if not conn.dead:
                        try:
                            self._write(conn)
                        except Exception:
                            self._io_failed(conn, "writing")
                for conn in active:
                    if conn.dead:
                        self._teardown(conn)
                if self._phase != "running" and self._advance_shutdown(now):
                    return 0
        finally:
            eventlog.flush()

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
        opened = engine.opened
        if opened:  # the peer's open frame set its idle timeout: schedule keepalives
            now_ms = _mono_ms()
            for conn in opened:
                if not conn.dead:
                    self._tick_one(conn, now_ms)
            opened.clear()

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
                self._open_connection(sock, addr)
            except Exception:
                log.exception("could not set up a connection from %s", addr)
                sock.close()

    def _open_connection(self, sock: socket.socket, addr) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = lib.pn_transport()
        lib.pn_transport_set_server(transport)
        # SASL layer for clients that send the SASL header; clients that skip SASL are
        # still accepted because authentication is not required.
        sasl = lib.pn_sasl(transport)
        lib.pn_sasl_allowed_mechs(sasl, b"ANONYMOUS")
        if self.idle_timeout_ms:
            lib.pn_transport_set_idle_timeout(transport, self.idle_timeout_ms)
        connection = lib.pn_connection()
        lib.pn_connection_set_container(connection, self._container)
        collector = lib.pn_collector()
        lib.pn_connection_collect(connection, collector)
        lib.pn_transport_bind(transport, connection)
        self._last_conn_id += 1
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        conn = Conn(self._last_conn_id, sock, peer, transport, connection, collector)
        self.conns[conn.fd] = conn
        self.sel.register(sock, READ, conn)
        now_ms = _mono_ms()
        if self.idle_timeout_ms:
            conn.handshake_at = now_ms + self.idle_timeout_ms
        self._tick_one(conn, now_ms)
        log.info("connection %d accepted from %s", conn.conn_id, peer)

    def _read(self, conn: Conn) -> None:
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
            log.info("connection %d (%s): read failed: %s", conn.conn_id, conn.peer, exc)
            self._cut(conn)
            return
        if n == 0:
            lib.pn_transport_close_tail(transport)
            self._tail_closed(conn)
            return
        _transport_push(transport, self._rcdata, n)

    def _write(self, conn: Conn) -> None:
        transport = conn.transport
        sock = conn.sock
        while True:
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
                log.info("connection %d (%s): write failed: %s", conn.conn_id, conn.peer, exc)
                self._cut(conn)
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
        mask = (0 if conn.tail_closed else READ) | (WRITE if conn.want_write and not conn.head_closed
                                                   else 0)
        try:
            if mask:
                self.sel.modify(conn.sock, mask, conn)
            else:
                self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            if mask:
                self.sel.register(conn.sock, mask, conn)

    def _teardown(self, conn: Conn) -> None:
        """Free everything of a closed connection (the engine already told the core)."""
        if self.conns.pop(conn.fd, None) is None:
            return
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        name, desc = condition_of(lib.pn_transport_condition(conn.transport))
        transport, connection, collector = conn.transport, conn.connection, conn.collector
        conn.transport = conn.connection = conn.collector = None
        lib.pn_transport_unbind(transport)
        lib.pn_connection_collect(connection, NULL)
        lib.pn_connection_release(connection)
        lib.pn_decref(connection)
        lib.pn_decref(transport)
        lib.pn_collector_free(collector)
        if name and name != "amqp:connection:framing-error":
            log.info("connection %d (%s) closed: %s: %s", conn.conn_id, conn.peer, name, desc)
        else:
            log.info("connection %d (%s) closed", conn.conn_id, conn.peer)

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
                log.info("connection %d (%s): no AMQP open within the idle timeout", conn.conn_id,
                         conn.peer)
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
        if self._wake_r is not None:
            self._wake_r.close()
            self._wake_w.close()
            self._wake_r = self._wake_w = None
        self.sel.close()

    def _drain_wakeup(self) -> None:
        try:
            while self._wake_r.recv(512):
                pass
        except (BlockingIOError, InterruptedError):
            pass


def _mono_ms() -> int:
    return int(time.monotonic() * 1000)


__all__ = ["Server", "Listener"]
