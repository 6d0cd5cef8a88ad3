"""Python benchmark clients (python-qpid-proton `Container` + `MessagingHandler`), the counterparts of the
C clients in bench/cclients: same wire format, same options, same one-line JSON summary on stdout.

    python -m bench.pyclients send    [-m unsettled|presettled] [-w WINDOW] [-s SIZE] [-t SECONDS]
                                      [-c CONTAINER] [-l LINK] HOST PORT ADDRESS COUNT
    python -m bench.pyclients receive [-w CREDIT] [-t SECONDS] [-c CONTAINER] [-l LINK]
                                      HOST PORT ADDRESS COUNT

The message body is an AMQP data section starting with b"EOBENCH1", the sequence number (u64 BE) and the
send time (time.monotonic_ns(), i.e. CLOCK_MONOTONIC, u64 BE), so C and Python clients can be mixed.
They use the ordinary API (a `Message` built and encoded per send, `on_message` decoding it): these are
"what a typical Python client costs" figures, not a tuned client.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time

from proton import Delivery, Message
from proton.handlers import MessagingHandler
from proton.reactor import AtLeastOnce, AtMostOnce, Container

MAGIC = b"EOBENCH1"
_HDR = struct.Struct(">8sQQ")


def _body(seq: int, size: int) -> bytes:
    head = _HDR.pack(MAGIC, seq, time.monotonic_ns())
    return head + bytes(max(0, size - len(head)))


class Publisher(MessagingHandler):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.a = a
        self.presettled = a.mode == "presettled"
        self.sent = 0
        self.outcomes = 0
        self.counts = {"accepted": 0, "rejected": 0, "released": 0, "modified": 0, "other": 0}
        self.start_ns = 0
        self.end_ns = 0
        self.finished = False
        self.timed_out = False
        self.error = ""
        self._mark = -1
        self._idle = 0

    def on_start(self, event) -> None:
        c = event.container
        c.container_id = self.a.container
        conn = c.connect(f"{self.a.host}:{self.a.port}", sasl_enabled=True, allowed_mechs="ANONYMOUS")
        c.create_sender(conn, self.a.address, name=self.a.link, options=AtMostOnce() if self.presettled else AtLeastOnce())
        c.schedule(1.0, self)

    def on_timer_task(self, event) -> None:
        if self.finished:
            return
        mark = self.sent + self.outcomes
        if mark != self._mark:
            self._mark, self._idle = mark, 0
        else:
            self._idle += 1
            if self._idle >= self.a.timeout:
                self.timed_out = True
                print(
                    f"send: no progress for {self.a.timeout} s (sent {self.sent}, outcomes {self.outcomes}), giving up",
                    file=sys.stderr,
                )
                event.container.stop()
                return
        event.container.schedule(1.0, self)

    def on_sendable(self, event) -> None:
        self._send(event.sender)

    def _send(self, sender) -> None:
        a = self.a
        while sender.credit > 0 and self.sent < a.count and (self.presettled or self.sent - self.outcomes < a.window):
            self.sent += 1
            if not self.start_ns:
                self.start_ns = time.monotonic_ns()
            sender.send(Message(body=_body(self.sent, a.size), inferred=True))
        if self.presettled and self.sent == a.count and not self.finished:
            self.finished = True
            self.end_ns = time.monotonic_ns()
            sender.close()
            sender.connection.close()

    def _outcome(self, event, name: str) -> None:
        self.counts[name] += 1
        self.outcomes += 1
        event.delivery.settle()
        if self.outcomes == self.a.count:
            self.finished = True
            self.end_ns = time.monotonic_ns()
            event.connection.close()
        else:
            self._send(event.link)

    def on_accepted(self, event) -> None:
        self._outcome(event, "accepted")

    def on_rejected(self, event) -> None:
        self._outcome(event, "rejected")

    def on_released(self, event) -> None:
        self._outcome(event, "modified" if event.delivery.remote_state == Delivery.MODIFIED else "released")

    def on_settled(self, event) -> None:
        # settled by the peer without any of the outcomes above
        if (
            event.delivery.remote_state not in (Delivery.ACCEPTED, Delivery.REJECTED, Delivery.RELEASED, Delivery.MODIFIED)
            and not self.presettled
        ):
            self._outcome(event, "other")

    def _err(self, event, cond) -> None:
        if cond and not self.error:
            self.error = f"{cond.name}: {cond.description}"
            print(f"send: {self.error}", file=sys.stderr)

    def on_transport_error(self, event) -> None:
        self._err(event, event.transport.condition)

    def on_link_error(self, event) -> None:
        self._err(event, event.link.remote_condition)

    def on_connection_error(self, event) -> None:
        self._err(event, event.connection.remote_condition)

    def on_connection_closed(self, event) -> None:
        event.container.stop()

    def summary(self) -> dict:
        return {
            "role": "send",
            "mode": self.a.mode,
            "count": self.a.count,
            "sent": self.sent,
            **self.counts,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "timed_out": self.timed_out,
            "error": self.error,
        }


class Subscriber(MessagingHandler):
    def __init__(self, a: argparse.Namespace) -> None:
        # credit is managed here like the C receiver does (window, topped up below half): proton's
        # FlowController would send a flow frame per message
        super().__init__(prefetch=0, auto_accept=True)
        self.a = a
        self.received = 0
        self.presettled = 0
        self.unparsed = 0
        self.dups = 0
        self.out_of_order = 0
        self.last_seq = 0
        self.seen = bytearray(a.count // 8 + 1)
        self.lat_us: list[int] = []
        self.first_ns = 0
        self.last_ns = 0
        self.finished = False
        self.timed_out = False
        self.error = ""
        self._mark = -1
        self._idle = 0

    def on_start(self, event) -> None:
        c = event.container
        c.container_id = self.a.container
        conn = c.connect(f"{self.a.host}:{self.a.port}", sasl_enabled=True, allowed_mechs="ANONYMOUS")
        rcv = c.create_receiver(conn, self.a.address, name=self.a.link)
        rcv.flow(self.a.window)
        c.schedule(1.0, self)

    def on_link_opened(self, event) -> None:
        print("ready", file=sys.stderr, flush=True)

    def on_timer_task(self, event) -> None:
        if self.finished:
            return
        if self.received != self._mark:
            self._mark, self._idle = self.received, 0
        else:
            self._idle += 1
            if self._idle >= (self.a.timeout if self.received else max(self.a.timeout, 60)):
                self.timed_out = True
                print(
                    f"receive: no message for {self._idle} s (received {self.received} of {self.a.count}), giving up",
                    file=sys.stderr,
                )
                event.container.stop()
                return
        event.container.schedule(1.0, self)

    def on_message(self, event) -> None:
        t = time.monotonic_ns()
        if not self.first_ns:
            self.first_ns = t
        self.last_ns = t
        self.received += 1
        if event.delivery.settled:
            self.presettled += 1
        body = event.message.body
        if isinstance(body, (bytes, bytearray, memoryview)) and bytes(body[:8]) == MAGIC and len(body) >= 24:
            _, seq, sent_ns = _HDR.unpack_from(body)
            if 1 <= seq <= self.a.count:
                bit = 1 << (seq & 7)
                if self.seen[seq >> 3] & bit:
                    self.dups += 1
                self.seen[seq >> 3] |= bit
            if seq < self.last_seq:
                self.out_of_order += 1
            elif seq > self.last_seq:
                self.last_seq = seq
            self.lat_us.append(max(0, t - sent_ns) // 1000)
        else:
            self.unparsed += 1
        if self.a.count and self.received >= self.a.count and not self.finished:
            self.finished = True
            # MessagingHandler accepts this delivery after on_message returns; the transport writes that
            # disposition before the detach/close frames.
            event.receiver.close()
            event.connection.close()
        else:
            rcv = event.receiver
            if rcv.credit < self.a.window // 2:
                rcv.flow(self.a.window - rcv.credit)

    def _err(self, event, cond) -> None:
        if cond and not self.error:
            self.error = f"{cond.name}: {cond.description}"
            print(f"receive: {self.error}", file=sys.stderr)

    def on_transport_error(self, event) -> None:
        self._err(event, event.transport.condition)

    def on_link_error(self, event) -> None:
        self._err(event, event.link.remote_condition)

    def on_connection_error(self, event) -> None:
        self._err(event, event.connection.remote_condition)

    def on_connection_closed(self, event) -> None:
        event.container.stop()

    def summary(self) -> dict:
        lat = self.lat_us
        mean = sum(lat) / len(lat) if lat else 0.0
        lat.sort()

        def pct(p: float) -> int:
            return lat[int(p * (len(lat) - 1) + 0.5)] if lat else 0

        return {
            "role": "receive",
            "expected": self.a.count,
            "count": self.received,
            "p50_us": pct(0.5),
            "p90_us": pct(0.9),
            "p99_us": pct(0.99),
            "max_us": lat[-1] if lat else 0,
            "mean_us": round(mean, 1),
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "presettled": self.presettled,
            "dups": self.dups,
            "out_of_order": self.out_of_order,
            "unparsed": self.unparsed,
            "invalid": 0,
            "aborted": 0,
            "timed_out": self.timed_out,
            "error": self.error,
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pyclients")
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("send")
    s.add_argument("-m", dest="mode", choices=["unsettled", "presettled"], default="unsettled")
    s.add_argument("-w", dest="window", type=int, default=1000)
    s.add_argument("-s", dest="size", type=int, default=100)
    s.add_argument("-c", dest="container", default="eorouter-bench-pysend")
    s.add_argument("-l", dest="link", default="bench-send")
    r = sub.add_parser("receive")
    r.add_argument("-w", dest="window", type=int, default=1000)
    r.add_argument("-c", dest="container", default="eorouter-bench-pyreceive")
    r.add_argument("-l", dest="link", default="bench-receive")
    for q in (s, r):
        q.add_argument("-t", dest="timeout", type=int, default=30)
        q.add_argument("host")
        q.add_argument("port")
        q.add_argument("address")
        q.add_argument("count", type=int)
    a = p.parse_args(argv)
    handler = Publisher(a) if a.role == "send" else Subscriber(a)
    try:
        Container(handler).run()
    except KeyboardInterrupt:
        pass
    out = handler.summary()
    print(json.dumps(out, separators=(",", ":")), flush=True)
    if out["timed_out"]:
        return 3
    if out["error"] and not handler.finished:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
