"""Fault injection into real event logs, and namespacing (so several copies of one
run, each with its own fault, are reconciled in one Spark job and told apart).

A fault is applied the way a faulty router would have logged it: lines are
removed, added or moved, and ``seq`` is renumbered per (router, epoch), so the
log stays gap-free (a gap would be reported as an input problem instead).
Each injector returns the exact violations the job must report, as
{check: {item}} with the job's item strings (spark/reconcile.py).

``FAULTS`` work on the events (folded lines unfolded, each event its own line);
``BATCH_FAULTS`` on the lines as written (``Logs.read(..., raw=True)``), hiding the
fault inside a "sub-outcomes" line (router.eventschema.FOLDED).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson

from router.eventlog import read_events
from router.eventschema import unfold

_ROUTER_FIELDS = ("router", "origin_router", "to_router", "from_router", "peer")
_ROUTER_LISTS = ("routers", "dests", "reachable")
_KEY_FIELDS = ("subscriber",)
_KEY_LISTS = ("owed", "forwarded")


class Logs:
    """Every router's events (or lines, ``raw``), per router, in file order."""

    def __init__(self, by_router: dict[str, list[dict]]):
        self.by_router = by_router

    @classmethod
    def read(cls, data_dirs: list[str | Path], raw: bool = False) -> Logs:
        """The events, each its own line and renumbered (what a router that never
        folds would have logged: the events of one folded line share its seq, and
        written one per line they would look like repeated lines); ``raw``: the
        lines as written."""
        by_router = {}
        for d in data_dirs:
            events = list(read_events(d, raw=raw))
            by_router[events[0]["router"]] = events
        logs = cls(by_router)
        if not raw:
            logs.renumber()
        return logs

    def copy(self) -> Logs:
        return Logs({r: [dict(e) for e in evs] for r, evs in self.by_router.items()})

    def all(self):
        for router, events in self.by_router.items():
            for e in events:
                yield router, e

    def renumber(self) -> None:
        for events in self.by_router.values():
            seq = {}
            for e in events:
                seq[e["epoch"]] = seq.get(e["epoch"], 0) + 1
                e["seq"] = seq[e["epoch"]]

    def namespaced(self, ns: str) -> Logs:
        """Prefix router ids, client container ids and delivery ids with ``ns``."""

        def key(k):
            return None if k is None else ns + k

        out = {}
        for router, events in self.by_router.items():
            new = []
            for e in events:
                e = dict(e)
                for f in _ROUTER_FIELDS:
                    if e.get(f) is not None:
                        e[f] = ns + e[f]
                for f in _ROUTER_LISTS:
                    if e.get(f) is not None:
                        e[f] = [ns + x for x in e[f]]
                if e.get("next_hops") is not None:
                    e["next_hops"] = [">".join(ns + p for p in h.split(">")) for h in e["next_hops"]]
                for f in ("container", "publisher"):
                    if e.get(f) is not None:
                        e[f] = ns + e[f]
                for f in _KEY_FIELDS:
                    if e.get(f) is not None:
                        e[f] = key(e[f])
                for f in _KEY_LISTS:
                    if e.get(f) is not None:
                        e[f] = [key(x) for x in e[f]]
                if e.get("delivery") is not None:
                    e["delivery"] = ns + e["delivery"]
                if e.get("deliveries") is not None:
                    e["deliveries"] = [ns + d for d in e["deliveries"]]
                new.append(e)
            out[ns + router] = new
        return Logs(out)

    def write(self, base: Path) -> list[str]:
        """Write as router data directories under ``base``; return them."""
        dirs = []
        for router, events in self.by_router.items():
            directory = Path(base) / router / "events"
            directory.mkdir(parents=True, exist_ok=True)
            files: dict[int, bytearray] = {}
            for e in events:
                files.setdefault(e["epoch"], bytearray()).extend(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE))
            for epoch, data in files.items():
                (directory / f"events-{epoch:06d}-000001.jsonl").write_bytes(bytes(data))
            dirs.append(str(Path(base) / router))
        return dirs

    # ----------------------------------------------------------------- queries

    def accepted(self) -> list[str]:
        return [
            e["delivery"]
            for _, line in self.all()
            for e in unfold(line)
            if e["event"] == "pub-outcome" and e.get("outcome") == "accepted" and e.get("delivery")
        ]

    def find(self, router: str, pred) -> list[int]:
        return [i for i, e in enumerate(self.by_router[router]) if pred(e)]

    def ident(self, delivery: str) -> dict:
        for _, e in self.all():
            if e["event"] == "received" and e["delivery"] == delivery:
                return e
        raise KeyError(delivery)

    def _insert_before_stop(self, router: str, lines: list[dict]) -> None:
        events = self.by_router[router]
        last_epoch = events[-1]["epoch"]
        stop = [i for i, e in enumerate(events) if e["event"] == "router-stopping" and e["epoch"] == last_epoch]
        at = stop[0] if stop else len(events)
        ts = events[at - 1]["ts"]
        template = events[at - 1]
        for n, line in enumerate(lines):
            line = {"seq": 0, "ts": ts, "router": router, "epoch": template["epoch"], "boot": template["boot"], **line}
            events.insert(at + n, line)


