"""A plain python-qpid-proton subscriber (auto-accept on) that closes its connection
from inside its handler as it takes the N-th message: the dispositions of what it
accepted and the close leave in one go (issue 14's client).

    python take_then_close.py URL TOPIC N

Prints "attached" once the router answered its attach, then one "got BODY" line
per message; exits 0 after the close."""

from __future__ import annotations

import sys

from proton.handlers import MessagingHandler
from proton.reactor import Container


class TakeThenClose(MessagingHandler):
    def __init__(self, url: str, topic: str, count: int):
        super().__init__(prefetch=100, auto_accept=True)
        self.url, self.topic, self.count = url, topic, count
        self.got = 0

    def on_start(self, event):
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.topic)

    def on_link_opened(self, event):
        print("attached", flush=True)

    def on_message(self, event):
        self.got += 1
        print(f"got {event.message.body}", flush=True)
        if self.got == self.count:
            event.connection.close()  # before auto-accept answers this one: proton sends both


if __name__ == "__main__":
    url, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    Container(TakeThenClose(url, topic, count)).run()
