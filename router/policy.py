"""Who may do what: the ``[policy]`` of a router's config (docs/security.md), as
``Policy`` and ``Group`` values that config.py builds and the adapter asks.

A user is the identity the adapter established when the connection opened
(Engine._admit): the name a password login gave (SASL PLAIN or SCRAM, without the
``[sasl] realm``: ``alice@eorouter`` is ``alice``), else the common name of the
client's TLS certificate (SASL EXTERNAL, or any client that presented one), else
``anonymous``. Each user is in groups (``[policy.users]``; a user not listed is in
``default_group``, if any). Each group lists the topics it may publish to and
subscribe to (exact names, or patterns over ``/``-separated levels: ``+`` one
level, ``#`` the rest; a subscription to a pattern needs one rule covering all it
can match), and may set per-user limits (connections, links held at once, the
largest message it may publish) and whether its users may use ``$management``. A
user's rights are the union of its groups', its limits the most generous of
theirs; a user no group admits may not connect.

Answers carry what a refusal names: the rule that allowed something, the group a
limit comes from, ``describe`` for the user and its groups. Pure: no sockets, no
proton. The adapter asks at open (connection limits) and at attach (topics,
``$management``, link and message size limits; a link resuming at another router
is decided again there: Engine._authorized), never per message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.core.topictrie import covers, is_pattern, matches
from router.core.topictrie import pattern_problem as valid_pattern

__all__ = ["ANONYMOUS", "Group", "Policy", "matches", "valid_pattern"]

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Group:
    name: str
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    max_connections: int | None = None  # per user; None: no limit
    admin: bool = False
    max_links: int | None = None  # links one user may hold at once on a router; None: no limit
    max_message_size: int | None = None  # bytes per message a user may publish; None: the router's limit


@dataclass(frozen=True)
class Policy:
    groups: dict[str, Group] = field(default_factory=dict)
    users: dict[str, tuple[str, ...]] = field(default_factory=dict)  # user -> group names
    default_group: str | None = None

    def groups_of(self, user: str) -> list[Group]:
        names = self.users.get(user)
        if names is None:
            names = (self.default_group,) if self.default_group else ()
        return [self.groups[n] for n in names if n in self.groups]

    def may_publish(self, user: str, topic: str) -> str | None:
        """The rule that lets ``user`` publish to ``topic`` ("group: pattern"), or None."""
        return self._rule(user, topic, "publish")

    def may_subscribe(self, user: str, topic: str) -> str | None:
        return self._rule(user, topic, "subscribe")

    def _rule(self, user: str, topic: str, what: str) -> str | None:
        wildcard = what == "subscribe" and is_pattern(topic)
        for group in self.groups_of(user):
            for pattern in getattr(group, what):
                # A subscription to a pattern needs a rule covering all it can match.
                if covers(pattern, topic) if wildcard else matches(pattern, topic):
                    return f"{group.name}: {pattern}"
        return None

    def is_admin(self, user: str) -> bool:
        return any(g.admin for g in self.groups_of(user))

    def max_connections(self, user: str) -> tuple[int | None, str | None]:
        """(the most connections ``user`` may hold, the group that allows them); a
        group without a limit means no limit."""
        return self.limit(user, "max_connections")

    def limit(self, user: str, what: str) -> tuple[int | None, str | None]:
        """(``user``'s limit ``what`` -- max_connections, max_links, max_message_size --
        the group it comes from): the most generous of its groups', None when one of
        them sets none; (0, None) for a user no group admits."""
        groups = self.groups_of(user)
        if not groups:
            return 0, None
        if any(getattr(g, what) is None for g in groups):
            return None, None
        best = max(groups, key=lambda g: getattr(g, what) or 0)
        return getattr(best, what), best.name

    def describe(self, user: str) -> str:
        names = [g.name for g in self.groups_of(user)]
        return f"user {user!r} (groups: {', '.join(names) if names else 'none'})"
