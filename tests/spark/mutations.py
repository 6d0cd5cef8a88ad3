"""The audit's mutations of real event logs (issues 14 and 15): each takes a copy of
a real run's logs and ledgers, breaks them the way a faulty router, a faulty disk
or a careless operator would, and says exactly what the reconciliation must report.

A mutation works on the files as written (``Copy``: every router's files as raw
lines, and the applications' ledgers), so it can also break what is not JSON.
It returns {check: {item}} with the job's item strings (spark/reconcile.py
``item_of``), or ``Exit2(text)`` when the input holds no event and the command must
refuse it with a message containing ``text``; ``Copy.note`` lists the torn lines
the report must note.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import orjson


@dataclass
class Exit2:
    """The command must exit 2 and say this."""

    text: str


@dataclass
class Copy:
    """A run's logs under ``base``: ``files[router][name]`` is the raw lines of one
    log file (each with its newline), ``ledgers`` the ledger directory."""

    base: Path
    files: dict[str, dict[str, list[bytes]]]
    ledgers: Path
    routers_given: list[str] = field(default_factory=list)  # the routers passed to the command
    note: list[tuple[str, str, int]] = field(default_factory=list)  # torn lines: (router, file, line)

    @classmethod
    def of(cls, run: dict, base: Path) -> Copy:
        files: dict = {}
        for data_dir in run["routers"]:
            router = Path(data_dir).name
            files[router] = {
                p.name: p.read_bytes().splitlines(keepends=True)
                for p in sorted((Path(data_dir) / "events").glob("events-*.jsonl"))
            }
        ledgers = base / "clients"
        shutil.copytree(run["clients"], ledgers, ignore=shutil.ignore_patterns("*.state"))
        return cls(base, files, ledgers, sorted(files))

    def write(self) -> list[str]:
        dirs = []
        for router in self.routers_given:
            events = self.base / router / "events"
            events.mkdir(parents=True, exist_ok=True)
            for name, lines in self.files[router].items():
                (events / name).write_bytes(b"".join(lines))
            dirs.append(str(self.base / router))
        return dirs

    def uri(self, router: str, name: str) -> str:
        return "file:" + str((self.base / router / "events" / name).resolve())

    # -- reading the lines

    def events(self, router: str, name: str | None = None) -> list[tuple[str, int, dict]]:
        """(file, index, decoded line) of one router's lines."""
        out = []
        for file, lines in self.files[router].items():
            if name is None or file == name:
                out += [(file, i, orjson.loads(line)) for i, line in enumerate(lines)]
        return out

    def find(self, router: str, pred) -> tuple[str, int, dict]:
        for found in self.events(router):
            if pred(found[2]):
                return found
        raise AssertionError(f"no such line on router {router}")

    def put(self, router: str, file: str, index: int, line: dict | bytes) -> None:
        self.files[router][file][index] = (
            line if isinstance(line, bytes) else orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
        )

    def first_file(self, router: str) -> str:
        return sorted(self.files[router])[0]


def _delivery_from(copy: Copy, origin: str, remote: str) -> str:
    """A delivery whose publisher is attached at ``origin``, sent to ``remote``, told accepted."""
    return _deliveries_from(copy, origin, remote, 1)[0]


def _deliveries_from(copy: Copy, origin: str, remote: str, n: int) -> list[str]:
    """The first ``n`` such deliveries."""
    accepted = {
        e["delivery"] for _, _, e in copy.events(origin) if e["event"] == "pub-outcome" and e.get("outcome") == "accepted"
    }
    found = [
        e["delivery"]
        for _, _, e in copy.events(origin)
        if e["event"] == "received"
        and e.get("origin_router") is None
        and remote in (e.get("routers") or [])
        and e["delivery"] in accepted
    ]
    assert len(found) >= n, f"fewer than {n} deliveries from {origin} to {remote}"
    return found[:n]


# ----------------------------------------------------------------------------- no events at all


def every_file_empty(copy: Copy) -> Exit2:
    for router in copy.files:
        for name in copy.files[router]:
            copy.files[router][name] = []
    return Exit2("the log files are empty")


def every_file_one_garbage_line(copy: Copy) -> Exit2:
    for router in copy.files:
        for name in copy.files[router]:
            copy.files[router][name] = [b"\x00garbage\xff\n"]
    return Exit2("none of them an event")


# ----------------------------------------------------------------------------- the files themselves


