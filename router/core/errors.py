"""The one exception the core raises for illegal peer input."""

from __future__ import annotations


class ProtocolError(Exception):
    """Peer input the core refuses. Carries the AMQP error condition to answer with;
    the core's state is unchanged when it is raised."""

    def __init__(self, condition: str, description: str):
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description