def pub_id(received: dict) -> str:
    import re

    m = re.search(r"\.(\d+)$", received["delivery"])
    return "|".join(
        [received["publisher"], received["link_name"], received["incarnation"], received["pub_tag"], m.group(1) if m else ""]
    )


# ----------------------------------------------------------------------------- the faults


def drop_accept(logs: Logs) -> dict:
    """A subscriber's accept of a delivery its publisher was told accepted is missing."""
    for d in logs.accepted():
        for router, events in logs.by_router.items():
            idx = [
                i
                for i, e in enumerate(events)
                if e["event"] == "sub-outcome" and e["delivery"] == d and e["outcome"] == "accepted"
            ]
            if idx:
                del events[idx[0]]
                logs.renumber()
                return {"lost": {d}}
    raise AssertionError("no accepted delivery to drop an accept from")


def duplicate_other_tag(logs: Logs) -> dict:
    """A router hands one subscriber the same publisher delivery again, under another
    delivery id (as if it derived a different tag for it); the subscriber accepts it."""
    for d in logs.accepted()[2:]:
        for router, events in logs.by_router.items():
            accepts = [e for e in events if e["event"] == "sub-outcome" and e["delivery"] == d and e["outcome"] == "accepted"]
            recv = [e for e in events if e["event"] == "received" and e["delivery"] == d]
            if not accepts or not recv:
                continue
            sub = accepts[0]["subscriber"]
            d2 = hashlib.blake2b(d.encode(), digest_size=17).hexdigest()
            clone = {k: v for k, v in recv[0].items() if k not in ("seq", "ts", "router", "epoch", "boot")}
            clone.update(delivery=d2, owed=[sub], forwarded=[sub])
            logs._insert_before_stop(
                router,
                [
                    clone,
                    {"event": "sub-outcome", "delivery": d2, "subscriber": sub, "outcome": "accepted", "settled": True},
                    {"event": "settled", "delivery": d2, "by": "origin-router", "deleted": True},
                ],
            )
            logs.renumber()
            return {"duplicated": {f"{sub}|{pub_id(recv[0])}"}}
    raise AssertionError("no place for a duplicate")


def reorder_pair(logs: Logs) -> dict:
    """Two consecutive deliveries of one publisher stream reach one subscriber in the
    wrong order (their sends swap places in the router's log)."""
    for router, events in logs.by_router.items():
        # Sends per subscriber: `forwarded` lines, or `received` lines that sent to
        # exactly one subscriber (so one swap reorders one subscriber's stream).
        sends: dict[str, list[int]] = {}
        for i, e in enumerate(events):
            if e["event"] == "forwarded":
                sends.setdefault(e["subscriber"], []).append(i)
            elif e["event"] == "received" and len(e.get("forwarded") or []) == 1 and not e.get("settled"):
                sends.setdefault(e["forwarded"][0], []).append(i)
        for sub, idx in sends.items():
            for a, b in zip(idx, idx[1:]):
                ea, eb = events[a], events[b]
                if ea["event"] != eb["event"]:
                    continue
                ia, ib = logs.ident(ea["delivery"]), logs.ident(eb["delivery"])
                same_stream = (ia["publisher"], ia["link_name"], ia["incarnation"]) == (
                    ib["publisher"],
                    ib["link_name"],
                    ib["incarnation"],
                )
                if not same_stream or ib["stream_seq"] != ia["stream_seq"] + 1:
                    continue
                if ea["event"] == "received" and (ea.get("owed") != [sub] or eb.get("owed") != [sub]):
                    continue
                # Only the two sends change places: nothing about either delivery lies
                # between them (a send moved past its own answer would be another fault).
                if any(e.get("delivery") in (ea["delivery"], eb["delivery"]) for e in events[a + 1 : b]):
                    continue
                events[a], events[b] = eb, ea
                logs.renumber()
                return {"out-of-order": {f"{router}|{sub}|{ea['delivery']}"}}
    raise AssertionError("no consecutive sends of one stream to reorder")