def line_deleted_and_another_copied(copy: Copy) -> dict:
    """A line deleted and another copied in its place: as many lines as seq numbers,
    one missing and one repeated (the proof counted lines: it said clean)."""
    router = "B"
    peers = [(f, i, e) for f, i, e in copy.events(router) if e["event"] in ("peer-connected", "routes")]
    (f1, i1, gone), (_, _, copied) = peers[0], peers[1]
    copy.put(router, f1, i1, copied)
    return {"seq-gap": {f"B|{gone['epoch']}|{gone['seq']}"}, "seq-repeated": {f"B|{copied['epoch']}|{copied['seq']}"}}


def binary_garbage_in_the_middle(copy: Copy) -> dict:
    router = "C"
    name = copy.first_file(router)
    lines = copy.files[router][name]
    at = len(lines) // 2
    lines.insert(at, b"\x00\x01\xfe\xff binary garbage\n")
    return {"malformed-line": {f"{copy.uri(router, name)}:{at + 1}"}}


def seq_a_string(copy: Copy) -> dict:
    """Valid JSON with a wrong type: the line is malformed, and its seq unreadable."""
    file, index, line = copy.find("A", lambda e: e["event"] == "peer-connected")
    copy.put("A", file, index, orjson.dumps(line).replace(b'"seq":%d' % line["seq"], b'"seq":"%d"' % line["seq"], 1) + b"\n")
    return {"malformed-line": {f"{copy.uri('A', file)}:{index + 1}"}, "seq-gap": {f"A|{line['epoch']}|{line['seq']}"}}


def durable_a_string(copy: Copy) -> dict:
    """Valid JSON with a wrong type in a kind's own field (``durable`` of an attach)."""
    file, index, line = copy.find("B", lambda e: e["event"] == "link-attached")
    copy.put("B", file, index, {**line, "durable": str(line["durable"])})
    return {"malformed-line": {f"{copy.uri('B', file)}:{index + 1}"}}


def torn_last_line(copy: Copy) -> dict:
    """A crash cut the last write of router C: a note, not a violation."""
    name = sorted(copy.files["C"])[-1]
    copy.files["C"][name].append(b'{"seq":99999,"ts":1763785')
    copy.note.append(("C", name, len(copy.files["C"][name])))
    return {}


def router_log_missing(copy: Copy) -> dict:
    """Router C's log is not given: one root cause, not one row per delivery."""
    copy.routers_given = ["A", "B"]
    return {"router-log-missing": {"C"}}


# ----------------------------------------------------------------------------- a delivery's causal chain


def accept_from_a_stranger(copy: Copy) -> dict:
    """An accept from a subscriber that never attached and was never owed it."""
    d = _delivery_from(copy, "A", "B")
    file, index, line = copy.find("B", lambda e: e["event"] == "received" and e["delivery"] == d)
    stranger = {
        **{k: line[k] for k in ("seq", "ts", "router", "epoch", "boot")},
        "event": "sub-outcome",
        "delivery": d,
        "subscriber": "mallory-app/mallory-in",
        "outcome": "accepted",
        "settled": True,
    }
    copy.put("B", file, index, line)
    _insert_after(copy, "B", file, index, stranger)
    return {"accept-unowed": {f"mallory-app/mallory-in|{d}"}}


def accept_without_send(copy: Copy) -> dict:
    """A subscriber's accept with no preceding send to it (the send taken out)."""
    d = _delivery_from(copy, "A", "B")
    file, index, line = copy.find("B", lambda e: e["event"] == "received" and e["delivery"] == d)
    assert line["forwarded"] == ["bob-app/bob-in"], line
    copy.put("B", file, index, {**line, "forwarded": []})
    # Its application's ledger has it: no router logged sending it there.
    return {"accept-unsent": {f"bob-app/bob-in|B|{d}"}, "ledger": {f"unsent|bob-app/bob-in|{d}"}}


def pattern_subscriber_accept_deleted_and_reattached(copy: Copy) -> dict:
    """A subscriber to a pattern (bob, ``spark/+``) never accepted a delivery owed to
    it, and re-attached with the same pattern meanwhile: the same subscription
    carrying on, which excuses nothing (a re-attach with another address would)."""
    d = _delivery_from(copy, "A", "B")
    file, index, accept = copy.find(
        "B",
        lambda e: (
            e.get("subscriber") == "bob-app/bob-in"
            and (e["event"] == "sub-outcome" and e["delivery"] == d or e["event"] == "sub-outcomes" and d in e["deliveries"])
        ),
    )
    if accept["event"] == "sub-outcomes" and len(accept["deliveries"]) > 1:  # a batch of accepts: d's taken out
        copy.put("B", file, index, {**accept, "deliveries": [x for x in accept["deliveries"] if x != d]})
    else:
        _delete(copy, "B", file, index)
    _, _, attach = copy.find("B", lambda e: e["event"] == "link-attached" and e.get("name") == "bob-in")
    assert attach["address"] == "spark/+", attach
    file, index, received = copy.find("B", lambda e: e["event"] == "received" and e["delivery"] == d)
    again = {**attach, **{k: received[k] for k in ("seq", "ts", "router", "epoch", "boot")}, "link": attach["link"] + 100}
    _insert_after(copy, "B", file, index, again)
    return {"lost": {d}}


