"""Pre-settled relay: a pre-settled publisher's messages (best effort, as it asked) and an
at-most-once topic's (docs/guarantees.md), to whoever has credit as they pass, here and one
copy per next hop towards the interested routers; nothing recorded, owed or answered.

A mixin of ``RouterCore`` (router/core/router.py): its methods share the core's state,
documented there, and are split out only to keep one concern per module."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.core import outcomes, tags
from router.core.commands import Command, Forward, Log, SendData, SendOutcome
from router.core.constants import _TAG_SIZE, _new
from router.core.events import DataReceived, MessageReceived
from router.core.guarantees import EXACTLY_ONCE
from router.core.links import PublisherLink, Topic
from router.core.message import MessageError, splice_origin

if TYPE_CHECKING:
    from router.core.corestate import CoreState
else:
    CoreState = object  # declarations for mypy only: no base class at run time


class PresettledMixin(CoreState):
    def _best_effort_copies(self, topic: Topic, tag: bytes, payload: bytes, out: list[Command]) -> None:
        """Pre-settled copies for at-most-once subscribers that have credit now."""
        for sub in topic.subscriptions.values():
            if sub.best_effort and sub.link_id is not None and sub.credit > 0:
                sub.credit -= 1
                out.append(Forward(sub.link_id, tag, payload, True))

    def _relay_best_effort(self, pub: PublisherLink, topic: Topic, ev: MessageReceived, now: float, out: list[Command]) -> None:
        """Pre-settled: forward to whoever has credit now; never wait, never owe. An
        unsettled transfer here (its topic is at-most-once) is accepted on arrival."""
        resent = False
        if not ev.settled:
            out.append(_new(SendOutcome, (ev.delivery, outcomes.ACCEPTED, True, None, None, False, False)))
            if pub.resending is not None and ev.tag in pub.resending:  # (resumption.resume_at_most_once)
                pub.resending.discard(ev.tag)
                resent = True
        try:
            prepared = splice_origin(ev.payload, self._origin_template(pub), ev.tag)
        except MessageError:
            out.append(Log("dropped", {"delivery": None, "reason": "malformed pre-settled message"}))
            self._refill_credit(topic, out)
            return
        # A message that already carries an origin is relayed as it is (best effort
        # never refused anything).
        payload = ev.payload if prepared is None else prepared[0]
        ptag = ev.tag
        if len(ptag) <= tags.MAX_INLINE_TAG:  # tags.outgoing_tag() inlined for short tags
            tag = pub.stream + _TAG_SIZE[len(ptag)] + ptag
        else:
            tag = tags.outgoing_tag(pub.stream, ptag[: tags.MAX_TAG_SIZE])
        delivery_id = tag.hex()
        line = {
            "delivery": delivery_id,
            "topic": topic.name,
            "publisher": pub.container_id,
            "link_name": pub.name,
            "pub_tag": ptag.hex(),
            "incarnation": pub.incarnation,
            "stream_seq": pub.next_seq - 1,
            "size": len(ev.payload),
            "settled": True,
            "owed": [],
        }
        out.append(_new(Log, ("received", line)))
        if topic.guarantee.mode != EXACTLY_ONCE:  # (only where a rule relaxes it: no key, no bytes otherwise)
            line["guarantee"] = topic.guarantee.mode
        if not ev.settled:  # what its publisher was told, on arrival
            out.append(_new(Log, ("pub-outcome", {"delivery": delivery_id, "outcome": "accepted"})))
        if resent:
            reason = "resent after a failover on an at-most-once topic: it may have been delivered already"
            out.append(Log("dropped", {"delivery": delivery_id, "reason": reason}))
            self._refill_credit(topic, out)
            return
        sent_to = self._best_effort_to_local(topic, tag, payload, out)
        if sent_to:  # who got a pre-settled copy: what the applications' ledgers are held to
            line["forwarded"] = sent_to
        interested = self.net.interested_routers(topic.name)
        if interested:
            self._presettled_towards(pub, topic, tag, ptag, payload, sorted(interested), out)
        self._refill_credit(topic, out)

    def _presettled_towards(
        self,
        pub: PublisherLink,
        topic: Topic,
        tag: bytes,
        ptag: bytes,
        payload: bytes,
        routers: list[str],
        out: list[Command],
    ) -> None:
        """One pre-settled copy per next hop towards ``routers``, as for exactly-once,
        but nobody answers it."""
        base = {
            "origin": self.settings.router_id,
            "epoch": self.epoch,
            "boot": self.boot_id,
            "topic": topic.name,
            "pub": pub.container_id,
            "link": pub.name,
            "ptag": ptag.hex(),
            "inc": pub.incarnation,
            "seq": pub.next_seq - 1,
            "hops": 0,
            "be": True,
        }
        for hop, dests in self.net.split(routers).by_next_hop.items():
            header = dict(base)
            header["dests"] = sorted(dests)
            out.append(SendData(hop, tag, header, payload))
            out.append(Log("forwarded-to-router", {"delivery": tag.hex(), "to_router": hop, "dests": header["dests"]}))

    def _best_effort_to_local(self, topic: Topic, tag: bytes, payload: bytes, out: list[Command]) -> list[str]:
        """A pre-settled copy to every local subscriber with credit now (at-most-once);
        the keys of those it went to."""
        sent_to = []
        for sub in topic.subscriptions.values():
            if sub.link_id is not None and sub.credit > 0:
                sub.credit -= 1
                out.append(Forward(sub.link_id, tag, payload, True))
                sent_to.append(sub.key)
        return sent_to

    def _best_effort_from_router(self, ev: DataReceived, header: dict[str, Any], out: list[Command]) -> None:
        """A pre-settled delivery relayed from its publisher's router: copies to our
        subscribers with credit now; no record, no answer, no order hold."""
        name: Any = header.get("topic")  # wire data: None when absent, which names no topic
        topic = self._topic_if_wanted(name)
        stream = ev.tag[: tags.STREAM_ID_SIZE]
        seq = header.get("seq", 0)
        if isinstance(seq, int) and seq > self.stream_seq.get(stream, -1):  # a resumed publisher numbers on from it
            self.stream_seq[stream] = seq
        line: dict[str, Any] = {
            "delivery": ev.tag.hex(),
            "topic": name,
            "publisher": header.get("pub"),
            "link_name": header.get("link"),
            "pub_tag": header.get("ptag"),
            "incarnation": header.get("inc"),
            "stream_seq": seq,
            "size": len(ev.payload),
            "settled": True,
            "owed": [],
            "origin_router": header.get("origin"),
        }
        out.append(Log("received", line))
        if topic is not None:
            sent_to = self._best_effort_to_local(topic, ev.tag, ev.payload, out)
            if sent_to:  # (the line is written after this event is handled)
                line["forwarded"] = sent_to
