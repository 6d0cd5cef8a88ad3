"""router.config: the TOML file, its defaults, and the error messages."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from router import eventlog
from router.config import (
    ConfigError,
    Connector,
    EventLogSettings,
    Listener,
    NetworkSettings,
    RouterConfig,
    load_config,
    parse_config,
)
from router.core import outcomes
from router.core.settings import CoreSettings

FULL = """\
[router]
id = "A"
data_dir = "/var/lib/eorouter/A"
idle_timeout = 2.5

[[listener]]
host = "0.0.0.0"
port = 5673
role = "normal"

[[listener]]
host = "::1"
port = 0

[limits]
max_message_size = 2048
max_in_flight_per_topic = 10
publisher_credit_window = 5
default_terminus_timeout = 30
max_terminus_timeout = 600

[delivery]
no_subscribers = "rejected"
record_linger = 0.5
drain_grace = 1

[eventlog]
max_bytes = 1000000
retention = 3
fsync = true
"""


def write(tmp_path: Path, text: str, name: str = "router.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))  # every message names the file
    return info.value


def test_full_file(tmp_path):
    config = load_config(write(tmp_path, FULL))
    assert config == RouterConfig(
        router_id="A",
        data_dir=Path("/var/lib/eorouter/A"),
        idle_timeout=2.5,
        listeners=(Listener("0.0.0.0", 5673, "normal"), Listener("::1", 0, "normal")),
        drain_grace=1.0,
        eventlog=EventLogSettings(max_bytes=1_000_000, retention=3, fsync=True),
        core=CoreSettings(
            router_id="A",
            max_in_flight_per_topic=10,
            publisher_credit_window=5,
            max_message_size=2048,
            default_terminus_timeout=30,
            max_terminus_timeout=600,
            no_subscribers=outcomes.REJECTED,
            record_linger=0.5,
        ),
        source=str(tmp_path / "router.toml"),
    )
    assert isinstance(config.drain_grace, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.router_id = "B"


def test_defaults(tmp_path):
    config = load_config(write(tmp_path, '[router]\nid = "node-1.eu_west"\n'))
    assert config.router_id == "node-1.eu_west"
    assert config.data_dir == tmp_path / "data" / "node-1.eu_west"
    assert config.idle_timeout == 2.0
    assert config.listeners == (Listener("127.0.0.1", 5672, "normal"),)  # loopback by default
    assert config.drain_grace == 5.0
    assert config.eventlog == EventLogSettings(eventlog.DEFAULT_MAX_BYTES, eventlog.DEFAULT_RETENTION, False)
    assert config.core == dataclasses.replace(CoreSettings(), router_id="node-1.eu_west")
    assert config.core.no_subscribers == outcomes.RELEASED


@pytest.mark.parametrize("name", ["released", "rejected", "accepted", "modified"])
def test_no_subscribers_maps_to_outcome_codes(tmp_path, name):
    config = load_config(write(tmp_path, f'[router]\nid = "A"\n[delivery]\nno_subscribers = "{name}"\n'))
    assert config.core.no_subscribers == outcomes.BY_NAME[name]


def test_relative_data_dir_is_relative_to_the_config_file(tmp_path, monkeypatch):
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    monkeypatch.chdir(tmp_path)  # not the config's directory
    path = write(conf_dir, '[router]\nid = "A"\ndata_dir = "state/A"\n')
    assert load_config(path).data_dir == conf_dir / "state" / "A"
    assert load_config(Path("etc") / "router.toml").data_dir == conf_dir / "state" / "A"  # relative config path too
    home = load_config(write(conf_dir, '[router]\nid = "A"\ndata_dir = "~/eo"\n'))
    assert home.data_dir == Path.home() / "eo"


def test_parse_config_without_a_file(tmp_path):
    config = parse_config({"router": {"id": "A"}}, "<test>", base_dir=tmp_path)
    assert config.data_dir == tmp_path / "data" / "A"
    assert config.source == "<test>"
    with pytest.raises(ConfigError, match=r"^<test>: router\.id: required key is missing"):
        parse_config({"router": {}}, "<test>")


BAD_VALUES = [
    # (section line(s), key path, expected fragment, found fragment)
    ('[router]\nid = "has space"', "router.id", "a router id", "found 'has space'"),
    ('[router]\nid = ""', "router.id", "a router id", "found ''"),
    ('[router]\nid = "' + "x" * 65 + '"', "router.id", "a router id", "found 'xxx"),
    ("[router]\nid = 7", "router.id", "a router id", "found 7"),
    ('[router]\nid = "A"\ndata_dir = 3', "router.data_dir", "a non-empty string", "found 3"),
    ('[router]\nid = "A"\ndata_dir = ""', "router.data_dir", "a non-empty string", "found ''"),
    ('[router]\nid = "A"\nidle_timeout = 0', "router.idle_timeout", "a positive number of seconds", "found 0"),
    ('[router]\nid = "A"\nidle_timeout = -1.5', "router.idle_timeout", "a positive number", "found -1.5"),
    ('[router]\nid = "A"\nidle_timeout = inf', "router.idle_timeout", "a positive number", "found inf"),
    ('[router]\nid = "A"\nidle_timeout = "abc"', "router.idle_timeout", "a positive number", "found 'abc'"),
    ('[router]\nid = "A"\nidle_timeout = true', "router.idle_timeout", "a positive number", "found true"),
    ('[router]\nid = "A"\n[[listener]]\nport = 65536', "listener[0].port", "a port number from 0 to 65535", "found 65536"),
    ('[router]\nid = "A"\n[[listener]]\nport = -1', "listener[0].port", "a port number", "found -1"),
    ('[router]\nid = "A"\n[[listener]]\nport = "5672"', "listener[0].port", "a port number", "found '5672'"),
    (
        '[router]\nid = "A"\n[[listener]]\nport = 1\n[[listener]]\nhost = ""',
        "listener[1].host",
        "a host name or IP address",
        "found ''",
    ),
    ('[router]\nid = "A"\n[[listener]]\nrole = "broker"', "listener[0].role", "one of 'normal'", "found 'broker'"),
    ('[router]\nid = "A"\n[limits]\nmax_message_size = "abc"', "limits.max_message_size", "a positive integer", "found 'abc'"),
    ('[router]\nid = "A"\n[limits]\nmax_message_size = 0', "limits.max_message_size", "a positive integer", "found 0"),
    (
        '[router]\nid = "A"\n[limits]\nmax_message_size = 1.5e6',
        "limits.max_message_size",
        "a positive integer",
        "found 1500000.0",
    ),
    (
        '[router]\nid = "A"\n[limits]\nmax_in_flight_per_topic = -3',
        "limits.max_in_flight_per_topic",
        "a positive integer",
        "found -3",
    ),
    (
        '[router]\nid = "A"\n[limits]\npublisher_credit_window = 0',
        "limits.publisher_credit_window",
        "an integer from 1 to 4294967295",
        "found 0",
    ),
    (
        '[router]\nid = "A"\n[limits]\ndefault_terminus_timeout = -1',
        "limits.default_terminus_timeout",
        "an integer from 0 to 4294967295",
        "found -1",
    ),
    (
        '[router]\nid = "A"\n[limits]\nmax_terminus_timeout = 4294967296',
        "limits.max_terminus_timeout",
        "an integer from 0",
        "found 4294967296",
    ),
    (
        '[router]\nid = "A"\n[limits]\ndefault_terminus_timeout = 100\nmax_terminus_timeout = 50',
        "limits.default_terminus_timeout",
        "at most max_terminus_timeout (50)",
        "(100)",
    ),
    (
        '[router]\nid = "A"\n[delivery]\nno_subscribers = "dropped"',
        "delivery.no_subscribers",
        "one of 'released', 'rejected', 'accepted', 'modified'",
        "found 'dropped'",
    ),
    ('[router]\nid = "A"\n[delivery]\nno_subscribers = "none"', "delivery.no_subscribers", "one of", "found 'none'"),
    (
        '[router]\nid = "A"\n[delivery]\npublisher_rcv_settle_mode = "second"',
        "delivery.publisher_rcv_settle_mode",
        "one of 'resumable', 'first', 'as-requested'",
        "found 'second'",
    ),
    (
        '[router]\nid = "A"\n[delivery]\nrecord_linger = -0.1',
        "delivery.record_linger",
        "a non-negative number of seconds",
        "found -0.1",
    ),
    ('[router]\nid = "A"\n[delivery]\ndrain_grace = nan', "delivery.drain_grace", "a non-negative number", "found nan"),
    ('[router]\nid = "A"\n[eventlog]\nmax_bytes = 0', "eventlog.max_bytes", "a positive integer", "found 0"),
    ('[router]\nid = "A"\n[eventlog]\nretention = 0', "eventlog.retention", "a positive integer", "found 0"),
    ('[router]\nid = "A"\n[eventlog]\nfsync = "yes"', "eventlog.fsync", "true or false", "found 'yes'"),
    ('[router]\nid = "A"\n[eventlog]\nfsync = 1', "eventlog.fsync", "true or false", "found 1"),
    ('[router]\nid = "A"\nlimits = 5', "router.limits", "unknown key", "'limits' is a table of its own"),
    (
        '[router]\nid = "A"\n[limits]\nmax_message_size = 1979-05-27',
        "limits.max_message_size",
        "a positive integer",
        "found 1979-05-27",
    ),
    ('router = "A"', "router", "expected a table", "found 'A'"),
    ('[router]\nid = "A"\neventlog = 3', "router.eventlog", "unknown key", "known keys in [router]"),
]


@pytest.mark.parametrize("text,key,expected,found", BAD_VALUES, ids=[b[1] + ":" + b[3] for b in BAD_VALUES])
def test_wrong_types_and_ranges(tmp_path, text, key, expected, found):
    error = error_of(tmp_path, text + "\n")
    message = str(error)
    assert error.key == key
    assert f": {key}: " in message
    assert expected in message and found in message


def test_message_format_matches_the_documented_one(tmp_path):
    error = error_of(tmp_path, '[router]\nid = "A"\n[limits]\nmax_message_size = "abc"\n')
    assert str(error) == f"{tmp_path / 'router.toml'}: limits.max_message_size: expected a positive integer, found 'abc'"


def test_router_id_is_required(tmp_path):
    assert error_of(tmp_path, "[limits]\nmax_message_size = 10\n").key == "router.id"
    assert "required key is missing" in str(error_of(tmp_path, '[router]\ndata_dir = "x"\n'))


NETWORK = """\
[router]
id = "B"