def _moved_from_a(copy: Copy, filtered_at_a: bool) -> str:
    """Router B, having taken over a delivery of A's publisher, owes it to a durable
    subscriber of A's (dave) wherever it re-attaches (`owed-moved`); dave never
    accepts it anywhere. With ``filtered_at_a``, A's `received` names dave among
    those its selector filtered out."""
    d = _delivery_from(copy, "A", "B")
    dave = "dave-app/dave-in"
    if filtered_at_a:
        file, index, line = copy.find("A", lambda e: e["event"] == "received" and e["delivery"] == d)
        copy.put("A", file, index, {**line, "filtered": [*(line.get("filtered") or []), dave]})
    file, index, line = copy.find("B", lambda e: e["event"] == "received" and e["delivery"] == d)
    moved = {
        **{k: line[k] for k in ("seq", "ts", "router", "epoch", "boot")},
        "event": "owed-moved",
        "delivery": d,
        "from_router": "A",
        "subscribers": [dave],
    }
    _insert_after(copy, "B", file, index, moved)
    return d


def moved_subscriber_never_accepted(copy: Copy) -> dict:
    """A durable subscriber whose obligation moved (`owed-moved`) never accepted the
    delivery anywhere, and nothing discarded its obligation: lost."""
    return {"lost": {_moved_from_a(copy, filtered_at_a=False)}}


def moved_subscriber_its_old_router_filtered_out(copy: Copy) -> dict:
    """Not a fault (found by tests/failover/test_kill.py's selective kill): A's
    selector for its durable subscriber did not select the delivery, A told the
    publisher accepted and died before the publisher settled; the publisher resumed
    at B, which took the delivery over and, knowing no remote subscriber's selector,
    owed it to A's durable subscribers wherever they re-attach, then settled it at
    once with the outcome the publisher already had. The subscriber was never owed
    it: proven clean."""
    _moved_from_a(copy, filtered_at_a=True)
    return {}


def forward_deleted(copy: Copy) -> dict:
    """The origin's forward to a router deleted, while that router logged the arrival."""
    d = _delivery_from(copy, "A", "B")
    file, index, _ = copy.find(
        "A", lambda e: e["event"] == "forwarded-to-router" and e["delivery"] == d and e.get("to_router") == "B"
    )
    _delete(copy, "A", file, index)
    return {"arrival-unforwarded": {f"B|{d}"}}


def answer_deleted_on_both_sides(copy: Copy) -> dict:
    """A router's answer to the origin deleted from both sides; the publisher was told accepted."""
    d = _delivery_from(copy, "A", "B")
    file, index, _ = copy.find("B", lambda e: e["event"] == "outcome-to-router" and e["delivery"] == d)
    _delete(copy, "B", file, index)
    file, index, _ = copy.find(
        "A", lambda e: e["event"] == "outcome-from-router" and e["delivery"] == d and e.get("from_router") == "B"
    )
    _delete(copy, "A", file, index)
    return {"answer-missing": {f"A|B|{d}"}}


def restarted_router_answers_for_its_previous_life(copy: Copy) -> dict:
    """Router B restarts (a new epoch) and answers for a delivery only epoch 1 received."""
    d = _delivery_from(copy, "A", "B")
    _, _, last = copy.events("B")[-1]
    boot = "f" * 16
    common = {"ts": last["ts"] + 1, "router": "B", "epoch": last["epoch"] + 1, "boot": boot}
    name = f"events-{last['epoch'] + 1:06d}-000001.jsonl"
    copy.files["B"][name] = [
        orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
        for line in (
            {"seq": 1, **common, "event": "router-started", "pid": 1, "version": "0.1.0"},
            {"seq": 2, **common, "event": "outcome-to-router", "delivery": d, "to_router": "A", "outcome": "accepted"},
        )
    ]
    return {"record-missing": {f"B|{last['epoch'] + 1}|{d}"}}


