"""Resumable AMQP 1.0 clients for eorouter (a separate proton application: the
router's core never imports this package).

``ResumablePublisher`` and ``ResumableSubscriber`` keep their link identity,
incarnation, tag counter and unsettled state in a local state file, fail over
through the routers' ``failover-server-list``, resume their links with the
properties of docs/resumption.md, and write a ledger (docs/ledger.md). The
application sees every message exactly once. docs/client.md is the guide.
"""

from router.client.base import ClientError
from router.client.ledger import Ledger, read_ledger
from router.client.publisher import Outcome, ResumablePublisher
from router.client.state import PublisherState, StateError, SubscriberState
from router.client.subscriber import Received, ResumableSubscriber

__all__ = [
    "ClientError",
    "Ledger",
    "Outcome",
    "PublisherState",
    "Received",
    "ResumablePublisher",
    "ResumableSubscriber",
    "StateError",
    "SubscriberState",
    "read_ledger",
]
