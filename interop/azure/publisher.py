#!/usr/bin/env python3
"""Publisher on Azure's pure-Python AMQP 1.0 stack (``azure.servicebus._pyamqp``), used the way the
Service Bus SDK uses it: ``SendClient.send_message`` per message; SASL ANONYMOUS in clear unless the
security options ask for TLS and a login (interop/azure/security.py). Contract: interop/clientkit.py.

pyamqp gives the application no way to settle a sent delivery: ``send_message`` returns once the
receiver *settled* it (a settled disposition), whatever ``--settle`` says (``on-outcome`` behaves as
``default``); ``presettled`` uses snd-settle-mode=settled.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # for clientkit
import clientkit  # noqa: E402
import security  # noqa: E402  (interop/azure/security.py, beside this file)
from azure.servicebus._pyamqp.client import SendClient  # noqa: E402
from azure.servicebus._pyamqp.constants import SenderSettleMode  # noqa: E402
from azure.servicebus._pyamqp.error import AMQPException, RetryPolicy  # noqa: E402
from azure.servicebus._pyamqp.message import Message  # noqa: E402


def main() -> int:
    a = clientkit.parse("publisher", stack="azure")
    ledger = clientkit.Ledger(a)
    presettled = a.settle == "presettled"
    client = SendClient(
        f"{a.host}:{a.port}",
        a.topic,
        **security.client_options(a),
        client_name=a.container_id,
        # Report each outcome, as the other stacks' publishers do: by default pyamqp
        # re-sends a rejected message as a new delivery (another tag: a duplicate the
        # router cannot recognise, by design of the client's retry).
        retry_policy=RetryPolicy(retry_total=0),
        send_settle_mode=SenderSettleMode.Settled if presettled else SenderSettleMode.Unsettled,
    )
    counts: dict[str, int] = {}
    watchdog = clientkit.Watchdog(a.timeout + 2, {"stack": "azure", "role": "publisher", "outcomes": counts}, ledger)
    error = None
    code = 0
    sent = 0
    try:
        client.open()
        deadline = time.monotonic() + a.timeout
        while not client.client_ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"link not attached after {a.timeout} s")
            time.sleep(0.005)
        a.link = client._link.name  # pyamqp names its links itself (a uuid)
        ledger.incarnation = clientkit.incarnation_of(client._link.remote_properties)
        for seq in range(1, a.count + 1):
            body = clientkit.body(a.topic, seq, a.size)
            msg = Message(value=body, application_properties={"seq": seq})
            ts_sent = time.time()
            tag = struct.pack(">I", client._link.delivery_count + 1)  # pyamqp's tag: the delivery count
            ledger.write("sent", seq=seq, pub_tag=tag, digest=clientkit.digest(body), size=len(body), ts=ts_sent)
            sent = seq
            outcome, condition = "accepted", None
            try:
                client.send_message(msg, timeout=a.timeout)
            except AMQPException as exc:  # the receiver settled with a non-accepted outcome
                cond = getattr(exc, "condition", None)
                outcome = "rejected"
                condition = (
                    cond.value.decode()
                    if hasattr(cond, "value") and isinstance(cond.value, bytes)
                    else (cond.decode() if isinstance(cond, bytes) else str(cond))
                )
            if presettled:
                watchdog.progress()
                continue
            watchdog.progress()
            ledger.write("outcome", seq=seq, pub_tag=tag, outcome=outcome, condition=condition)
            counts[outcome] = counts.get(outcome, 0) + 1
            if a.disconnect_after and sum(counts.values()) >= a.disconnect_after:
                clientkit.summary(stack="azure", role="publisher", sent=sent, outcomes=counts, crashed=True)
                clientkit.crash(ledger)
    except TimeoutError as exc:
        error, code = f"{exc} (no settled disposition for seq {sent} within {a.timeout} s)", 3
    except Exception as exc:  # noqa: BLE001 - report whatever the stack raised
        error, code = repr(exc), 1
    finally:
        try:
            client.close()
        except Exception:  # noqa: BLE001
            pass
    clientkit.summary(
        stack="azure", role="publisher", sent=sent, outcomes=counts, error=error, settle="presettled" if presettled else "default"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
