"""ResumablePublisher: exactly-once publishing across router failures.

    with ResumablePublisher(["127.0.0.1:5672", "127.0.0.1:5772"], "orders",
                            container_id="shop-1", link_name="orders-out",
                            state_path="shop-1.state", ledger_path="shop-1.ledger") as pub:
        outcome = pub.send({"order": 17})            # blocks until the router's outcome
        assert outcome.accepted
        futures = [pub.send_async(f"m{i}") for i in range(1000)]   # windowed: credit-bound
        results = [f.result() for f in futures]

Each message gets an application property ``seq`` (the publisher's own counter,
persisted; or the ``seq`` the caller gives). The message is journaled with its
tag before its transfer leaves, so after a crash (or a router's death) the next
attach resumes the link and resends every unsettled delivery with its original
tag, in order, before anything new (docs/resumption.md, "Publishers").
"""

from __future__ import annotations

import collections
from concurrent.futures import Future
from dataclasses import dataclass

from proton import Link, Message

from router.client.base import OUTCOME_NAMES, ClientError, ResumableClient, raw_tag
from router.client.ledger import body_digest, message_id_of
from router.client.protocol import ResumeAnswer
from router.client.state import PublisherState


@dataclass(frozen=True)
class Outcome:
    """The router's answer for one message: ``accepted`` only when every subscriber
    in the network accepted it (docs/delivery-rule.md)."""

    state: str  # accepted / rejected / released / modified
    tag: bytes  # our delivery tag
    seq: int | None
    condition: str | None = None
    description: str | None = None
    resent: bool = False  # it went out again after a resume

    @property
    def accepted(self) -> bool:
        return self.state == "accepted"


@dataclass
class _Pending:
    message: Message
    seq: int | None
    future: Future


