#!/usr/bin/env python3
"""Reference subscriber on python-qpid-proton (MessagingHandler). Contract: interop/clientkit.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # for clientkit
import clientkit  # noqa: E402
import security  # noqa: E402  (interop/python/security.py, beside this file)
from cproton import ffi, lib  # noqa: E402
from proton import Condition, Delivery, Link  # noqa: E402
from proton.handlers import MessagingHandler  # noqa: E402
from proton.reactor import Container, LinkOption, Selector  # noqa: E402

NAMES = {
    Delivery.ACCEPTED: "accepted",
    Delivery.REJECTED: "rejected",
    Delivery.RELEASED: "released",
    Delivery.MODIFIED: "modified",
}


def raw_tag(dlv) -> bytes:
    """A delivery's tag as bytes (proton-python 0.40's ``Delivery.tag`` decodes it as UTF-8)."""
    tag = lib.pn_delivery_tag(dlv._impl)
    return bytes(ffi.unpack(tag.start, tag.size))


class SettleModes(LinkOption):
    def __init__(self, a):
        self.a = a

    def apply(self, link: Link) -> None:
        link.snd_settle_mode = Link.SND_SETTLED if self.a.snd_settle_mode == "settled" else Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_SECOND if self.a.rcv_settle_mode == "second" else Link.RCV_FIRST


class Subscriber(MessagingHandler):
    def __init__(self, a):
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.a = a
        self.ledger = clientkit.Ledger(a)
        self.received = 0
        self.answered = 0
        self.awaiting: dict[bytes, int] = {}  # rcv second: tag -> seq, answered, not yet settled by the router
        self.last_progress = time.monotonic()
        self.exit_code = 3
        self.error = None
        self.done_at = None

    def on_start(self, event):
        self.conn = event.container.connect(security.url(self.a), reconnect=False, **security.connect_options(self.a))
        options = [SettleModes(self.a)] + ([Selector(self.a.selector)] if self.a.selector else [])
        self.receiver = event.container.create_receiver(self.conn, self.a.topic, name=self.a.link, options=options)
        self.timer = event.container.schedule(0.1, self)

    def on_link_opened(self, event):
        if event.link is self.receiver or event.link.name == self.a.link:
            event.link.flow(self.a.credit)
            clientkit.ready()

    def on_timer_task(self, event):
        now = time.monotonic()
        if self.done_at is not None:
            if now - self.done_at >= self.a.linger:
                self.finish(0)
                return
        elif now - self.last_progress > self.a.timeout:
            self.error = f"no progress for {self.a.timeout} s"
            self.finish(3)
            return
        self.timer = event.container.schedule(0.1, self)

    def on_message(self, event):
        dlv = event.delivery
        tag = raw_tag(dlv)
        msg = event.message
        seq = clientkit.seq_from(msg.properties, msg.body)
        size = len(msg.body) if isinstance(msg.body, (str, bytes)) else None
        self.received += 1
        self.last_progress = time.monotonic()
        self.receiver.flow(1)  # keep the credit window
        dig = clientkit.digest(msg.body) if isinstance(msg.body, (str, bytes)) else None
        if self.a.disconnect_after and self.received >= self.a.disconnect_after:
            self.ledger.write("delivered", seq=seq, delivery=tag, digest=dig, size=size)
            clientkit.summary(stack="python", role="subscriber", received=self.received, crashed=True)
            clientkit.crash(self.ledger)
        if dlv.settled:  # pre-settled by the router (at-most-once)
            self.ledger.write("delivered", seq=seq, delivery=tag, digest=dig, size=size, presettled=True)
            dlv.settle()
        elif self.a.outcome == "hold":
            self.ledger.write("delivered", seq=seq, delivery=tag, digest=dig, size=size, held=True)
        else:
            word = clientkit.OUTCOME_WORD[self.a.outcome]
            self.ledger.write("delivered", seq=seq, delivery=tag, outcome=word, digest=dig, size=size)
            if self.a.outcome == "reject":
                dlv.local.condition = Condition("interop:rejected", "the interop subscriber rejects")
                dlv.update(Delivery.REJECTED)
            elif self.a.outcome == "release":
                dlv.update(Delivery.RELEASED)
            elif self.a.outcome == "modify":
                dlv.local.failed = True
                dlv.update(Delivery.MODIFIED)
            else:
                dlv.update(Delivery.ACCEPTED)
            if self.a.rcv_settle_mode == "second":
                self.awaiting[tag] = seq
            else:
                dlv.settle()
        self.answered += 1
        self.check_done()

    def on_settled(self, event):
        """The router settled a delivery (rcv-settle-mode=second): settle ours."""
        dlv = event.delivery
        tag = raw_tag(dlv)
        if tag in self.awaiting:
            seq = self.awaiting.pop(tag)
            name = NAMES.get(dlv.remote_state)
            self.ledger.write("settled", seq=seq, delivery=tag, outcome=name)
            dlv.settle()
            self.last_progress = time.monotonic()
            self.check_done()

    def check_done(self):
        if self.done_at is None and self.received >= self.a.count and not self.awaiting:
            self.done_at = time.monotonic()

    def on_link_error(self, event):
        cond = event.link.remote_condition
        self.error = f"link: {cond.name}: {cond.description}"
        self.finish(1)

    def on_connection_error(self, event):
        cond = event.connection.remote_condition
        self.error = f"connection: {cond.name}: {cond.description}"
        self.finish(1)

    def on_transport_error(self, event):
        cond = event.transport.condition
        self.error = f"transport: {cond.name if cond else '?'}: {cond.description if cond else ''}"

    def on_disconnected(self, event):
        if self.exit_code == 3:
            self.error = self.error or "disconnected"
            self.finish(1)

    def finish(self, code):
        self.exit_code = code
        self.timer.cancel()
        if self.conn.state & self.conn.LOCAL_ACTIVE:
            self.conn.close()


def main() -> int:
    a = clientkit.parse("subscriber", stack="python")
    handler = Subscriber(a)
    try:
        Container(handler, container_id=a.container_id).run()
    except KeyboardInterrupt:
        pass
    clientkit.summary(stack="python", role="subscriber", received=handler.received, error=handler.error)
    return handler.exit_code


if __name__ == "__main__":
    sys.exit(main())