def publisher_told_released_though_all_accepted(copy: Copy) -> dict:
    """Issue 14's race, as the logs showed it: every owed subscriber accepted, the
    origin told its publisher released (and the publisher's ledger says so)."""
    d = _delivery_from(copy, "A", "B")
    file, index, line = copy.find("A", lambda e: e["event"] == "pub-outcome" and e["delivery"] == d)
    copy.put("A", file, index, {**line, "outcome": "released", "reason": "no subscribers left"})
    _ledger_outcome(copy, "p1", copy.find("A", lambda e: e["event"] == "received" and e["delivery"] == d)[2], "released")
    return {"outcome-disagrees": {d}}


def publisher_told_accepted_though_one_rejected(copy: Copy) -> dict:
    """The other way round: carol@C rejected the poison message, yet its origin B
    told the publisher accepted (and p2's ledger says so)."""
    poison = {e["delivery"] for _, _, e in copy.events("C") if e["event"] == "sub-outcome" and e.get("outcome") == "rejected"}
    assert len(poison) == 1, poison
    d = poison.pop()
    file, index, line = copy.find("B", lambda e: e["event"] == "pub-outcome" and e["delivery"] == d)
    assert line["outcome"] == "rejected", line
    copy.put("B", file, index, {**line, "outcome": "accepted", "condition": None, "reason": None})
    _ledger_outcome(copy, "p2", copy.find("B", lambda e: e["event"] == "received" and e["delivery"] == d)[2], "accepted")
    # carol never accepted what its publisher was told accepted: lost for carol, too
    return {"outcome-disagrees": {d}, "lost": {d}}


def answer_deleted_after_an_early_unreachable_route(copy: Copy) -> dict:
    """As "an answer deleted on both sides", with a `routes` line on the origin that
    lacks the answering router logged before the delivery arrived: the origin sent it
    there, so it was reachable then, and that old route excuses nothing."""
    answer_deleted_on_both_sides(copy)
    d = _delivery_from(copy, "A", "B")
    file, index, started = copy.find("A", lambda e: e["event"] == "router-started")
    others = sorted(r for r in copy.files if r not in ("A", "B"))
    _insert_after(
        copy,
        "A",
        file,
        index,
        {
            "seq": started["seq"],
            "ts": started["ts"],
            "router": "A",
            "epoch": started["epoch"],
            "boot": started["boot"],
            "event": "routes",
            "reachable": others,
            "next_hops": others,
        },
    )
    return {"answer-missing": {f"A|B|{d}"}}


def application_handed_a_delivery_no_router_received(copy: Copy) -> dict:
    """A subscriber's ledger says its application was handed (and accepted) a
    delivery id that no router ever received: nothing invented, at the application."""
    ledger = copy.ledgers / "bob.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    last = next(orjson.loads(raw) for raw in reversed(lines) if orjson.loads(raw)["event"] == "delivered")
    invented = "ab" * 20
    lines.append(
        orjson.dumps(
            {**last, "ts": last["ts"] + 0.001, "delivery": invented, "pub_tag": None, "seq": None, "message_id": None},
            option=orjson.OPT_APPEND_NEWLINE,
        )
    )
    ledger.write_bytes(b"".join(lines))
    return {"ledger": {f"unsent|{last['client']}/{last['link']}|{invented}"}}


def resend_refused_beyond_the_horizon(copy: Copy) -> dict:
    """Not a fault: the publisher missed the outcome of a delivery the network
    finished, resumed after router A forgot its stream, resent it and was refused
    (rejected, eorouter:resend-beyond-horizon, "it may have been delivered already";
    docs/resumption.md). The delivery was delivered once; its publisher was told the
    truth: proven clean."""
    d = _delivery_from(copy, "A", "B")
    file = sorted(copy.files["A"])[-1]
    events = copy.events("A", file)
    index, last = events[-2][1], events[-2][2]  # before router-stopping
    assert events[-1][2]["event"] == "router-stopping", events[-1][2]
    common = {"ts": last["ts"], "router": "A", "epoch": last["epoch"], "boot": last["boot"]}
    condition = "eorouter:resend-beyond-horizon"
    reason = "resent after the router forgot its stream (resume horizon or memory limit): it may have been delivered already"
    _insert_after(
        copy, "A", file, index, {"seq": last["seq"], **common, "event": "resend-beyond-horizon", "delivery": d, "stream": d[:32]}
    )
    _insert_after(
        copy,
        "A",
        file,
        index + 1,
        {
            "seq": last["seq"] + 1,
            **common,
            "event": "pub-outcome",
            "delivery": d,
            "outcome": "rejected",
            "condition": condition,
            "reason": reason,
        },
    )
    _ledger_outcome(copy, "p1", copy.find("A", lambda e: e["event"] == "received" and e["delivery"] == d)[2], "rejected")
    return {}