def accept_never_published(logs: Logs) -> dict:
    """A router logs a subscriber's accept of a delivery no router ever received."""
    router = sorted(logs.by_router)[-1]
    sub = next(e["subscriber"] for _, e in logs.all() if e["event"] == "sub-outcome")
    d = hashlib.blake2b(b"never published", digest_size=18).hexdigest()
    logs._insert_before_stop(
        router, [{"event": "sub-outcome", "delivery": d, "subscriber": sub, "outcome": "accepted", "settled": True}]
    )
    logs.renumber()
    return {"invented": {d}}


def leftover_record(logs: Logs) -> dict:
    """A router never forgets one record: its deletion is missing."""
    for d in logs.accepted()[1:]:
        for router, events in logs.by_router.items():
            idx = [
                i
                for i, e in enumerate(events)
                if e.get("delivery") == d and (e["event"] == "record-deleted" or (e["event"] == "settled" and e.get("deleted")))
            ]
            if len(idx) == 1:
                del events[idx[0]]
                logs.renumber()
                return {"left-unsettled": {f"{router}|{d}"}}
    raise AssertionError("no record to leave behind")


FAULTS = {
    "dropped-accept": drop_accept,
    "duplicate-other-tag": duplicate_other_tag,
    "reordered-pair": reorder_pair,
    "accept-never-published": accept_never_published,
    "leftover-record": leftover_record,
}


# ----------------------------------------------------------------------------- hidden in a batched line


def _accepted_runs(logs: Logs) -> list[tuple[str, dict]]:
    """The "sub-outcomes" lines of accepts, longest first, each with its router."""
    runs = [(router, e) for router, e in logs.all() if e["event"] == "sub-outcomes" and e.get("outcome") == "accepted"]
    return sorted(runs, key=lambda run: -len(run[1]["deliveries"]))


def drop_from_batch(logs: Logs) -> dict:
    """One accept inside a "sub-outcomes" line is missing: the line names one delivery
    fewer (its publisher was told accepted). Nothing else changes: no line is missing."""
    accepted = set(logs.accepted())
    for _, line in _accepted_runs(logs):
        deliveries = line["deliveries"]
        middle = len(deliveries) // 2
        for i in sorted(range(len(deliveries)), key=lambda i: abs(i - middle)):  # one inside the run, not an end
            d = deliveries[i]
            others = [
                e
                for _, other in logs.all()
                for e in unfold(other)
                if e["event"] == "sub-outcome" and e["delivery"] == d and e["subscriber"] == line["subscriber"]
            ]
            if d in accepted and len(others) == 1:
                del deliveries[i]
                return {"lost": {d}}
    raise AssertionError('no accepted delivery inside a "sub-outcomes" line')


def repeat_in_batch(logs: Logs) -> dict:
    """A "sub-outcomes" line names one delivery twice: the subscriber accepted it twice."""
    for _, line in _accepted_runs(logs):
        deliveries = line["deliveries"]
        d = deliveries[len(deliveries) // 2]
        deliveries.insert(len(deliveries) // 2 + 1, d)
        return {"duplicated": {f"{line['subscriber']}|{d}"}}
    raise AssertionError('no "sub-outcomes" line of accepts')


BATCH_FAULTS = {
    "dropped-in-batch": drop_from_batch,
    "repeated-in-batch": repeat_in_batch,
}