[[listener]]
port = 0

[[listener]]
port = 5673
role = "inter-router"

[[connector]]
host = "10.0.0.1"
port = 5673
role = "inter-router"
name = "to-A"

[[connector]]
host = "10.0.0.2"
port = 5673
role = "inter-router"

[network]
secret = "s3cret"
reconnect_delay = 0.25
reconnect_max = 8
"""


def test_inter_router_listeners_connectors_and_network(tmp_path):
    config = load_config(write(tmp_path, NETWORK))
    assert config.listeners == (Listener("127.0.0.1", 0, "normal"), Listener("127.0.0.1", 5673, "inter-router"))
    assert config.connectors == (
        Connector("10.0.0.1", 5673, "inter-router", "to-A"),
        Connector("10.0.0.2", 5673, "inter-router", "10.0.0.2:5673"),
    )
    assert config.network == NetworkSettings(secret="s3cret", reconnect_delay=0.25, reconnect_max=8.0)
    assert "s3cret" not in repr(config), "the secret is never printed"


def test_network_defaults(tmp_path):
    config = load_config(write(tmp_path, '[router]\nid = "A"\n'))
    assert config.connectors == ()
    assert config.network == NetworkSettings(secret=None, reconnect_delay=0.5, reconnect_max=2.0)


def test_secret_file_is_relative_to_the_config_and_stripped(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "secret.txt").write_text("  s3cret from a file \n\n")
    path = write(
        tmp_path / "etc", '[router]\nid = "A"\n[[listener]]\nrole = "inter-router"\n[network]\nsecret_file = "secret.txt"\n'
    )
    assert load_config(path).network.secret == "s3cret from a file"


@pytest.mark.parametrize(
    "text,key,fragment",
    [
        (
            '[router]\nid = "A"\n[[listener]]\nrole = "inter-router"\n',
            "network.secret",
            "required key is missing (needed by the inter-router listener[0]",
        ),
        ('[router]\nid = "A"\n[[connector]]\nhost = "h"\nport = 1\nrole = "inter-router"\n', "network.secret", "connector[0]"),
        ('[router]\nid = "A"\n[network]\nsecret = "a"\nsecret_file = "b"\n', "network.secret_file", "found both"),
        ('[router]\nid = "A"\n[network]\nsecret_file = "missing.txt"\n', "network.secret_file", "cannot read"),
        ('[router]\nid = "A"\n[network]\nsecret = "   "\n', "network.secret", "a non-empty string"),
        ('[router]\nid = "A"\n[network]\nsecret = 5\n', "network.secret", "found 5"),
        ('[router]\nid = "A"\n[network]\nreconnect_delay = 0\n', "network.reconnect_delay", "a positive number of seconds"),
        (
            '[router]\nid = "A"\n[network]\nreconnect_delay = 3\n',
            "network.reconnect_delay",
            "reconnect_delay (3) to be at most reconnect_max (2)",
        ),
        ('[router]\nid = "A"\n[network]\nreconnect_max = 0.1\n', "network.reconnect_max", "at most reconnect_max"),
        ('[router]\nid = "A"\n[network]\nsecrt = "x"\n', "network.secrt", "did you mean 'network.secret'"),
        ('[router]\nid = "A"\n[[connector]]\nport = 1\nrole = "inter-router"\n', "connector[0].host", "required key is missing"),
        (
            '[router]\nid = "A"\n[[connector]]\nhost = "h"\nrole = "inter-router"\n',
            "connector[0].port",
            "required key is missing",
        ),
        ('[router]\nid = "A"\n[[connector]]\nhost = "h"\nport = 1\n', "connector[0].role", "required key is missing"),
        (
            '[router]\nid = "A"\n[[connector]]\nhost = "h"\nport = 1\nrole = "normal"\n',
            "connector[0].role",
            "expected one of 'inter-router', found 'normal'",
        ),
        (
            '[router]\nid = "A"\n[[connector]]\nhost = "h"\nport = 0\nrole = "inter-router"\n',
            "connector[0].port",
            "a port number from 1 to 65535, found 0",
        ),
        (
            '[router]\nid = "A"\n[[connector]]\nhost = "h"\nport = 1\nrole = "inter-router"\nname = ""\n',
            "connector[0].name",
            "a non-empty string",
        ),
        (
            '[router]\nid = "A"\n[[connector]]\nhost = "h"\nport = 1\nrole = "inter-router"\nhots = 1\n',
            "connector[0].hots",
            "did you mean 'connector[0].host'",
        ),
        ('[router]\nid = "A"\n[connector]\nhost = "h"\n', "connector", "write [[connector]]"),
        (
            '[router]\nid = "A"\n[network]\n[[connector]]\nhost = "h"\nport = 1\nrole = "inter-router"\n'
            '[[connector]]\nhost = "h"\nport = 1\nrole = "inter-router"\n',
            "connector[1]",
            "duplicates connector[0]",
        ),
        (
            '[router]\nid = "A"\n[[connector]]\nhost = "h"\nport = 1\nrole = "inter-router"\nname = "x"\n'
            '[[connector]]\nhost = "h"\nport = 2\nrole = "inter-router"\nname = "x"\n',
            "connector[1].name",
            "no other connector has",
        ),
    ],
)
def test_network_errors(tmp_path, text, key, fragment):
    error = error_of(tmp_path, text)
    assert error.key == key, str(error)
    assert fragment in str(error), str(error)


def test_listener_shape_errors(tmp_path):
    assert "write [[listener]]" in str(error_of(tmp_path, '[router]\nid = "A"\n[listener]\nport = 1\n'))
    assert "at least one listener" in str(error_of(tmp_path, 'listener = []\n[router]\nid = "A"\n'))
    assert "listener[0]: expected a table, found 1" in str(error_of(tmp_path, 'listener = [1]\n[router]\nid = "A"\n'))
    assert "found 5" in str(error_of(tmp_path, 'listener = 5\n[router]\nid = "A"\n'))
    dup = error_of(tmp_path, '[router]\nid = "A"\n[[listener]]\nport = 5\n[[listener]]\nport = 5\n')
    assert dup.key == "listener[1]" and "duplicates listener[0] (127.0.0.1:5)" in str(dup)
    # Several ephemeral listeners on one host are fine: each gets its own port.
    config = load_config(write(tmp_path, '[router]\nid = "A"\n[[listener]]\nport = 0\n[[listener]]\nport = 0\n'))
    assert len(config.listeners) == 2


@pytest.mark.parametrize(
    "text,key,suggestion",
    [
        ('[router]\nid = "A"\n[limits]\nmax_mesage_size = 3', "limits.max_mesage_size", "limits.max_message_size"),
        ('[router]\nid = "A"\nidle_timout = 3', "router.idle_timout", "router.idle_timeout"),
        ('[router]\nid = "A"\n[[listener]]\nhots = "h"', "listener[0].hots", "listener[0].host"),
        ('[router]\nid = "A"\n[delivery]\nno_subscriber = "released"', "delivery.no_subscriber", "delivery.no_subscribers"),
        ('[router]\nid = "A"\nmax_bytes = 3', "router.max_bytes", "eventlog.max_bytes"),  # wrong table
        ('[router]\nid = "A"\n[event_log]\nfsync = true', None, "eventlog"),
        ('[routr]\nid = "A"', None, "router"),
    ],
)
def test_unknown_keys_are_errors_with_a_suggestion(tmp_path, text, key, suggestion):
    error = error_of(tmp_path, text + "\n")
    assert error.key == key
    assert "unknown" in str(error)
    assert f"(did you mean '{suggestion}'?)" in str(error)


def test_unknown_key_without_close_match(tmp_path):
    error = error_of(tmp_path, '[router]\nid = "A"\n[limits]\nzzz = 1\n')
    assert error.key == "limits.zzz"
    assert "did you mean" not in str(error)
    assert "known keys in [limits]: max_message_size" in str(error)


def test_toml_syntax_error_names_file_line_and_column(tmp_path):
    error = error_of(tmp_path, '[router]\nid = "A"\n[limits]\nmax_message_size = = 3\n')
    assert (error.line, error.column) == (4, 20)
    assert str(error).startswith(f"{tmp_path / 'router.toml'}, line 4, column 20: TOML syntax error: ")
    assert "(at line" not in str(error)

    unterminated = error_of(tmp_path, '[router]\nid = "A\n')
    assert unterminated.line == 2 and "TOML syntax error" in str(unterminated)

    duplicate = error_of(tmp_path, '[router]\nid = "A"\nid = "B"\n')
    assert duplicate.line == 3

    at_end = error_of(tmp_path, '[router]\nid = "A"\nx = [1,')
    assert at_end.line == 3 and at_end.column == 8


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[router]\nid = "\xe9"\n')
    with pytest.raises(ConfigError, match=r"line 2: not valid UTF-8") as info:
        load_config(path)
    assert info.value.line == 2


def test_failover_section(tmp_path):
    path = tmp_path / "router.toml"
    path.write_text('[router]\nid = "A"\n[failover]\nplaceholder_timeout = 12\npublisher_resume_timeout = 3.5\n')
    config = load_config(path)
    assert (config.core.placeholder_timeout, config.core.publisher_resume_timeout) == (12, 3.5)
    path.write_text('[router]\nid = "A"\n[failover]\nplaceholder_timeout = "soon"\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.key == "failover.placeholder_timeout"


def _sasl_config(tmp_path, listener: str, sasl: str = "") -> str:
    (tmp_path / "users.sasldb").write_bytes(b"")
    (tmp_path / "c.pem").write_text("")
    (tmp_path / "k.pem").write_text("")
    return f'[router]\nid = "A"\n{sasl}\n[[listener]]\nport = 0\n{listener}\n'


TLS_KEYS = 'tls_cert_file = "c.pem"\ntls_key_file = "k.pem"\n'


def test_sasl_settings(tmp_path):
    text = _sasl_config(
        tmp_path,
        TLS_KEYS + 'sasl_mechanisms = ["plain", "SCRAM-SHA-256"]',
        '[sasl]\nusers_db = "users.sasldb"\nrealm = "corp"\nlogin_failure_delay = 2\n',
    )
    (tmp_path / "r.toml").write_text(text)
    config = load_config(tmp_path / "r.toml")
    assert config.listeners[0].sasl_mechanisms == ("PLAIN", "SCRAM-SHA-256")
    assert config.sasl.users_db == tmp_path / "users.sasldb" and config.sasl.realm == "corp"
    assert config.sasl.login_failure_delay == 2.0
    assert parse_config({"router": {"id": "A"}}, "x.toml").listeners[0].sasl_mechanisms == ("ANONYMOUS",)


@pytest.mark.parametrize(
    "listener, sasl, key, fragment",
    [
        ('sasl_mechanisms = ["SCRAM-SHA-256"]', "", "sasl.users_db", "check passwords in a sasldb"),
        ('sasl_mechanisms = ["PLAIN"]', '[sasl]\nusers_db = "users.sasldb"', "listener[0].sasl_mechanisms", "only on a TLS"),
        ('sasl_mechanisms = ["EXTERNAL"]', "", "listener[0].sasl_mechanisms", "tls_require_client_cert"),
        ('sasl_mechanisms = ["GSSAPI"]', "", "listener[0].sasl_mechanisms", "'GSSAPI'"),
        ('sasl_mechanisms = ["PLAIN", "plain"]', "", "listener[0].sasl_mechanisms", "each SASL mechanism once"),
        ("sasl_mechanisms = []", "", "listener[0].sasl_mechanisms", "a non-empty list"),
        (
            'sasl_allow_plain_in_clear = true\nsasl_mechanisms = ["ANONYMOUS"]',
            "",
            "listener[0].sasl_allow_plain_in_clear",
            "PLAIN",
        ),
        ('role = "inter-router"\nsasl_mechanisms = ["PLAIN"]', "", "listener[0].sasl_mechanisms", "mutual TLS"),
        ("", '[sasl]\nusers_db = "nosuch.db"', "sasl.users_db", "eorouter passwd"),
        ("", '[sasl]\nrealm = "a b"', "sasl.realm", "without '@' or spaces"),
    ],
)
def test_sasl_errors(tmp_path, listener, sasl, key, fragment):
    error = error_of(tmp_path, _sasl_config(tmp_path, listener, sasl))
    assert error.key == key, str(error)
    assert fragment in str(error), str(error)


def test_plain_in_clear_when_asked_for(tmp_path):
    text = _sasl_config(
        tmp_path, 'sasl_mechanisms = ["PLAIN"]\nsasl_allow_plain_in_clear = true', '[sasl]\nusers_db = "users.sasldb"'
    )
    (tmp_path / "r.toml").write_text(text)
    assert load_config(tmp_path / "r.toml").listeners[0].sasl_allow_plain_in_clear


def test_policy_limits_per_group(tmp_path):
    text = (
        '[router]\nid = "A"\n[policy]\ndefault_group = "g"\n[policy.users]\nu = ["g", "h"]\n'
        "[policy.groups.g]\nmax_links = 3\nmax_message_size = 1000\n[policy.groups.h]\nmax_links = 5\nmax_message_size = 500\n"
    )
    policy = load_config(write(tmp_path, text)).policy
    assert policy.limit("u", "max_links") == (5, "h")  # the most generous group's
    assert policy.limit("u", "max_message_size") == (1000, "g")
    assert policy.limit("stranger", "max_links") == (3, "g")
    assert policy.limit("u", "max_connections") == (None, None)  # a group without one: no limit
    error = error_of(tmp_path, '[router]\nid = "A"\n[policy.groups.g]\nmax_message_size = 0\n')
    assert error.key == "policy.groups.g.max_message_size" and "an integer >= 1" in str(error)


def test_the_secret_is_optional_under_mutual_tls(tmp_path):
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("")
    tls = 'tls_cert_file = "c.pem"\ntls_key_file = "k.pem"\ntls_ca_file = "ca.pem"\n'
    mutual = (
        f'[router]\nid = "A"\n[[listener]]\nport = 0\nrole = "inter-router"\n{tls}tls_require_client_cert = true\n'
        f'[[connector]]\nhost = "h"\nport = 1\nrole = "inter-router"\ntls = true\n{tls}'
    )
    assert load_config(write(tmp_path, mutual)).network.secret is None
    plain = mutual.replace(f"tls = true\n{tls}", "")  # the connector without TLS: the secret is its only proof
    error = error_of(tmp_path, plain)
    assert error.key == "network.secret" and "connector[0]" in str(error) and "mutual TLS" in str(error)


def test_guarantee_rules_in_order(tmp_path):
    config = load_config(
        write(
            tmp_path,
            '[router]\nid = "A"\n[[guarantee]]\ntopics = ["metrics/#", "debug"]\nmode = "at-most-once"\n'
            '[[guarantee]]\ntopics = ["orders/+"]\nmode = "exactly-once"\n',
        )
    )
    assert [(r.topics, r.mode) for r in config.core.guarantees] == [
        (("metrics/#", "debug"), "at-most-once"),
        (("orders/+",), "exactly-once"),
    ]
    assert load_config(write(tmp_path, '[router]\nid = "A"\n')).core.guarantees == ()


@pytest.mark.parametrize(
    "body, key, fragment",
    [
        ('[guarantee]\ntopics = ["a"]\nmode = "at-most-once"\n', "guarantee", "write [[guarantee]]"),
        ('[[guarantee]]\ntopics = ["a"]\n', "guarantee[0].mode", "required key is missing"),
        ('[[guarantee]]\nmode = "at-most-once"\n', "guarantee[0].topics", "required key is missing"),
        ('[[guarantee]]\ntopics = []\nmode = "at-most-once"\n', "guarantee[0].topics", "non-empty array"),
        ('[[guarantee]]\ntopics = ["a/#/b"]\nmode = "at-most-once"\n', "guarantee[0].topics", "'#' must be a whole level"),
        ('[[guarantee]]\ntopics = [3]\nmode = "at-most-once"\n', "guarantee[0].topics", "found 3 in the array"),
        ('[[guarantee]]\ntopics = ["a"]\nmode = "maybe"\n', "guarantee[0].mode", "'at-least-once', 'at-most-once'"),
        ('[[guarantee]]\ntopics = ["a"]\nmode = "at-most-once"\nqos = 1\n', "guarantee[0].qos", "unknown"),
    ],
)
def test_guarantee_errors(tmp_path, body, key, fragment):
    error = error_of(tmp_path, '[router]\nid = "A"\n' + body)
    assert error.key == key, str(error)
    assert fragment in str(error), str(error)