def _mark_at_least_once(copy: Copy, d: str) -> None:
    """Every router's `received` line of ``d`` says its topic is at-least-once."""
    for router in copy.files:
        for file, index, line in copy.events(router):
            if line["event"] == "received" and line["delivery"] == d:
                copy.put(router, file, index, {**line, "guarantee": "at-least-once"})


def _accepted_and_handed_again(copy: Copy, d: str) -> None:
    """bob (at B) sent ``d`` again, accepted it again, and its application was handed it
    again: what a resend after a failover does on an at-least-once topic."""
    file, index, received = copy.find("B", lambda e: e["event"] == "received" and e["delivery"] == d)
    last = max(i for f, i, e in copy.events("B", file) if e.get("delivery") == d or d in (e.get("deliveries") or []))
    at = copy.events("B", file)[last][2]
    stamp = {k: at[k] for k in ("seq", "ts", "router", "epoch", "boot")}
    again = {**stamp, "event": "forwarded", "delivery": d, "subscriber": "bob-app/bob-in", "link": 1, "settled": False}
    accept = {
        **stamp,
        "seq": stamp["seq"] + 1,
        "event": "sub-outcome",
        "delivery": d,
        "subscriber": "bob-app/bob-in",
        "outcome": "accepted",
        "settled": True,
    }
    _insert_after(copy, "B", file, last, again)
    _insert_after(copy, "B", file, last + 1, accept)
    ledger = copy.ledgers / "bob.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    (handed,) = [raw for raw in lines if orjson.loads(raw).get("event") == "delivered" and orjson.loads(raw)["delivery"] == d]
    ledger.write_bytes(b"".join(lines) + handed)


def _resent_to_its_placeholder(copy: Copy, d: str) -> None:
    """bob reported holding ``d`` (with its accept) before router B had it: B made a
    placeholder, and once the delivery came it re-sent it, bob recognised the tag and
    answered again with the state it had reported, handing nothing to its application
    (docs/resumption.md). Found by `scripts/bench --failover` when a subscriber moved
    to a router that had just restarted."""
    file, _, _ = copy.find("B", lambda e: e["event"] == "received" and e["delivery"] == d)
    last = max(i for f, i, e in copy.events("B", file) if e.get("delivery") == d or d in (e.get("deliveries") or []))
    at = copy.events("B", file)[last][2]
    stamp = {k: at[k] for k in ("seq", "ts", "router", "epoch", "boot")}
    bob = "bob-app/bob-in"
    lines = [
        {"event": "placeholder-created", "subscriber": bob, "delivery": d},
        {"event": "forwarded", "delivery": d, "subscriber": bob, "link": 1, "settled": False},
        {"event": "sub-outcome", "delivery": d, "subscriber": bob, "outcome": "accepted", "settled": True},
    ]
    for n, line in enumerate(lines):
        _insert_after(copy, "B", file, last + n, {**stamp, "seq": stamp["seq"] + n, **line})


def guarantees_judged_each_by_its_own(copy: Copy) -> dict:
    """Four deliveries to bob: an at-least-once one accepted and handed twice (allowed
    there: counted in the report, which the test checks, not a violation); an
    exactly-once one accepted and handed twice (a duplicate, in the routers' view and
    the application's); an at-least-once one bob never accepted, its accept deleted
    (lost, as on any topic: only duplicates are allowed there); an exactly-once one
    accepted again after a placeholder's re-send (the answer it reported, not a
    duplicate). One copy for the four: each reconciliation costs the suite seconds."""
    twice_alo, twice_eo, unaccepted, placeholder = _deliveries_from(copy, "A", "B", 4)
    _mark_at_least_once(copy, twice_alo)
    _accepted_and_handed_again(copy, twice_alo)
    _accepted_and_handed_again(copy, twice_eo)
    _resent_to_its_placeholder(copy, placeholder)
    _mark_at_least_once(copy, unaccepted)
    file, index, accept = copy.find(
        "B",
        lambda e: (
            e.get("subscriber") == "bob-app/bob-in"
            and (
                e["event"] == "sub-outcome"
                and e["delivery"] == unaccepted
                or e["event"] == "sub-outcomes"
                and unaccepted in e["deliveries"]
            )
        ),
    )
    if accept["event"] == "sub-outcomes" and len(accept["deliveries"]) > 1:
        copy.put("B", file, index, {**accept, "deliveries": [x for x in accept["deliveries"] if x != unaccepted]})
    else:
        _delete(copy, "B", file, index)
    return {
        "duplicated": {f"bob-app/bob-in|{twice_eo}"},
        "ledger": {f"twice|bob-app/bob-in|{twice_eo}"},
        "lost": {unaccepted},
    }