class ResumablePublisher(ResumableClient):
    """A publisher link that survives router failures and client restarts.

    ``on_outcome(outcome)`` (optional) is called on the client thread for every
    outcome, including those of deliveries resent after a restart, which have no
    future to complete."""

    role = "publisher"

    def __init__(
        self,
        urls,
        topic: str,
        *,
        container_id: str,
        link_name: str,
        state_path,
        ledger_path=None,
        fsync: bool = False,
        on_outcome=None,
        **kw,
    ):
        state = PublisherState(state_path, container_id=container_id, link_name=link_name, topic=topic, fsync=fsync)
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
        self.on_outcome = on_outcome
        self._pending: collections.deque[_Pending] = collections.deque()  # not yet sent
        self._resend: collections.deque[bytes] = collections.deque()  # tags to resend, in order
        self._futures: dict[bytes, Future] = {}
        self._seqs_in_flight: dict[bytes, int | None] = {}
        self._resent_tags: set[bytes] = set()
        self.outcomes: collections.deque[Outcome] = collections.deque(maxlen=100000)  # the latest, in arrival order
        self.resent_count = 0
        self._submitted = 0  # send_async calls (application threads)
        self._taken = 0  # of those, taken over by the client thread

    # ------------------------------------------------------------------ application side

    @property
    def incarnation(self) -> str | None:
        return self.state.incarnation

    @property
    def unsettled_count(self) -> int:
        return len(self.state.unsettled)

    def send_async(
        self, body=None, *, message: Message | None = None, seq: int | None = None, properties: dict | None = None
    ) -> Future:
        """Queue one message; the future completes with its ``Outcome``. Messages go out
        in call order as the router's credit allows."""
        if self.error is not None:
            raise self.error
        if self._stopping or self._stopped.is_set():
            raise ClientError("publisher is closed")
        if message is None:
            message = Message(body=body)
        if properties:
            message.properties = dict(properties)  # type: ignore[assignment]  # proton declares it None
        future: Future = Future()
        with self._cond:
            self._submitted += 1
        self._call(self._enqueue, _Pending(message, seq, future))
        return future

    def send(
        self,
        body=None,
        *,
        message: Message | None = None,
        seq: int | None = None,
        properties: dict | None = None,
        timeout: float | None = None,
    ) -> Outcome:
        """Send one message and block until its outcome (across failovers)."""
        return self.send_async(body, message=message, seq=seq, properties=properties).result(timeout)

    def send_many(self, bodies, timeout: float | None = None) -> list[Outcome]:
        """Send every body (pipelined up to the router's credit), wait for all outcomes."""
        futures = [self.send_async(body) for body in bodies]
        return [f.result(timeout) for f in futures]

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Until nothing is queued, in flight or waiting to be resent."""
        return self.wait_for(
            lambda: self._taken == self._submitted and not self._pending and not self.state.unsettled and not self._resend,
            timeout,
        )

    # ------------------------------------------------------------------ client thread

    def _enqueue(self, pending: _Pending) -> None:
        self._taken += 1
        if self._stopping:
            pending.future.set_exception(ClientError("publisher is closed"))
            return
        self._pending.append(pending)

    def _after_commands(self) -> None:
        if self._attached and self._link is not None:
            self._pump(self._link)

    def _make_link(self, session):
        link = session.sender(self.link_name)
        link.target.address = self.topic
        link.source.address = None
        link.snd_settle_mode = Link.SND_UNSETTLED
        # Second: the router keeps its subscribers' copies unsettled until we settled,
        # so that a router dying between the two can never leave a subscriber that
        # forgot a delivery we still resend (docs/delivery-rule.md, "Settlement").
        # A router may answer first; we settle on the outcome either way.
        link.rcv_settle_mode = Link.RCV_SECOND
        return link

    def _incarnation(self) -> str | None:
        return self.state.incarnation

    def _attached_hook(self, link, answer: ResumeAnswer, resumed: bool) -> None:
        if answer.incarnation and answer.incarnation != self.state.incarnation:
            if self.state.incarnation is not None:
                # The router did not take our incarnation: our old tags name another
                # stream now; resending them makes new deliveries (at-least-once for
                # those). Only a stream-id collision makes a router do this.
                self._note("incarnation-changed", f"{self.state.incarnation} -> {answer.incarnation}")
            self.state.record_incarnation(answer.incarnation)
        elif not answer.incarnation:
            self._note("no-incarnation", "router's attach carried no eorouter:incarnation")
        # resend everything unsettled, in original order, before anything new
        self._resend = collections.deque(self.state.unsettled.keys())
        if resumed:
            reported = self.last_resume["reported"] if self.last_resume else []
            known = answer.unsettled or {}
            self.ledger.write(
                "resumed",
                router=self.router,
                incarnation=self.state.incarnation,
                unsettled=len(self.state.unsettled),
                reported=len(reported),
                incomplete=bool(self.last_resume and self.last_resume["incomplete"]),
                known=len(known) if answer.speaks_resume else None,
                resend=len(self._resend),
            )
        self._pump(link)

    def _on_flow(self, link) -> None:
        self._pump(link)

    def _pump(self, link) -> None:
        while link.credit > 0:
            if self._resend:
                tag = self._resend.popleft()
                entry = self.state.unsettled.get(tag)
                if entry is None:
                    continue
                self._transfer(link, tag, entry.payload)
                self._resent_tags.add(tag)
                self.resent_count += 1
                message = Message()
                message.decode(entry.payload)
                self.ledger.write(
                    "sent",
                    pub_tag=tag.hex(),
                    seq=entry.seq,
                    router=self.router,
                    incarnation=self.state.incarnation,
                    digest=body_digest(message),
                    message_id=message_id_of(message),
                    resend=True,
                )
            elif self._pending:
                pending = self._pending.popleft()
                if pending.future.cancelled():
                    continue
                seq = pending.seq if pending.seq is not None else self.state.take_seq()
                props = dict(pending.message.properties or {})
                props["seq"] = seq
                pending.message.properties = props  # type: ignore[assignment]  # proton declares it None
                payload = pending.message.encode()
                tag = self.state.record_sent(payload, seq)  # journaled before the transfer leaves
                self._futures[tag] = pending.future
                self._transfer(link, tag, payload)
                self.ledger.write(
                    "sent",
                    pub_tag=tag.hex(),
                    seq=seq,
                    router=self.router,
                    incarnation=self.state.incarnation,
                    digest=body_digest(pending.message),
                    message_id=message_id_of(pending.message),
                )
            else:
                break
        self._notify()

    @staticmethod
    def _transfer(link, tag: bytes, payload: bytes) -> None:
        dlv = link.delivery(tag)
        link.stream(payload)
        link.advance()
        del dlv

    def _on_delivery(self, link, dlv) -> None:
        state = OUTCOME_NAMES.get(int(dlv.remote_state or 0))
        if state is None and not dlv.settled:
            return  # a non-terminal update
        if state is None:
            state = "released"  # settled without an outcome
        tag = raw_tag(dlv)
        entry = self.state.unsettled.get(tag)
        dlv.settle()
        if entry is None:
            return
        remote = dlv.remote
        cond = remote.condition
        outcome = Outcome(
            state,
            tag,
            entry.seq,
            str(cond.name) if cond is not None and cond.name else None,
            cond.description if cond is not None else None,
            tag in self._resent_tags,
        )
        self.state.record_settled(tag)  # with our settle, the delivery is done for us
        self._resent_tags.discard(tag)
        self.outcomes.append(outcome)
        self.ledger.write(
            "outcome",
            pub_tag=tag.hex(),
            seq=entry.seq,
            outcome=state,
            router=self.router,
            incarnation=self.state.incarnation,
            condition=outcome.condition,
        )
        future = self._futures.pop(tag, None)
        if future is not None and not future.done():
            future.set_result(outcome)
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        self._notify()

    def _lost_hook(self, was_attached: bool) -> None:
        self._resend.clear()

    def _stop_hook(self) -> None:
        error = ClientError(
            "publisher closed before the outcome arrived (it stays in the state file and is resent when the publisher resumes)"
        )
        for future in list(self._futures.values()):
            if not future.done():
                future.set_exception(error)
        self._futures.clear()
        while self._pending:
            pending = self._pending.popleft()
            if not pending.future.done():
                pending.future.set_exception(ClientError("publisher closed before this message was sent"))
