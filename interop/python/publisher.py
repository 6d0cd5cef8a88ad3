#!/usr/bin/env python3
"""Reference publisher on python-qpid-proton (MessagingHandler). Contract: interop/clientkit.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # for clientkit
import clientkit  # noqa: E402
import security  # noqa: E402  (interop/python/security.py, beside this file)
from cproton import ffi, lib  # noqa: E402
from proton import Delivery, Message  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container  # noqa: E402


def raw_tag(dlv) -> bytes:
    """A delivery's tag as bytes (proton-python 0.40's ``Delivery.tag`` decodes it as UTF-8)."""
    tag = lib.pn_delivery_tag(dlv._impl)
    return bytes(ffi.unpack(tag.start, tag.size))


NAMES = {
    Delivery.ACCEPTED: "accepted",
    Delivery.REJECTED: "rejected",
    Delivery.RELEASED: "released",
    Delivery.MODIFIED: "modified",
}


class Publisher(MessagingHandler):
    def __init__(self, a):
        # auto_settle: proton's own default (settle once the router settled) for --settle default
        super().__init__(auto_settle=(a.settle == "default"))
        self.a = a
        self.ledger = clientkit.Ledger(a)
        self.next_seq = a.first_seq
        self.last_seq = a.first_seq + a.count - 1
        self.outcomes = 0
        self.counts: dict[str, int] = {}
        self.last_progress = time.monotonic()
        self.exit_code = 3
        self.error = None

    def on_start(self, event):
        self.conn = event.container.connect(security.url(self.a), reconnect=False, **security.connect_options(self.a))
        opts = None
        if self.a.settle == "presettled":
            from proton.reactor import AtMostOnce

            opts = AtMostOnce()
        self.sender = event.container.create_sender(self.conn, self.a.topic, name=self.a.link, options=opts)
        self.timer = event.container.schedule(0.25, self)

    def on_link_opened(self, event):
        self.ledger.incarnation = clientkit.incarnation_of(event.link.remote_properties)

    def on_timer_task(self, event):
        if time.monotonic() - self.last_progress > self.a.timeout:
            self.error = f"no progress for {self.a.timeout} s"
            self.finish(3)
            return
        self.timer = event.container.schedule(0.25, self)

    def on_sendable(self, event):
        while self.sender.credit and self.next_seq <= self.last_seq:
            seq = self.next_seq
            self.next_seq += 1
            tag = str(seq).encode()
            body = clientkit.body(self.a.topic, seq, self.a.size)
            msg = Message(body=body, properties={"seq": seq})
            self.ledger.write("sent", seq=seq, pub_tag=tag, digest=clientkit.digest(body), size=len(body))
            self.sender.send(msg, tag=tag)
            self.last_progress = time.monotonic()
        if self.a.settle == "presettled" and self.next_seq > self.last_seq:
            self.finish(0)

    def _outcome(self, event):
        dlv = event.delivery
        tag = raw_tag(dlv)
        seq = int(tag)
        name = NAMES.get(dlv.remote_state, str(dlv.remote_state))
        cond = dlv.remote.condition
        self.ledger.write("outcome", seq=seq, pub_tag=tag, outcome=name, condition=cond.name if cond is not None else None)
        if self.a.settle == "on-outcome":
            dlv.settle()
        self.outcomes += 1
        self.counts[name] = self.counts.get(name, 0) + 1
        self.last_progress = time.monotonic()
        if self.a.disconnect_after and self.outcomes >= self.a.disconnect_after:
            clientkit.summary(
                stack="python", role="publisher", sent=self.next_seq - self.a.first_seq, outcomes=self.counts, crashed=True
            )
            clientkit.crash(self.ledger)
        if self.outcomes >= self.a.count:
            self.finish(0)

    on_accepted = on_rejected = on_released = _outcome

    def on_transport_error(self, event):
        cond = event.transport.condition
        self.error = f"transport: {cond.name if cond else '?'}: {cond.description if cond else ''}"

    def on_link_error(self, event):
        cond = event.link.remote_condition
        self.error = f"link: {cond.name}: {cond.description}"
        self.finish(1)

    def on_connection_error(self, event):
        cond = event.connection.remote_condition
        self.error = f"connection: {cond.name}: {cond.description}"
        self.finish(1)

    def on_disconnected(self, event):
        if self.exit_code == 3 and self.error is None:
            self.error = "disconnected"
        if self.exit_code == 3:
            self.finish(1)

    def finish(self, code):
        self.exit_code = code
        self.timer.cancel()
        if self.conn.state & self.conn.LOCAL_ACTIVE:
            self.conn.close()


def main() -> int:
    a = clientkit.parse("publisher", stack="python", extra=[("--first-seq", int, 1)])
    handler = Publisher(a)
    try:
        Container(handler, container_id=a.container_id).run()
    except KeyboardInterrupt:
        pass
    clientkit.summary(
        stack="python", role="publisher", sent=handler.next_seq - a.first_seq, outcomes=handler.counts, error=handler.error
    )
    return handler.exit_code


if __name__ == "__main__":
    sys.exit(main())
