"""The compiled socket I/O (router/adapter/_fastpath.c: read_into and write_out, which
server.py's _read and _write take when built) against what the Python loops do: real
non-blocking sockets, real proton transports. The bytes a transport has to send reach
the peer whole and in order, whatever the socket takes per send; what the socket has
reaches the transport and is processed; a closed peer, a transport that takes no more
and a socket error each come back as the Python loop sees them."""

from __future__ import annotations

import errno
import socket

import pytest
from cproton_ffi import ffi, lib
from hypothesis import given, settings
from hypothesis import strategies as st

from router.adapter import fastpath

pytestmark = pytest.mark.skipif(fastpath.read_into is None, reason=f"compiled fast path not in use: {fastpath.status}")


class Side:
    """A proton connection on a transport, with a collector: the router's end or a client's."""

    def __init__(self, server: bool, container: str):
        self.transport = lib.pn_transport()
        if server:
            lib.pn_transport_set_server(self.transport)
        self.connection = lib.pn_connection()
        lib.pn_connection_set_container(self.connection, container.encode())
        self.collector = lib.pn_collector()
        lib.pn_connection_collect(self.connection, self.collector)
        lib.pn_transport_bind(self.transport, self.connection)
        self.address = int(ffi.cast("uintptr_t", self.transport))

    def events(self) -> list[int]:
        seen = []
        while (event := lib.pn_collector_peek(self.collector)) != ffi.NULL:
            seen.append(lib.pn_event_type(event))
            lib.pn_collector_pop(self.collector)
        return seen

    def pending_bytes(self) -> bytes:
        """What the transport has to send, read without taking it (the Python loop's peek)."""
        n = lib.pn_transport_pending(self.transport)
        if n <= 0:
            return b""
        buf = ffi.new("char[]", n)
        assert lib.pn_transport_peek(self.transport, buf, n) == n
        return ffi.buffer(buf, n)[:]

    def take_all(self) -> bytes:
        """Everything it has to send, taken as the Python loop takes it (peek, pop)."""
        out = b""
        while chunk := self.pending_bytes():
            lib.pn_transport_pop(self.transport, len(chunk))
            out += chunk
        return out

    def free(self) -> None:
        lib.pn_transport_unbind(self.transport)
        lib.pn_connection_collect(self.connection, ffi.NULL)
        lib.pn_connection_release(self.connection)
        lib.pn_decref(self.transport)
        lib.pn_collector_free(self.collector)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    router, client = Side(True, "router"), Side(False, "client")
    yield a, b, router, client
    for s in (a, b):
        s.close()
    router.free()
    client.free()