def _ledger_outcome(copy: Copy, client: str, received: dict, outcome: str) -> None:
    """Rewrite the outcome a publisher's ledger holds for the delivery ``received`` names."""
    ledger = copy.ledgers / f"{client}.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    changed = 0
    for i, raw in enumerate(lines):
        entry = orjson.loads(raw)
        if (
            entry["event"] == "outcome"
            and entry["pub_tag"] == received["pub_tag"]
            and entry["incarnation"] == received["incarnation"]
        ):
            lines[i] = orjson.dumps({**entry, "outcome": outcome}, option=orjson.OPT_APPEND_NEWLINE)
            changed += 1
    assert changed == 1, (client, received["pub_tag"])
    ledger.write_bytes(b"".join(lines))


def _delete(copy: Copy, router: str, file: str, index: int) -> None:
    """Delete a line and renumber the file's later lines (a router that never logged
    it: no gap in seq)."""
    lines = copy.files[router][file]
    del lines[index]
    for i in range(index, len(lines)):
        entry = orjson.loads(lines[i])
        lines[i] = orjson.dumps({**entry, "seq": entry["seq"] - 1}, option=orjson.OPT_APPEND_NEWLINE)


def _insert_after(copy: Copy, router: str, file: str, index: int, line: dict) -> None:
    """Insert a line (with the next seq) and renumber the file's later lines."""
    lines = copy.files[router][file]
    for i in range(index + 1, len(lines)):
        entry = orjson.loads(lines[i])
        lines[i] = orjson.dumps({**entry, "seq": entry["seq"] + 1}, option=orjson.OPT_APPEND_NEWLINE)
    lines.insert(index + 1, orjson.dumps({**line, "seq": line["seq"] + 1}, option=orjson.OPT_APPEND_NEWLINE))


#: name -> mutation. Each is applied to its own copy of one real run.
MUTATIONS = {
    "each guarantee's duplicates and losses, at-least-once and exactly-once": guarantees_judged_each_by_its_own,
    "every file empty": every_file_empty,
    "every file one garbage line": every_file_one_garbage_line,
    "a line deleted and another copied in its place": line_deleted_and_another_copied,
    "binary garbage in the middle of a file": binary_garbage_in_the_middle,
    "seq a string": seq_a_string,
    "a kind's field of the wrong type": durable_a_string,
    "a torn last line after a crash": torn_last_line,
    "a router's log missing": router_log_missing,
    "an accept from a subscriber never attached nor owed": accept_from_a_stranger,
    "an accept with no preceding send": accept_without_send,
    "a forward deleted while the arrival is logged": forward_deleted,
    "a moved subscriber never accepted": moved_subscriber_never_accepted,
    "a moved subscriber its old router's selector filtered out (clean)": moved_subscriber_its_old_router_filtered_out,
    "a pattern subscriber's accept deleted, the same pattern re-attached": pattern_subscriber_accept_deleted_and_reattached,
    "an answer deleted on both sides, publisher told accepted": answer_deleted_on_both_sides,
    "a restarted router answering for its previous life": restarted_router_answers_for_its_previous_life,
    "publisher told released though every subscriber accepted": publisher_told_released_though_all_accepted,
    "publisher told accepted though a subscriber rejected": publisher_told_accepted_though_one_rejected,
    "a resend refused beyond the resume horizon (clean)": resend_refused_beyond_the_horizon,
    "an answer deleted after an early route without its router": answer_deleted_after_an_early_unreachable_route,
    "an application handed a delivery no router received": application_handed_a_delivery_no_router_received,
}

#: The mutations also reconciled without the applications' ledgers: the routers'
#: logs alone must give the same violations, less the ledger's own.
WITHOUT_LEDGERS = (
    "an accept with no preceding send",
    "publisher told released though every subscriber accepted",
    "publisher told accepted though a subscriber rejected",
    "a router's log missing",
    "a resend refused beyond the resume horizon (clean)",
)
