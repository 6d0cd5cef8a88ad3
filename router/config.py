"""The router's TOML configuration: parse, validate strictly, build ``RouterConfig``.

Every problem is a ``ConfigError`` whose message names the file, the key path
(``limits.max_message_size``, ``listener[1].port``) and what was expected versus
found. Unknown keys are errors (with the closest known key suggested): a typo
must never silently fall back to a default. Reference: docs/configuration.md.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router import eventlog
from router.core import outcomes
from router.core.guarantees import MODES as GUARANTEE_MODES
from router.core.guarantees import GuaranteeRule
from router.core.resumption import SETTLE_MODES
from router.core.settings import CoreSettings
from router.policy import Group, Policy, valid_pattern

__all__ = [
    "ConfigError",
    "Connector",
    "EventLogSettings",
    "Listener",
    "LoggingSettings",
    "TlsSettings",
    "MetricsSettings",
    "NetworkSettings",
    "RouterConfig",
    "load_config",
    "parse_config",
]

ROUTER_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
UINT_MAX = 2**32 - 1  # AMQP uint: terminus timeouts and link credit
NO_SUBSCRIBER_OUTCOMES = ("released", "rejected", "accepted", "modified")
LISTENER_ROLES = ("normal", "inter-router")
TLS_PROTOCOLS = ("TLSv1.2", "TLSv1.3")
CONNECTOR_ROLES = ("inter-router",)
_CORE_DEFAULTS = CoreSettings()


class ConfigError(ValueError):
    """An invalid configuration. ``source`` is the file, ``key`` the offending key
    path (None for file-level problems), ``line``/``column`` are set for TOML
    syntax errors."""

    def __init__(
        self, message: str, *, source: str, key: str | None = None, line: int | None = None, column: int | None = None
    ) -> None:
        super().__init__(message)
        self.source = source
        self.key = key
        self.line = line
        self.column = column


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """TLS on one listener or connector (docs/configuration.md, "TLS"). Paths are
    absolute (resolved against the config file's directory)."""

    cert_file: Path | None = None  # our certificate chain (PEM); a listener's is required
    key_file: Path | None = None  # its private key (PEM)
    key_password_file: Path | None = field(default=None, repr=False)  # the key's password, if encrypted
    ca_file: Path | None = None  # CAs we trust for the peer's certificate
    require_client_cert: bool = False  # listeners: the client must present a certificate from ca_file
    min_protocol: str = "TLSv1.2"  # or "TLSv1.3"
    allow_plain: bool = False  # listeners: also accept clients that do not speak TLS
    server_name: str | None = None  # connectors: the name the server's certificate must carry (default: host)


#: The SASL mechanisms a client listener may offer (docs/security.md, "Logins");
#: the password ones check the sasldb of ``[sasl] users_db``.
SASL_MECHANISMS = ("ANONYMOUS", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "EXTERNAL")
SASL_PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class Listener:
    host: str = "127.0.0.1"
    port: int = 5672
    role: str = "normal"
    tls: TlsSettings | None = None  # None: plain AMQP
    # What a client may log in with; ANONYMOUS alone (the default) is today's open door.
    sasl_mechanisms: tuple[str, ...] = ("ANONYMOUS",)
    sasl_allow_plain_in_clear: bool = False  # PLAIN without TLS: passwords readable on the wire


@dataclass(frozen=True, slots=True)
class SaslSettings:
    """``[sasl]``: where password logins are checked (docs/security.md, "Logins")."""

    users_db: Path | None = None  # the sasldb `eorouter passwd` writes (absolute)
    realm: str = "eorouter"  # users log in as name@realm; the policy sees name
    login_failure_delay: float = 1.0  # seconds a failed login waits for its answer (slows guessing)


@dataclass(frozen=True, slots=True)
class Connector:
    """An outgoing inter-router connection: dialled at start, re-dialled forever."""

    host: str
    port: int
    role: str = "inter-router"
    name: str = ""  # for logs; defaults to "host:port"
    tls: TlsSettings | None = None  # None: plain AMQP


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    """``[network]``: the shared secret inter-router connections prove at open
    (docs/inter-router.md) and the connectors' reconnect backoff."""

    secret: str | None = field(default=None, repr=False)  # never printed
    reconnect_delay: float = 0.5  # seconds before the first re-dial; doubles per failure
    reconnect_max: float = 2.0  # the backoff's ceiling


@dataclass(frozen=True, slots=True)
class EventLogSettings:
    max_bytes: int = eventlog.DEFAULT_MAX_BYTES
    retention: int = eventlog.DEFAULT_RETENTION
    fsync: bool = False


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """``[metrics]``: the HTTP listener of /metrics, /healthz and /readyz (docs/operations.md)."""

    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    """``[logging]`` (docs/operations.md, "Logging")."""

    level: str = "INFO"
    format: str = "text"  # or "json": one object per line
    modules: dict[str, str] = field(default_factory=dict)  # logger name -> level
    slow_subscriber_age: float = 30.0  # seconds; 0: never warn


@dataclass(frozen=True, slots=True)
class RouterConfig:
    router_id: str
    data_dir: Path  # absolute
    idle_timeout: float = 2.0  # a dead peer (SIGSTOP, cut link) is noticed within this
    listeners: tuple[Listener, ...] = (Listener(),)
    connectors: tuple[Connector, ...] = ()
    network: NetworkSettings = field(default_factory=NetworkSettings)
    drain_grace: float = 5.0
    eventlog: EventLogSettings = field(default_factory=EventLogSettings)
    core: CoreSettings = field(default_factory=CoreSettings)
    metrics: MetricsSettings | None = None  # None: no [metrics] table, no HTTP listener
    policy: Policy | None = None  # None: no [policy]: every client may do everything (docs/security.md)
    sasl: SaslSettings = field(default_factory=SaslSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    source: str = "<defaults>"  # where this configuration came from


# ---------------------------------------------------------------------------
# Value checks: each returns the converted value or raises _Invalid(expected).
# ---------------------------------------------------------------------------


class _Invalid(Exception):
    """``expected`` completes "expected ..., found <value>"; ``message`` (when
    given) replaces that sentence entirely."""

    def __init__(self, expected: str, message: str | None = None) -> None:
        self.expected = expected
        self.message = message


def _int(lo: int, hi: int | None, expected: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise _Invalid(expected)
        return value

    return check


def _seconds(positive: bool) -> Callable[[Any], float]:
    expected = "a positive number of seconds" if positive else "a non-negative number of seconds"

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _Invalid(expected)
        if value < 0 or (positive and value == 0):
            raise _Invalid(expected)
        return float(value)

    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("true or false")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    expected = "one of " + ", ".join(repr(c) for c in choices)

    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise _Invalid(expected)
        return value

    return check


def _router_id(value: Any) -> str:
    if not isinstance(value, str) or not ROUTER_ID_RE.fullmatch(value):
        raise _Invalid("a router id of 1 to 64 characters from A-Z a-z 0-9 . _ -")
    return value


def _nonempty_string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a non-empty string")
    return value


def _host(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value):
        raise _Invalid("a host name or IP address")
    return value


def _secret(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a non-empty string")
    return value


def _mechanisms(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(m, str) for m in value):
        raise _Invalid(f"a non-empty list of SASL mechanisms ({', '.join(SASL_MECHANISMS)})")
    for m in value:
        if m.upper() not in SASL_MECHANISMS:
            raise _Invalid(
                "", f"expected SASL mechanisms among {', '.join(SASL_MECHANISMS)}, found {m!r} (not one the router offers)"
            )
    names = tuple(m.upper() for m in value)
    if len(set(names)) != len(names):
        raise _Invalid("", f"expected each SASL mechanism once, found {', '.join(names)}")
    return names


def _realm(value: Any) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in "@ \t\n"):
        raise _Invalid("a realm: a non-empty name without '@' or spaces")
    return value


def _topic_list(value: Any) -> tuple[str, ...]:
    """A [[guarantee]] rule's topics: names or patterns (``+`` one level, ``#`` the rest)."""
    if not isinstance(value, list) or not value:
        raise _Invalid("a non-empty array of topic names or patterns")
    for topic in value:
        if not isinstance(topic, str) or not topic:
            raise _Invalid("", f"expected topic names or patterns (non-empty strings), found {_describe(topic)} in the array")
        problem = valid_pattern(topic)
        if problem:
            raise _Invalid("", f"expected topic names or patterns: {problem}")
    return tuple(value)


def _table_of(what: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise _Invalid(f"a table ([policy.{what}])")
    return value


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _level(value: Any) -> str:
    if not isinstance(value, str) or value.upper() not in LOG_LEVELS:
        raise _Invalid(f"a log level ({', '.join(LOG_LEVELS)}, in any case)")
    return value.upper()


def _module_levels(value: Any) -> dict[str, str]:
    """``[logging.modules]``: logger name -> level."""
    if not isinstance(value, dict):
        raise _Invalid('a table of logger names to levels, e.g. [logging.modules] "eorouter.server" = "DEBUG"')
    out = {}
    for name, level in value.items():
        if not name.strip():
            raise _Invalid("non-empty logger names")
        try:
            out[name] = _level(level)
        except _Invalid:
            raise _Invalid(
                "", f"logger {name!r}: expected a log level ({', '.join(LOG_LEVELS)}), found {_describe(level)}"
            ) from None
    return out


_positive = _int(1, None, "a positive integer")
_uint_positive = _int(1, UINT_MAX, f"an integer from 1 to {UINT_MAX}")
_uint = _int(0, UINT_MAX, f"an integer from 0 to {UINT_MAX}")
_port = _int(0, 65535, "a port number from 0 to 65535 (0: any free port)")
_remote_port = _int(1, 65535, "a port number from 1 to 65535")

# section -> key -> check; a section's keys are all optional unless listed in _REQUIRED.
_SECTIONS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "router": {"id": _router_id, "data_dir": _nonempty_string, "idle_timeout": _seconds(positive=True)},
    "listener": {
        "host": _host,
        "port": _port,
        "role": _choice(LISTENER_ROLES),
        "tls_cert_file": _nonempty_string,
        "tls_key_file": _nonempty_string,
        "tls_key_password_file": _nonempty_string,
        "tls_ca_file": _nonempty_string,
        "tls_require_client_cert": _bool,
        "tls_min_protocol": _choice(TLS_PROTOCOLS),
        "tls_allow_plain": _bool,
        "sasl_mechanisms": _mechanisms,
        "sasl_allow_plain_in_clear": _bool,
    },
    "connector": {
        "host": _host,
        "port": _remote_port,
        "role": _choice(CONNECTOR_ROLES),
        "name": _nonempty_string,
        "tls": _bool,
        "tls_cert_file": _nonempty_string,
        "tls_key_file": _nonempty_string,
        "tls_key_password_file": _nonempty_string,
        "tls_ca_file": _nonempty_string,
        "tls_min_protocol": _choice(TLS_PROTOCOLS),
        "tls_server_name": _nonempty_string,
    },
    "network": {
        "secret": _secret,
        "secret_file": _nonempty_string,
        "reconnect_delay": _seconds(positive=True),
        "reconnect_max": _seconds(positive=True),
    },
    "limits": {
        "max_message_size": _positive,
        "max_in_flight_per_topic": _positive,
        "max_bytes_in_flight": _positive,
        "max_bytes_in_flight_per_topic": _positive,
        "publisher_credit_window": _uint_positive,
        "default_terminus_timeout": _uint,
        "max_terminus_timeout": _uint,
    },
    "delivery": {
        "no_subscribers": _choice(NO_SUBSCRIBER_OUTCOMES),
        "publisher_rcv_settle_mode": _choice(SETTLE_MODES),
        "record_linger": _seconds(positive=False),
        "drain_grace": _seconds(positive=False),
    },
    "eventlog": {"max_bytes": _positive, "retention": _positive, "fsync": _bool},
    "metrics": {"host": _host, "port": _port},
    "sasl": {"users_db": _nonempty_string, "realm": _realm, "login_failure_delay": _seconds(positive=False)},
    "policy": {
        "default_group": _nonempty_string,
        "users": lambda v: _table_of("users", v),
        "groups": lambda v: _table_of("groups", v),
    },
    "logging": {
        "level": _level,
        "format": _choice(("text", "json")),
        "modules": _module_levels,
        "slow_subscriber_age": _seconds(positive=False),
    },
    "guarantee": {"topics": _topic_list, "mode": _choice(GUARANTEE_MODES)},
    "failover": {
        "placeholder_timeout": _seconds(positive=True),
        "publisher_resume_timeout": _seconds(positive=False),
        "stream_seq_timeout": _seconds(positive=True),
        "resume_horizon": _seconds(positive=True),
        "remembered_streams": _positive,
        "forgotten_streams": _positive,
    },
}
_REQUIRED = {"router": ("id",), "connector": ("host", "port", "role"), "metrics": ("port",), "guarantee": ("topics", "mode")}
_ARRAYS = {"listener", "connector", "guarantee"}  # sections written as arrays of tables ([[listener]])


def _describe(value: Any) -> str:
    """A found value as the user wrote it, TOML-ish."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "...'"
    if isinstance(value, (int, float)):
        return repr(value)
    return f"{value!s} (a {type(value).__name__})"


# ---------------------------------------------------------------------------
# Parsing.
# ---------------------------------------------------------------------------


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str | None, message: str) -> ConfigError:
        where = f"{self.source}: {key}: " if key else f"{self.source}: "
        return ConfigError(where + message, source=self.source, key=key)

    def unknown(self, key_path: str, known: list[str], section: str | None) -> ConfigError:
        """An unknown section (``section`` None) or key, with the likeliest intended
        one: a close spelling in the same table, else the same key in another table
        (``router.max_bytes`` -> ``eventlog.max_bytes``)."""
        prefix, _, leaf = key_path.rpartition(".")
        guess = difflib.get_close_matches(leaf, known, n=1)
        suggestion: str | None
        if guess:
            suggestion = f"{prefix}.{guess[0]}" if prefix else guess[0]
        else:
            elsewhere = [f"{s}.{leaf}" for s, keys in _SECTIONS.items() if leaf in keys and s != section]
            suggestion = elsewhere[0] if elsewhere else None
        hint = f" (did you mean '{suggestion}'?)" if suggestion else ""
        if section is not None and leaf in _SECTIONS:
            # TOML puts every key after a [table] header into that table.
            hint = (
                f" ('{leaf}' is a table of its own: write [{leaf}] or [[{leaf}]], or put the key before the first [table] header)"
            )
        if section is None:
            return self.error(None, f"unknown section '{key_path}'{hint}; known sections: " + ", ".join(_SECTIONS))
        return self.error(key_path, f"unknown key{hint}; known keys in [{section}]: " + ", ".join(known))

    def table(self, value: Any, key_path: str, section: str) -> dict[str, Any]:
        """Check one table of ``section`` and return its converted values."""
        if not isinstance(value, dict):
            raise self.error(key_path, f"expected a table, found {_describe(value)}")
        checks = _SECTIONS[section]
        out = {}
        for key, raw in value.items():
            path = f"{key_path}.{key}"
            if key not in checks:
                raise self.unknown(path, list(checks), section)
            try:
                out[key] = checks[key](raw)
            except _Invalid as bad:
                raise self.error(path, bad.message or f"expected {bad.expected}, found {_describe(raw)}") from None
        for key in _REQUIRED.get(section, ()):
            if key not in out:
                raise self.error(f"{key_path}.{key}", "required key is missing")
        return out


def parse_config(data: dict, source: str, *, base_dir: str | os.PathLike | None = None) -> RouterConfig:
    """Validate a decoded TOML document and build the RouterConfig.

    ``source`` names the document in error messages. A relative ``data_dir`` is
    taken relative to ``base_dir``, by default the directory of ``source``."""
    p = _Parser(source)
    if not isinstance(data, dict):
        raise p.error(None, f"expected a TOML document (a table), found {_describe(data)}")
    for section in data:
        if section not in _SECTIONS:
            raise p.unknown(section, list(_SECTIONS), None)

    if "router" not in data:
        raise p.error("router.id", 'required key is missing (add a [router] table with id = "...")')
    router = p.table(data["router"], "router", "router")
    limits = p.table(data.get("limits", {}), "limits", "limits")
    delivery = p.table(data.get("delivery", {}), "delivery", "delivery")
    log = p.table(data.get("eventlog", {}), "eventlog", "eventlog")
    metrics = MetricsSettings(**p.table(data["metrics"], "metrics", "metrics")) if "metrics" in data else None
    logging_settings = LoggingSettings(**p.table(data.get("logging", {}), "logging", "logging"))
    policy = _policy(p, p.table(data["policy"], "policy", "policy")) if "policy" in data else None

    if base_dir is None:
        base_dir = Path(source).absolute().parent
    listeners = _listeners(p, data, Path(base_dir))
    connectors = _connectors(p, data, Path(base_dir))
    sasl = _sasl(p, data, listeners, Path(base_dir))

    default_timeout = limits.get("default_terminus_timeout", _CORE_DEFAULTS.default_terminus_timeout)
    max_timeout = limits.get("max_terminus_timeout", _CORE_DEFAULTS.max_terminus_timeout)
    if default_timeout > max_timeout:
        key = "limits.default_terminus_timeout" if "default_terminus_timeout" in limits else "limits.max_terminus_timeout"
        raise p.error(
            key, f"expected default_terminus_timeout ({default_timeout}) to be at most max_terminus_timeout ({max_timeout})"
        )

    max_size = limits.get("max_message_size", _CORE_DEFAULTS.max_message_size)
    topic_bytes = limits.get("max_bytes_in_flight_per_topic", _CORE_DEFAULTS.max_bytes_in_flight_per_topic)
    router_bytes = limits.get("max_bytes_in_flight", _CORE_DEFAULTS.max_bytes_in_flight)
    for key, budget in (("max_bytes_in_flight_per_topic", topic_bytes), ("max_bytes_in_flight", router_bytes)):
        if budget < max_size:
            raise p.error(
                f"limits.{key}" if key in limits else "limits.max_message_size",
                f"expected {key} ({budget}) to be at least max_message_size ({max_size}): "
                "a largest message must fit in the budget",
            )

    router_id = router["id"]
    network = _network(p, data, listeners, connectors, Path(base_dir))
    data_dir = Path(router.get("data_dir", f"./data/{router_id}")).expanduser()
    if not data_dir.is_absolute():
        data_dir = Path(base_dir).absolute() / data_dir

    failover = p.table(data.get("failover", {}), "failover", "failover")
    core = CoreSettings(
        guarantees=_guarantees(p, data),
        router_id=router_id,
        max_in_flight_per_topic=limits.get("max_in_flight_per_topic", _CORE_DEFAULTS.max_in_flight_per_topic),
        max_bytes_in_flight=limits.get("max_bytes_in_flight", _CORE_DEFAULTS.max_bytes_in_flight),
        max_bytes_in_flight_per_topic=limits.get("max_bytes_in_flight_per_topic", _CORE_DEFAULTS.max_bytes_in_flight_per_topic),
        publisher_credit_window=limits.get("publisher_credit_window", _CORE_DEFAULTS.publisher_credit_window),
        max_message_size=limits.get("max_message_size", _CORE_DEFAULTS.max_message_size),
        default_terminus_timeout=default_timeout,
        max_terminus_timeout=max_timeout,
        no_subscribers=outcomes.BY_NAME[delivery["no_subscribers"]]
        if "no_subscribers" in delivery
        else _CORE_DEFAULTS.no_subscribers,
        record_linger=delivery.get("record_linger", _CORE_DEFAULTS.record_linger),
        publisher_rcv_settle_mode=delivery.get("publisher_rcv_settle_mode", _CORE_DEFAULTS.publisher_rcv_settle_mode),
        placeholder_timeout=failover.get("placeholder_timeout", _CORE_DEFAULTS.placeholder_timeout),
        publisher_resume_timeout=failover.get("publisher_resume_timeout", _CORE_DEFAULTS.publisher_resume_timeout),
        stream_seq_timeout=failover.get("stream_seq_timeout", _CORE_DEFAULTS.stream_seq_timeout),
        resume_horizon=failover.get("resume_horizon", _CORE_DEFAULTS.resume_horizon),
        remembered_streams=failover.get("remembered_streams", _CORE_DEFAULTS.remembered_streams),
        forgotten_streams=failover.get("forgotten_streams", _CORE_DEFAULTS.forgotten_streams),
    )
    defaults = RouterConfig(router_id=router_id, data_dir=data_dir)
    return RouterConfig(
        router_id=router_id,
        data_dir=data_dir,
        idle_timeout=router.get("idle_timeout", defaults.idle_timeout),
        listeners=listeners,
        connectors=connectors,
        network=network,
        drain_grace=delivery.get("drain_grace", defaults.drain_grace),
        eventlog=EventLogSettings(**log),
        core=core,
        metrics=metrics,
        logging=logging_settings,
        policy=policy,
        sasl=sasl,
        source=source,
    )


def _guarantees(p: _Parser, data: dict) -> tuple[GuaranteeRule, ...]:
    """``[[guarantee]]``: rules of topics and a mode, the first that takes a topic wins
    (docs/guarantees.md)."""
    raw = data.get("guarantee", [])
    if isinstance(raw, dict):
        raise p.error("guarantee", "expected an array of tables (write [[guarantee]], not [guarantee]), found a table")
    if not isinstance(raw, list):
        raise p.error("guarantee", f"expected an array of tables ([[guarantee]]), found {_describe(raw)}")
    rules = []
    for i, entry in enumerate(raw):
        values = p.table(entry, f"guarantee[{i}]", "guarantee")
        rules.append(GuaranteeRule(values["topics"], values["mode"]))
    return tuple(rules)


def _listeners(p: _Parser, data: dict, base_dir: Path) -> tuple[Listener, ...]:
    if "listener" not in data:
        return (Listener(),)
    raw = data["listener"]
    if isinstance(raw, dict):
        raise p.error("listener", "expected an array of tables (write [[listener]], not [listener]), found a table")
    if not isinstance(raw, list):
        raise p.error("listener", f"expected an array of tables ([[listener]]), found {_describe(raw)}")
    if not raw:
        raise p.error("listener", "expected at least one listener, found an empty array")
    listeners = []
    seen: dict[tuple[str, int], int] = {}
    for i, entry in enumerate(raw):
        values = p.table(entry, f"listener[{i}]", "listener")
        values["tls"] = _tls(p, values, f"listener[{i}]", base_dir, listener=True)
        listener = Listener(**values)
        endpoint = (listener.host, listener.port)
        if listener.port and endpoint in seen:
            raise p.error(f"listener[{i}]", f"duplicates listener[{seen[endpoint]}] ({listener.host}:{listener.port})")
        seen[endpoint] = i
        listeners.append(listener)
    return tuple(listeners)


def _connectors(p: _Parser, data: dict, base_dir: Path) -> tuple[Connector, ...]:
    if "connector" not in data:
        return ()
    raw = data["connector"]
    if isinstance(raw, dict):
        raise p.error("connector", "expected an array of tables (write [[connector]], not [connector]), found a table")
    if not isinstance(raw, list):
        raise p.error("connector", f"expected an array of tables ([[connector]]), found {_describe(raw)}")
    connectors = []
    by_endpoint: dict[tuple[str, int], int] = {}
    by_name: dict[str, int] = {}
    for i, entry in enumerate(raw):
        values = p.table(entry, f"connector[{i}]", "connector")
        values.setdefault("name", f"{values['host']}:{values['port']}")
        values["tls"] = _tls(p, values, f"connector[{i}]", base_dir, listener=False)
        connector = Connector(**values)
        endpoint = (connector.host, connector.port)
        if endpoint in by_endpoint:
            raise p.error(f"connector[{i}]", f"duplicates connector[{by_endpoint[endpoint]}] ({connector.host}:{connector.port})")
        if connector.name in by_name:
            raise p.error(
                f"connector[{i}].name",
                f"expected a name no other connector has, found {_describe(connector.name)} "
                f"(also connector[{by_name[connector.name]}])",
            )
        by_endpoint[endpoint] = i
        by_name[connector.name] = i
        connectors.append(connector)
    return tuple(connectors)


def _tls(p: _Parser, values: dict, where: str, base_dir: Path, *, listener: bool) -> TlsSettings | None:
    """Take the ``tls_*`` keys out of ``values`` as TlsSettings: a listener speaks TLS
    once it has a certificate, a connector once ``tls = true``; files must exist."""
    keys = {k: values.pop(k) for k in list(values) if k.startswith("tls_")}
    enabled = values.pop("tls", False) if not listener else "tls_cert_file" in keys
    if not enabled:
        if keys:
            first = sorted(keys)[0]
            need = "tls_cert_file (and tls_key_file)" if listener else "tls = true"
            raise p.error(f"{where}.{first}", f"TLS settings without TLS: add {need}")
        return None
    paths: dict = {}
    for key in ("tls_cert_file", "tls_key_file", "tls_key_password_file", "tls_ca_file"):
        if key in keys:
            path = Path(keys[key]).expanduser()
            path = path if path.is_absolute() else (base_dir / path).absolute()
            if not path.is_file():
                raise p.error(f"{where}.{key}", f"no such file: {path}")
            paths[key[len("tls_") :]] = path
    if ("cert_file" in paths) != ("key_file" in paths):
        missing = "tls_key_file" if "cert_file" in paths else "tls_cert_file"
        raise p.error(f"{where}.{missing}", "required key is missing (a certificate goes with its key)")
    if keys.get("tls_require_client_cert") and "ca_file" not in paths:
        raise p.error(
            f"{where}.tls_ca_file",
            "required key is missing: tls_require_client_cert needs the CAs that client certificates must come from",
        )
    if not listener and "ca_file" not in paths:
        raise p.error(
            f"{where}.tls_ca_file", "required key is missing: a TLS connector verifies the server's certificate against these CAs"
        )
    # Between routers TLS is mutual: each side's certificate names the router it is.
    if not listener and "cert_file" not in paths:
        raise p.error(
            f"{where}.tls_cert_file",
            "required key is missing: over TLS a router presents its own certificate, whose common name is its router id",
        )
    if listener and values.get("role") == "inter-router" and not keys.get("tls_require_client_cert"):
        raise p.error(
            f"{where}.tls_require_client_cert",
            "expected true on a TLS inter-router listener: the routers dialling it must present certificates naming them",
        )
    return TlsSettings(
        **paths,
        require_client_cert=keys.get("tls_require_client_cert", False),
        min_protocol=keys.get("tls_min_protocol", "TLSv1.2"),
        allow_plain=keys.get("tls_allow_plain", False),
        server_name=keys.get("tls_server_name"),
    )


def _sasl(p: _Parser, data: dict, listeners: tuple[Listener, ...], base_dir: Path) -> SaslSettings:
    """``[sasl]``, and each listener's logins against it: a password mechanism needs
    the sasldb, PLAIN needs TLS (or an explicit allowance), EXTERNAL a client certificate."""
    values = p.table(data.get("sasl", {}), "sasl", "sasl")
    users_db = None
    if "users_db" in values:
        users_db = (base_dir / Path(values["users_db"]).expanduser()).absolute()
        if not users_db.is_file():
            raise p.error("sasl.users_db", f"no such file: {users_db} (make it with `eorouter passwd --db {users_db} NAME`)")
    for i, lst in enumerate(listeners):
        where = f"listener[{i}]"
        mechs = lst.sasl_mechanisms
        if lst.role == "inter-router":
            if mechs != ("ANONYMOUS",) or lst.sasl_allow_plain_in_clear:
                raise p.error(
                    f"{where}.sasl_mechanisms",
                    "expected no SASL settings on an inter-router listener: routers prove who they are with "
                    "mutual TLS and the network secret (docs/security.md)",
                )
            continue
        password = [m for m in mechs if m in SASL_PASSWORD_MECHANISMS]
        if password and users_db is None:
            raise p.error(
                "sasl.users_db",
                f"required key is missing: {where} offers {', '.join(password)}, which check passwords in a sasldb",
            )
        if "PLAIN" in mechs and lst.tls is None and not lst.sasl_allow_plain_in_clear:
            raise p.error(
                f"{where}.sasl_mechanisms",
                "expected PLAIN only on a TLS listener: it sends the password as is (add TLS, or set "
                "sasl_allow_plain_in_clear = true to accept that)",
            )
        if lst.sasl_allow_plain_in_clear and "PLAIN" not in mechs:
            raise p.error(f"{where}.sasl_allow_plain_in_clear", "expected only with PLAIN among sasl_mechanisms")
        if "EXTERNAL" in mechs and (lst.tls is None or not lst.tls.require_client_cert):
            raise p.error(
                f"{where}.sasl_mechanisms",
                "expected EXTERNAL only with tls_require_client_cert = true: it takes the user from the client's certificate",
            )
    values["users_db"] = users_db
    return SaslSettings(**values)


_GROUP_KEYS = {"publish", "subscribe", "max_connections", "max_links", "max_message_size", "admin"}


def _policy(p: _Parser, values: dict) -> Policy:
    """``[policy]``: ``users`` (user -> its groups), ``groups.<name>`` (publish and
    subscribe patterns, max_connections, admin), ``default_group``."""
    groups: dict[str, Group] = {}
    for name, body in values.get("groups", {}).items():
        where = f"policy.groups.{name}"
        if not isinstance(body, dict):
            raise p.error(where, f"expected a table, found {_describe(body)}")
        for key in body:
            if key not in _GROUP_KEYS:
                raise p.unknown(f"{where}.{key}", sorted(_GROUP_KEYS), None)
        patterns = {}
        for key in ("publish", "subscribe"):
            raw = body.get(key, [])
            if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
                raise p.error(f"{where}.{key}", f"expected a list of topic names or patterns, found {_describe(raw)}")
            for pattern in raw:
                why = valid_pattern(pattern)
                if why:
                    raise p.error(f"{where}.{key}", f"expected topic names or patterns, found {why}")
            patterns[key] = tuple(raw)
        limits = {}
        for key, lowest in (("max_connections", 0), ("max_links", 0), ("max_message_size", 1)):
            limit = body.get(key)
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < lowest):
                raise p.error(f"{where}.{key}", f"expected an integer >= {lowest}, found {_describe(limit)}")
            limits[key] = limit
        admin = body.get("admin", False)
        if not isinstance(admin, bool):
            raise p.error(f"{where}.admin", f"expected true or false, found {_describe(admin)}")
        groups[name] = Group(
            name,
            patterns["publish"],
            patterns["subscribe"],
            limits["max_connections"],
            admin,
            limits["max_links"],
            limits["max_message_size"],
        )
    users: dict[str, tuple[str, ...]] = {}
    for user, names in values.get("users", {}).items():
        where = f"policy.users.{user}"
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            raise p.error(where, f"expected a list of group names, found {_describe(names)}")
        for name in names:
            if name not in groups:
                raise p.error(
                    where, f"expected groups of [policy.groups], found {name!r} (groups: {', '.join(sorted(groups)) or 'none'})"
                )
        users[user] = tuple(names)
    default = values.get("default_group")
    if default is not None and default not in groups:
        raise p.error("policy.default_group", f"expected a group of [policy.groups], found {default!r}")
    return Policy(groups, users, default)


def _network(
    p: _Parser, data: dict, listeners: tuple[Listener, ...], connectors: tuple[Connector, ...], base_dir: Path
) -> NetworkSettings:
    """``[network]``; the secret is required as soon as anything speaks inter-router."""
    values = p.table(data.get("network", {}), "network", "network")
    defaults = NetworkSettings()
    delay = values.get("reconnect_delay", defaults.reconnect_delay)
    ceiling = values.get("reconnect_max", defaults.reconnect_max)
    if delay > ceiling:
        key = "network.reconnect_delay" if "reconnect_delay" in values else "network.reconnect_max"
        raise p.error(key, f"expected reconnect_delay ({delay:g}) to be at most reconnect_max ({ceiling:g})")
    if "secret" in values and "secret_file" in values:
        raise p.error("network.secret_file", "expected either network.secret or network.secret_file, found both")
    secret = values.get("secret")
    if "secret_file" in values:
        path = Path(values["secret_file"]).expanduser()
        if not path.is_absolute():
            path = base_dir.absolute() / path
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise p.error("network.secret_file", f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise p.error(
                "network.secret_file", f"expected a UTF-8 text file, found bytes that are not UTF-8 in {path}"
            ) from None
        secret = text.strip()
        if not secret:
            raise p.error("network.secret_file", f"expected a non-empty secret, found an empty file ({path})")
    if secret is None:
        # Mutual TLS alone identifies routers (each certificate names its router id):
        # the secret is then an optional second factor. Without TLS it is the only one.
        needs = [f"listener[{i}]" for i, lst in enumerate(listeners) if lst.role == "inter-router" and lst.tls is None]
        needs += [f"connector[{i}]" for i, c in enumerate(connectors) if c.tls is None or c.tls.cert_file is None]
        if needs:
            raise p.error(
                "network.secret",
                "required key is missing (needed by the inter-router "
                + ", ".join(needs)
                + ": routers prove a shared secret when they connect, unless every inter-router listener and "
                "connector uses mutual TLS; set network.secret or network.secret_file)",
            )
    return NetworkSettings(secret=secret, reconnect_delay=delay, reconnect_max=ceiling)


_SYNTAX_POSITION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")


def _syntax_error(exc: tomllib.TOMLDecodeError, text: str, source: str) -> ConfigError:
    """tomllib (3.11) puts the position only in the message: "... (at line 3,
    column 7)" or "... (at end of document)"."""
    message = str(exc)
    match = _SYNTAX_POSITION.search(message)
    if not match:
        return ConfigError(f"{source}: TOML syntax error: {message}", source=source)
    if match.group(1):
        line, column = int(match.group(1)), int(match.group(2))
    else:
        lines = text.split("\n")
        line, column = len(lines), len(lines[-1]) + 1
    detail = message[: match.start()]
    return ConfigError(
        f"{source}, line {line}, column {column}: TOML syntax error: {detail}", source=source, line=line, column=column
    )


def load_config(path: str | os.PathLike) -> RouterConfig:
    """Read and validate a TOML config file (relative paths in it are relative to
    the file's directory)."""
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config file: {exc.strerror or exc}", source=source) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{source}, line {line}: not valid UTF-8 (TOML files are UTF-8)", source=source, line=line) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(exc, text, source) from None
    return parse_config(data, source, base_dir=path.absolute().parent)
