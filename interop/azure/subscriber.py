#!/usr/bin/env python3
"""Subscriber on Azure's pure-Python AMQP 1.0 stack (``azure.servicebus._pyamqp``), used the way the
Service Bus SDK's receiver uses it: ``ReceiveClient`` driven by ``do_work()``, transfers taken from its
queue with their frames, answered with ``settle_messages``. SASL ANONYMOUS in clear unless the security
options ask for TLS and a login (interop/azure/security.py). Contract: interop/clientkit.py.

``--rcv-settle-mode second`` is Service Bus' peek-lock mode: each answer is sent unsettled with
``await_outcome=True`` and ``settle_messages`` returns only when the router's settling disposition
arrived and echoed the outcome (the two-step settlement); ``first`` answers settled.
"""

from __future__ import annotations

import queue
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # for clientkit
import clientkit  # noqa: E402
import security  # noqa: E402  (interop/azure/security.py, beside this file)
from azure.servicebus._pyamqp.client import ReceiveClient  # noqa: E402
from azure.servicebus._pyamqp.constants import ReceiverSettleMode, SenderSettleMode  # noqa: E402
from azure.servicebus._pyamqp.error import AMQPError, MessageException, MessageSettlementUnconfirmed  # noqa: E402


def main() -> int:
    a = clientkit.parse("subscriber", stack="azure")
    ledger = clientkit.Ledger(a)
    second = a.rcv_settle_mode == "second"
    client = ReceiveClient(
        f"{a.host}:{a.port}",
        a.topic,
        **security.client_options(a),
        client_name=a.container_id,
        link_credit=a.credit,
        receive_settle_mode=ReceiverSettleMode.Second if second else ReceiverSettleMode.First,
        send_settle_mode=SenderSettleMode.Settled if a.snd_settle_mode == "settled" else SenderSettleMode.Unsettled,
    )
    received = 0
    error = None
    code = 3
    watchdog = clientkit.Watchdog(a.timeout + 2, {"stack": "azure", "role": "subscriber"}, ledger)
    try:
        client.open()
        deadline = time.monotonic() + a.timeout
        while not client.client_ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"link not attached after {a.timeout} s")
            time.sleep(0.005)
        a.link = client._link.name  # pyamqp names its links itself (a uuid)
        clientkit.ready()
        last_progress = time.monotonic()
        while received < a.count:
            if time.monotonic() - last_progress > a.timeout:
                raise TimeoutError(f"no progress for {a.timeout} s (received {received})")
            watchdog.progress()
            if not client.do_work():
                raise RuntimeError("connection closed")
            while received < a.count:
                try:
                    frame, msg = client._received_messages.get_nowait()  # as the Service Bus SDK does
                except queue.Empty:
                    break
                last_progress = time.monotonic()
                received += 1
                delivery_id, tag, presettled = frame[1], frame[2], bool(frame[4])
                seq = clientkit.seq_from(msg.application_properties, msg.value)
                size = len(msg.value) if isinstance(msg.value, (str, bytes)) else None
                dig = clientkit.digest(msg.value) if isinstance(msg.value, (str, bytes)) else None
                if a.disconnect_after and received >= a.disconnect_after:
                    ledger.write("delivered", seq=seq, delivery=tag, digest=dig, size=size)
                    clientkit.summary(stack="azure", role="subscriber", received=received, crashed=True)
                    clientkit.crash(ledger)
                if presettled:
                    ledger.write("delivered", seq=seq, delivery=tag, digest=dig, size=size, presettled=True)
                    continue
                if a.outcome == "hold":
                    ledger.write("delivered", seq=seq, delivery=tag, digest=dig, size=size, held=True)
                    continue
                word = clientkit.OUTCOME_WORD[a.outcome]
                ledger.write("delivered", seq=seq, delivery=tag, outcome=word, digest=dig, size=size)
                kwargs = {}
                if a.outcome == "reject":
                    kwargs["error"] = AMQPError(condition=b"interop:rejected", description="the interop subscriber rejects")
                elif a.outcome == "modify":
                    kwargs.update(delivery_failed=True, undeliverable_here=False)
                if not second:
                    client.settle_messages(delivery_id, tag, word, **kwargs)
                    continue
                try:  # two-step: unsettled, then wait for the router's settlement echoing the outcome
                    client.settle_messages(delivery_id, tag, word, await_outcome=True, outcome_timeout=a.timeout, **kwargs)
                    ledger.write("settled", seq=seq, delivery=tag, outcome=word)
                except MessageSettlementUnconfirmed as exc:
                    ledger.write("settled-unconfirmed", seq=seq, delivery=tag, outcome=None, error=str(exc.description))
                    error = f"seq {seq}: settlement not confirmed: {exc.description}"
                except MessageException as exc:  # the router settled, but not with the outcome we sent
                    ledger.write("settled", seq=seq, delivery=tag, outcome=None, error=str(exc.description))
                    error = f"seq {seq}: {exc.description}"
                last_progress = time.monotonic()
        end = time.monotonic() + a.linger
        while time.monotonic() < end:
            watchdog.progress()
            client.do_work()
            time.sleep(0.01)
        code = 0 if error is None else 1
    except TimeoutError as exc:
        error, code = str(exc), 3
    except Exception as exc:  # noqa: BLE001 - report whatever the stack raised
        error, code = repr(exc), 1
    finally:
        try:
            client.close()
        except Exception:  # noqa: BLE001
            pass
    clientkit.summary(stack="azure", role="subscriber", received=received, error=error)
    return code


if __name__ == "__main__":
    sys.exit(main())
