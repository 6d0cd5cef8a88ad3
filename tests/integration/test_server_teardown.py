"""Server._teardown runs once per connection, even when the connection's fd has
been reused by a newer one (a dead connection can still be in the next loop
iteration's active set; accepting first can hand its fd to a new socket)."""

from __future__ import annotations

import socket

from router.adapter.server import Server


class FakeCore:
    def handle(self, event, now):
        return []

    def next_deadline(self):
        return None


class FakeLog:
    epoch = 1
    boot_id = "boot-A"

    def append(self, kind, ts, fields):
        pass

    def flush(self):
        pass


def test_a_second_teardown_leaves_the_connection_that_reused_the_fd_alone():
    server = Server(router_id="A", core=FakeCore(), eventlog=FakeLog(), listeners=[], max_message_size=1 << 20)
    peers = []
    try:
        a, peer = socket.socketpair()
        peers.append(peer)
        old = server._open_connection(a, ("127.0.0.1", 1))
        fd = old.fd
        old.dead = True
        server._teardown(old)
        assert fd not in server.conns and old.transport is None
        b, peer = socket.socketpair()  # the lowest free fd: the one just closed
        peers.append(peer)
        if b.fileno() != fd:  # not reused here after all: make it so
            replacement = socket.socket(fileno=socket.dup(b.fileno()))
            b.close()
            b = replacement
            if b.fileno() != fd:
                b.close()
                raise AssertionError("could not reuse the fd")
        new = server._open_connection(b, ("127.0.0.1", 2))
        assert new.fd == fd and server.conns[fd] is new
        server._teardown(old)  # again, as the next iteration would
        assert server.conns[fd] is new and new.transport is not None
    finally:
        server.close()
        for peer in peers:
            peer.close()