def _drain(sock: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return got
        if not chunk:
            return got
        got += chunk


def _open_with_properties(side: Side, size: int) -> None:
    """An open frame of about ``size`` bytes (a large property), so that there is
    more to send than a small socket buffer takes."""
    data = lib.pn_connection_properties(side.connection)
    lib.pn_data_put_map(data)
    lib.pn_data_enter(data)
    for put, text in ((lib.pn_data_put_symbol, b"pad"), (lib.pn_data_put_string, b"x" * size)):
        chars = ffi.new("char[]", text)
        put(data, ffi.new("pn_bytes_t *", {"size": len(text), "start": chars})[0])
    lib.pn_data_exit(data)
    lib.pn_connection_open(side.connection)


@settings(max_examples=25, deadline=None)
@given(size=st.sampled_from([0, 100, 70_000, 400_000]), most=st.sampled_from([1, 7, 4096, 256 * 1024]))
def test_what_the_transport_has_to_send_reaches_the_peer_whole(size, most):
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    sender, receiver = Side(False, "client"), Side(True, "router")  # a client speaks first
    twin = Side(False, "client")  # the same state, its bytes taken by the Python loop's steps
    try:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        _open_with_properties(sender, size)
        _open_with_properties(twin, size)
        expected = twin.take_all()
        assert len(expected) > size
        got = b""
        for _ in range(100_000):
            status = fastpath.write_out(sender.address, a.fileno(), most)
            got += _drain(b)
            if status == fastpath.IO_NOTHING:
                break
            assert status == fastpath.IO_BLOCKED  # the socket took less: the loop waits for it
        got += _drain(b)
        assert got == expected
        assert lib.pn_transport_pending(sender.transport) == 0
        if size <= 100:  # (a larger open frame is past what a peer takes before the open: a framing error)
            # The peer's transport reads it as the open it is.
            assert lib.pn_transport_push(receiver.transport, got, len(got)) == len(got)
            assert lib.PN_CONNECTION_REMOTE_OPEN in receiver.events()
    finally:
        a.close()
        b.close()
        for side in (sender, receiver, twin):
            side.free()


def test_what_the_socket_has_reaches_the_transport_and_is_processed(pair):
    a, b, router, client = pair
    assert fastpath.read_into(router.address, a.fileno(), 1 << 18) == fastpath.IO_NOTHING  # nothing yet
    lib.pn_connection_open(client.connection)
    sent = client.pending_bytes()
    b.sendall(sent)
    lib.pn_transport_pop(client.transport, len(sent))
    total = 0
    while total < len(sent):  # a few bytes a call: the rest waits in the socket
        n = fastpath.read_into(router.address, a.fileno(), 5)
        assert 0 < n <= 5
        total += n
    assert total == len(sent)
    assert lib.PN_CONNECTION_REMOTE_OPEN in router.events()
    assert fastpath.read_into(router.address, a.fileno(), 1 << 18) == fastpath.IO_NOTHING


def test_a_peer_that_closed_is_an_end_of_file(pair):
    a, b, router, _ = pair
    b.close()
    assert fastpath.read_into(router.address, a.fileno(), 1 << 18) == fastpath.IO_EOF


def test_a_transport_that_takes_no_more_input_says_so(pair):
    a, b, router, _ = pair
    lib.pn_transport_close_tail(router.transport)
    b.send(b"AMQP")
    assert fastpath.read_into(router.address, a.fileno(), 1 << 18) == fastpath.IO_CLOSED


def test_a_transport_done_sending_says_so(pair):
    a, _, router, _ = pair
    lib.pn_transport_close_head(router.transport)
    assert fastpath.write_out(router.address, a.fileno(), 1 << 18) == fastpath.IO_CLOSED


def test_a_socket_error_is_the_oserror_the_python_loop_catches(pair):
    a, b, router, client = pair
    lib.pn_connection_open(client.connection)
    assert lib.pn_transport_pending(client.transport) > 0
    a.close()
    # A peer gone: EPIPE, an exception (never a SIGPIPE, which would end the process).
    with pytest.raises(OSError) as raised:
        fastpath.write_out(client.address, b.fileno(), 1 << 18)
    assert raised.value.errno in (errno.EPIPE, errno.ECONNRESET)
    c, d = socket.socketpair()
    c.close()
    with pytest.raises(OSError) as raised:
        fastpath.read_into(router.address, c.fileno() if c.fileno() >= 0 else 10**6, 1 << 18)
    assert raised.value.errno == errno.EBADF
    d.close()


def test_a_connection_torn_down_is_refused_not_touched(pair):
    a, _, _, _ = pair
    # server.py zeroes a torn-down connection's transport address: a call that still
    # came would otherwise use freed memory.
    for call in (fastpath.read_into, fastpath.write_out):
        with pytest.raises(ValueError):
            call(0, a.fileno(), 1 << 18)


def test_no_more_is_read_than_the_transport_has_room_for(pair):
    a, b, router, _ = pair
    room = lib.pn_transport_capacity(router.transport)
    assert room > 0
    b.sendall(b"AMQP\x00\x01\x00\x00" + b"\x00" * (room + 10_000))
    n = fastpath.read_into(router.address, a.fileno(), 1 << 20)
    assert 0 < n <= room  # the rest stays in the socket until the transport has room
