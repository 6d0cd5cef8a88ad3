"""eorouter_tools.topology: the topology file format of docs/configuration.md ("Topology files"),
checked as strictly as a router's config (issue 14: unknown keys were reported without
a suggestion, a disconnected topology waited forever, a bad router id failed only once
that router was started)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from eorouter_tools.topology import RoutesTail, Topology, TopologyError, load_topology, parse_topology

DOCS = Path(__file__).resolve().parents[2] / "docs"

ROUTERS = "".join(f'[[router]]\nid = "{r}"\n' for r in "ABCD")
RING = ROUTERS + "".join(f'[[link]]\nbetween = ["{a}", "{b}"]\n' for a, b in ("AB", "BC", "CD", "DA"))

# Each error message docs/configuration.md shows, and a file that gives exactly it.
DOCUMENTED = {
    "ring.toml: unknown key 'routers' (did you mean 'router'?); known keys: router, link, secret": '[[routers]]\nid = "A"\n',
    "ring.toml: link[0].betwen: unknown key (did you mean 'between'?); known keys in [[link]]: between": ROUTERS
    + '[[link]]\nbetwen = ["A", "B"]\n',
    "ring.toml: link[4].id: unknown key ('id' belongs in a [[router]] table); known keys in [[link]]: between": RING
    + '[[link]]\nid = "E"\n',
    "ring.toml: router[2].id: expected a router id of 1 to 64 characters from A-Z a-z 0-9 . _ -, "
    'found "router C"': '[[router]]\nid = "A"\n[[router]]\nid = "B"\n[[router]]\nid = "router C"\n',
    "ring.toml: link[4].between: 'B' is not a router of this file (did you mean 'B1'?); routers: A, B1, C, D": RING.replace(
        '"B"', '"B1"', 1
    )
    .replace('["A", "B"]', '["A", "B1"]')
    .replace('["B", "C"]', '["B1", "C"]')
    + '[[link]]\nbetween = ["A", "B"]\n',
    "ring.toml: link[1].between: the link A - B is already link[0]": ROUTERS
    + '[[link]]\nbetween = ["A", "B"]\n[[link]]\nbetween = ["B", "A"]\n',
    "ring.toml: link: no path of links from A to D (every router must reach every other one)": ROUTERS
    + '[[link]]\nbetween = ["A", "B"]\n[[link]]\nbetween = ["B", "C"]\n',
    "ring.toml, line 4, column 5: TOML syntax error: Expected '=' after a key in a key/value pair": (
        '[[router]]\nid = "A"\n\nfoo bar\n'
    ),
}

MORE = {
    "a secret below a header": (
        '[[router]]\nid = "A"\nsecret = "s"\n',
        "ring.toml: router[0].secret: unknown key ('secret' is a top-level key: put it before the first [[...]] "
        "header); known keys in [[router]]: id",
    ),
    "a table for routers": (
        '[router]\nid = "A"\n',
        "ring.toml: router: expected an array of tables (write [[router]], not [router]), found a table",
    ),
    "an array of strings for routers": (
        'router = ["A", "B"]\n',
        'ring.toml: router: expected an array of tables ([[router]]), found ["A", "B"]',
    ),
    "a router twice": ('[[router]]\nid = "A"\n[[router]]\nid = "A"\n', "ring.toml: router[1].id: 'A' is already router[0]'s id"),
    "no router": ("", 'ring.toml: router: required key is missing (add one [[router]] table with id = "..." per router)'),
    "a router without id": ('[[router]]\nid = "A"\n[[router]]\n', "ring.toml: router[1].id: required key is missing"),
    "an unknown key in a router": (
        '[[router]]\nid = "A"\nname = "alpha"\n',
        "ring.toml: router[0].name: unknown key; known keys in [[router]]: id",
    ),
    "a link of three": (
        ROUTERS + '[[link]]\nbetween = ["A", "B", "C"]\n',
        'ring.toml: link[0].between: expected two different router ids, as in ["A", "B"], found ["A", "B", "C"]',
    ),
    "a link to itself": (
        ROUTERS + '[[link]]\nbetween = ["A", "A"]\n',
        'ring.toml: link[0].between: expected two different router ids, as in ["A", "B"], found ["A", "A"]',
    ),
    "a link without between": (ROUTERS + "[[link]]\n", "ring.toml: link[0].between: required key is missing"),
    "a secret that is a number": (
        'secret = 7\n[[router]]\nid = "A"\n',
        "ring.toml: secret: expected a non-empty string, found 7",
    ),
    "a blank secret": ('secret = "  "\n[[router]]\nid = "A"\n', 'ring.toml: secret: expected a non-empty string, found "  "'),
}


def documented_messages() -> list[str]:
    text = (DOCS / "configuration.md").read_text()
    section = text[text.index("## Topology files") : text.index("## Environment")]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)
    return [line for lang, body in blocks if not lang for line in body.splitlines() if line]


def documented_example() -> str:
    text = (DOCS / "configuration.md").read_text()
    section = text[text.index("## Topology files") : text.index("## Environment")]
    return re.search(r"```toml\n(.*?)```", section, re.S).group(1)


def test_every_documented_message_is_tested():
    assert documented_messages() == list(DOCUMENTED)


@pytest.mark.parametrize("message", list(DOCUMENTED))
def test_documented_message(message):
    with pytest.raises(TopologyError) as info:
        parse_topology(DOCUMENTED[message], "ring.toml")
    assert str(info.value) == message


@pytest.mark.parametrize("case", list(MORE))
def test_bad_topology(case):
    text, message = MORE[case]
    with pytest.raises(TopologyError) as info:
        parse_topology(text, "ring.toml")
    assert str(info.value) == message


def test_the_documented_example():
    assert parse_topology(documented_example()) == Topology(("A", "B", "C"), (("A", "B"), ("B", "C")), "change-me")


def test_the_ring_file_and_the_default():
    ring = load_topology(str(DOCS / "topology-ring.toml"))
    assert ring == Topology(("A", "B", "C", "D"), (("A", "B"), ("B", "C"), ("C", "D"), ("A", "D")))
    assert ring.neighbours("A") == ["B", "D"]
    default = load_topology(None)
    assert default.routers == ("A", "B", "C") and len(default.links) == 3 and default.secret is None


def test_one_router_needs_no_link():
    assert parse_topology('[[router]]\nid = "solo"\n') == Topology(("solo",), ())


def test_unreadable_and_not_utf8_files(tmp_path):
    with pytest.raises(TopologyError) as info:
        load_topology(str(tmp_path / "missing.toml"))
    assert str(info.value) == f"{tmp_path / 'missing.toml'}: cannot read topology file: No such file or directory"
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b'[[router]]\nid = "A"\n# caf\xe9\n')
    with pytest.raises(TopologyError) as info:
        load_topology(str(latin1))
    assert str(info.value) == f"{latin1}, line 3: not valid UTF-8 (TOML files are UTF-8)"


def test_a_routers_last_routes_are_read_as_its_log_grows(tmp_path):
    """RoutesTail (RouterNetwork.routes_of): the last routes event of the epoch asked for,
    reading only what was appended since the last call; a torn last line waits until it
    is whole; another epoch's routes, and a line that only mentions routes, do not count."""
    events = tmp_path / "events"
    events.mkdir()
    older = events / "events-000001-000001.jsonl"
    current = events / "events-000002-000001.jsonl"
    older.write_text('{"seq":1,"epoch":1,"event":"routes","reachable":["X"]}\n')
    tail = RoutesTail(tmp_path, 2)
    assert tail.latest() is None  # nothing of epoch 2 yet
    current.write_text('{"seq":1,"epoch":2,"event":"routes","reachable":["B"]}\n{"seq":2,"epoch":2,"event":"rou')
    assert tail.latest()["reachable"] == ["B"]
    with open(current, "a") as f:
        f.write('tes","reachable":["B","C"]}\n{"seq":3,"epoch":2,"event":"peer-lost","reason":"routes"}\n')
    assert tail.latest()["reachable"] == ["B", "C"]
    (events / "events-000002-000002.jsonl").write_text('{"seq":4,"epoch":2,"event":"routes","reachable":[]}\n')
    assert tail.latest()["reachable"] == []  # the epoch's next file
    assert RoutesTail(tmp_path, None).latest() is None  # not started yet
