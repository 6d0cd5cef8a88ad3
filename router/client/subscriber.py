"""ResumableSubscriber: each message handed to the application exactly once,
across router failures and client restarts.

    def handle(msg: Received) -> str | None:
        process(msg.body, msg.seq)
        return None                      # accepted (or "rejected" / "released" / "modified")

    sub = ResumableSubscriber(urls, "orders", container_id="billing-1", link_name="orders-in",
                              state_path="billing-1.state", ledger_path="billing-1.ledger",
                              on_message=handle)
    sub.start(); ...; sub.close()        # close() detaches: the durable subscription stays

The link is a durable subscription (source durability unsettled-state, expiry
policy never) with rcv-settle-mode=second: we answer each delivery unsettled and
settle it only after the router settled it, then forget it (docs/resumption.md,
"Subscribers"). ``on_message`` runs on the client thread, one message at a time,
in delivery order; its return value is the outcome (an exception counts as
``released``, and the message is not handed over again).

Exactly-once to the application rests on the router's disambiguated tag: the tag
and our answer are journaled right after ``on_message`` returns; a delivery whose
tag we already handed over is answered with the recorded answer and not handed
over again. The one window left is a crash *inside* or right after
``on_message`` before the journal line is written: that message comes again
after the restart (make ``on_message`` idempotent per ``msg.delivery_tag`` if
that matters).
"""

from __future__ import annotations

from dataclasses import dataclass

from proton import Described, Link, Message, Terminus, symbol

from router.client.base import STATE_CODES, ResumableClient, raw_tag
from router.client.ledger import body_digest, message_id_of
from router.client.protocol import ResumeAnswer, publisher_tag_of
from router.client.state import SubscriberState


@dataclass
class Received:
    """One message as handed to the application."""

    message: Message
    delivery_tag: bytes  # the router's disambiguated tag: the same on every router
    router: str | None

    @property
    def body(self):
        return self.message.body

    @property
    def seq(self):
        props = self.message.properties or {}
        return props.get("seq")

    @property
    def publisher_tag(self) -> bytes | None:
        return publisher_tag_of(self.delivery_tag)


class ResumableSubscriber(ResumableClient):
    role = "subscriber"

    def __init__(
        self,
        urls,
        topic: str,
        *,
        container_id: str,
        link_name: str,
        state_path,
        ledger_path=None,
        on_message=None,
        prefetch: int = 100,
        terminus_timeout: int = 0,
        fsync: bool = False,
        dedup_window: int = 10000,
        dedup_linger: float = 600.0,
        selector: str | None = None,
        **kw,
    ):
        state = SubscriberState(
            state_path,
            container_id=container_id,
            link_name=link_name,
            topic=topic,
            fsync=fsync,
            dedup_window=dedup_window,
            dedup_linger=dedup_linger,
        )
        super().__init__(
            urls,
            topic,
            container_id=container_id,
            link_name=link_name,
            state=state,
            ledger_path=ledger_path,
            ledger_fsync=fsync,
            **kw,
        )
        self.on_message = on_message
        # A JMS selector (docs/selectors.md): the router sends only the messages it
        # selects; sent again with every attach, so it follows a failover.
        self.selector = selector
        self.prefetch = prefetch
        self.terminus_timeout = terminus_timeout
        self.delivered = 0  # messages handed to the application by this process
        self.duplicates = 0  # deliveries recognised as already handed over
        self.app_errors = 0

    # ------------------------------------------------------------------ application side

    @property
    def unsettled_count(self) -> int:
        return len(self.state.unsettled)

    def unsubscribe(self, timeout: float = 5.0) -> None:
        """Close the link's terminus: the durable subscription ends at the router."""
        self._shutdown(close_terminus=True, timeout=timeout)

    # ------------------------------------------------------------------ client thread

    def _make_link(self, session):
        link = session.receiver(self.link_name)
        link.source.address = self.topic
        link.source.durability = Terminus.DELIVERIES  # unsettled-state
        link.source.expiry_policy = Terminus.EXPIRE_NEVER
        link.source.timeout = self.terminus_timeout
        link.target.address = None
        if self.selector is not None:
            link.source.filter.put_dict(
                {symbol("jms-selector"): Described(symbol("apache.org:selector-filter:string"), self.selector)}
            )
        link.snd_settle_mode = Link.SND_UNSETTLED
        link.rcv_settle_mode = Link.RCV_SECOND
        return link

    def _attached_hook(self, link, answer: ResumeAnswer, resumed: bool) -> None:
        if resumed:
            reported = self.last_resume["reported"] if self.last_resume else []
            settled = []
            known = answer.unsettled  # None: the router does not speak the resume protocol
            if known is not None:
                # a reported tag missing from the router's answer is one it knows settled
                settled = [tag for tag, _ in reported if tag not in known]
            else:
                # A router that does not speak the protocol will never settle these on
                # this link: keep them for dedup only (they age out of the window).
                settled = [tag for tag, _ in reported]
            for tag in settled:
                self.state.record_settled(tag)
            self.state.trim()
            self.ledger.write(
                "resumed",
                router=self.router,
                unsettled=len(self.state.unsettled) + len(settled),
                reported=len(reported),
                incomplete=bool(self.last_resume and self.last_resume["incomplete"]),
                known=len(known) if known is not None else None,
                settled=len(settled),
            )
        if self.prefetch:
            link.flow(self.prefetch)

    def _on_delivery(self, link, dlv) -> None:
        tag = raw_tag(dlv)
        if dlv.aborted:
            dlv.settle()
            return
        if not dlv.readable:
            # an update for a delivery we already answered: the router settled it
            if dlv.settled:
                dlv.settle()
                self.state.record_settled(tag)
                self._notify()
            return
        if dlv.partial:
            return
        payload = link.recv(dlv.pending) or b""
        link.advance()
        known = self.state.seen(tag)
        if known is not None:
            # resent after a resume: answer as before, do not hand it over again
            self.duplicates += 1
            self._answer(dlv, tag, known, record=False)
        else:
            message = Message()
            try:
                message.decode(payload)
            except Exception:  # noqa: BLE001 - undecodable: the application cannot use it
                self._answer(dlv, tag, "rejected", record=True)
                return
            received = Received(message, tag, self.router)
            state = "accepted"
            try:
                result = self.on_message(received) if self.on_message is not None else None
                if result is not None:
                    if result not in STATE_CODES:
                        raise ValueError(f"on_message returned {result!r}: expected None or one of {sorted(STATE_CODES)}")
                    state = result
            except Exception:  # noqa: BLE001 - an application failure is released, never redelivered
                self.app_errors += 1
                self._note("application-error", repr(tag))
                state = "released"
            self.delivered += 1
            pub_tag = publisher_tag_of(tag)
            self.ledger.write(
                "delivered",
                delivery=tag.hex(),
                pub_tag=pub_tag.hex() if pub_tag is not None else None,
                seq=received.seq,
                outcome=state,
                router=self.router,
                digest=body_digest(message),
                message_id=message_id_of(message),
            )
            self._answer(dlv, tag, state, record=True)
        if link.credit < self.prefetch // 2:
            link.flow(self.prefetch - link.credit)
        self._notify()

    def _answer(self, dlv, tag: bytes, state: str, record: bool) -> None:
        arrived_settled = bool(dlv.settled)
        if record:
            self.state.record_delivered(tag, state, settled=arrived_settled)
        if state in STATE_CODES:
            dlv.update(STATE_CODES[state])
        if arrived_settled:
            dlv.settle()
            self.state.record_settled(tag)
