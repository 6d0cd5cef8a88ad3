"""The router's append-only event log: JSON lines, one file set per router.

Every decision the core makes that matters for exactly-once (a delivery received,
forwarded, answered, settled, forgotten) becomes one JSON object on one line. The
offline reconciliation job (Spark, later) reads these lines to prove that every
published message reached every subscriber once, or to show where it did not.

Layout (``data_dir`` is the router's data directory)::

    data_dir/epoch                               restart counter, one integer
    data_dir/lock                                held (flock) while a log is open
    data_dir/events/events-<epoch:06d>-<n:06d>.jsonl

Write discipline: ``append()`` only encodes into memory; ``flush()`` writes every
buffered line with one ``write()``. The adapter flushes once per event-loop
iteration *before* any frame of that iteration reaches a socket, so an event whose
consequence a peer could have seen is already in the kernel when the peer sees it
(a SIGKILL loses nothing; a power cut can, unless ``fsync=True``).

Order: ``seq`` restarts at 1 in every epoch (the first event of an epoch is
``router-started``), so events of one router are totally ordered by
``(epoch, seq)``. ``ts`` is informational (wall clocks step).

The schema (``EVENT_SCHEMA`` for the fields every line carries, ``EVENTS`` for each
kind's own fields, ``FOLDS`` for the lines that stand for several events) is
router/eventschema.py, which every reader and writer of the log shares. Callers
pass binary values (tags) as hex strings: orjson refuses ``bytes``. Full
description: docs/event-log.md.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter
from typing import Any

import orjson

from router import __version__
from router.buckets import Buckets
from router.eventschema import FOLDED, unfold

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_RETENTION",
    "EventLog",
    "EventLogError",
    "EventReader",
    "read_events",
]

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_RETENTION = 10

# ---------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------


class EventLogError(Exception):
    """A problem with the event log's files (lock held, bad epoch file, bad line)."""


_FILE_RE = re.compile(r"^events-(\d{6,})-(\d{6,})\.jsonl$")


def _log_files(directory: Path) -> list[str]:
    """Names of the log files in ``directory``, oldest first: by (epoch, file
    number), which is name order as long as both fit in six digits."""
    found = []
    for name in os.listdir(directory):
        m = _FILE_RE.match(name)
        if m:
            found.append(((int(m.group(1)), int(m.group(2))), name))
    return [name for _, name in sorted(found)]


_dumps = orjson.dumps
_NEWLINE = orjson.OPT_APPEND_NEWLINE


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new content."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class EventLog:
    """The append-only event log of one router process.

    Opening it takes the data directory's lock, bumps the persisted restart
    counter (``epoch``), opens a new log file and buffers a ``router-started``
    event. Then: ``append()`` per event (memory only), ``flush()`` per loop
    iteration (one write), ``close()`` at exit. Not thread-safe; one per process.
    """

    #: The encoder append() uses for a line's fields. The adapter's compiled twin of
    #: append (router/adapter/_fastpath.c, log_line) uses it too, and reads and writes
    #: the buffer state append keeps (``_run``, ``_ts``, ``_pieces``, ``_seq``,
    #: ``_write``; ``_close_run()``, ``_piece()``): their names and meaning are shared
    #: with it (tests/integration/test_fastpath.py holds the two to the same bytes).
    encoder = staticmethod(_dumps)
    # That shared state in plain slots: the compiled twin reads and writes them by
    # offset (router/core/_attrs.h), not through the instance's dict.
    __slots__ = ("_run", "_ts", "_pieces", "_seq", "_write", "__dict__")

    def __init__(
        self,
        data_dir: str | os.PathLike,
        router_id: str,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        retention: int = DEFAULT_RETENTION,
        fsync: bool = False,
        buffer: Any = None,
    ) -> None:
        if not isinstance(router_id, str) or not router_id:
            raise ValueError(f"router_id must be a non-empty string, not {router_id!r}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, not {max_bytes!r}")
        if retention < 1:
            raise ValueError(f"retention must be at least 1, not {retention!r}")
        self._data_dir = Path(data_dir)
        self._events_dir = self._data_dir / "events"
        self._router_id = router_id
        self._max_bytes = max_bytes
        self._retention = retention
        self._fsync = fsync
        self._fd = -1
        # Encoded lines waiting for flush(): the first ``tell()`` bytes of a BytesIO
        # that is rewound, never emptied, after each flush. Its memory stays allocated
        # at the size of the largest batch so far. A bytearray that is cleared after
        # each flush gives its memory back and then regrows by 1/8 steps, each a
        # realloc that may copy the whole batch so far (in the router, timings of the
        # two were within the machine's noise; the BytesIO never reallocates once
        # warm). A list of line objects freed together at each flush was much worse
        # (glibc trimmed and regrew its heap every loop iteration: ~3-4 µs per append).
        # ``buffer``, when given, is an empty object with the same methods used here
        # (the adapter's compiled LogBuffer, router/adapter/_logbuffer.h, which its
        # compiled twin of append writes into in place).
        self._out = io.BytesIO() if buffer is None else buffer
        self._write = self._out.write
        self._seq = 0
        # append() writes each line from pieces: '{"seq":', the seq, the cached
        # ',"ts":<ts>' of the last timestamp seen (one per loop iteration), the cached
        # ',"router":…,"epoch":…,"boot":…,"event":"<kind>",' of the kind, and the
        # encoded fields without their opening brace. Same bytes as one dumps() of the
        # merged dict, without building that dict (~0.1-0.3 µs per line).
        self._ts: float | None = None
        self._ts_piece = b""
        self._heads: dict[str, bytes] = {}
        # kind -> ts piece + head, for the timestamp self._ts. Only ever added to, and replaced
        # by a new dict when the timestamp changes: the compiled twin keeps what it read from
        # one dict (a kind's piece there never changes).
        self._pieces: dict[str, bytes] = {}
        # (subscriber, outcome, settled) -> the end of a "sub-outcome" line (append_sub_outcome)
        self._sub_tails: dict[tuple, bytes] = {}
        # append_sub_outcome's open run: consecutive sub-outcomes of one subscriber with
        # the same outcome and settled flag, written as one line when something else is
        # appended or at flush (_close_run). The deliveries, then what they share.
        self._run: list[str] = []
        # (meaningful while ``_run`` holds deliveries)
        self._run_subscriber = ""
        self._run_outcome = ""
        self._run_settled = False
        self._run_ts: float | None = None
        # What an operator reads (router/adapter/metrics.py): bytes written, files
        # rotated, and how long flush() and fsync took.
        self.bytes_written = 0
        self.rotations = 0
        self.flush_seconds = Buckets()
        self.fsync_seconds = Buckets()

        self._events_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._lock()
        try:
            self._epoch = self._next_epoch()
            self._boot_id = os.urandom(8).hex()
            self._file_no = 0
            self._open_next_file()
            self.append("router-started", time.time(), {"pid": os.getpid(), "version": __version__})
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            os.close(self._lock_fd)
            raise

    # -- identity ----------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Restart counter of this data directory: 1 on the first open, +1 per open."""
        return self._epoch

    @property
    def boot_id(self) -> str:
        """16 random hex characters, new on every open."""
        return self._boot_id

    @property
    def router_id(self) -> str:
        return self._router_id

    @property
    def path(self) -> Path:
        """The file being written now."""
        return self._path

    @property
    def pending(self) -> int:
        """Lines appended but not yet written by ``flush()`` (a line a failed
        write left half-written counts as pending; an open run of sub-outcomes as
        the one line it will be)."""
        with self._out.getbuffer() as view:
            return bytes(view[: self._out.tell()]).count(b"\n") + (1 if self._run else 0)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    # -- the hot path --------------------------------------------------------

    def append(self, kind: str, ts: float, fields: dict) -> None:
        """Encode one event into the in-memory buffer; no system call.

        ``fields`` are the kind's own fields (see ``EVENTS``); values must be
        JSON-able as orjson sees them: str, int, float, bool, None, list/tuple of
        those. Binary values (tags) must already be hex strings. ``fields`` must
        not use a common field's name (the line would carry it twice); validate_event()
        catches that in tests. An unencodable value raises orjson.JSONEncodeError
        (a TypeError) and the event is not recorded (``seq`` is not consumed).
        """
        # Measured (timeit, python 3.11, orjson 3.13, the repo's 2-core VM whose speed
        # drifts ~1.5x between runs): a dumps() of {"seq", "ts", ..., **fields} took
        # ~0.5 µs for a 4-field "sub-outcome" and ~0.75 µs for a 12-field "received";
        # encoding only ``fields`` and joining it to cached pieces of the common
        # fields takes ~0.4 / ~0.47 µs (same bytes). The flush adds ~0.05-0.15 µs per
        # line at 256 lines per flush (one write of the whole batch).
        body = _dumps(fields)  # raises before anything is buffered
        if self._run:  # in order: the run of sub-outcomes before it gets its line first
            self._close_run()
        if ts is not self._ts:  # the loop passes one float object per iteration
            self._ts = ts
            self._ts_piece = b',"ts":' + _dumps(ts)
            self._pieces = {}
        piece = self._pieces.get(kind)
        if piece is None:
            piece = self._piece(kind)
        seq = self._seq + 1
        # One %-format (positional dumps, no join, no second dumps for the seq):
        # ~1.5 k fewer instructions per line than the join of four pieces.
        if fields:  # else body is b'{}': an event without fields of its own
            self._write(b'{"seq":%d%b%b\n' % (seq, piece, body[1:]))
        else:
            self._write(b'{"seq":%d%b}\n' % (seq, piece[:-1]))
        self._seq = seq

    def append_sub_outcome(self, ts: float, delivery: str, subscriber: str, outcome: str, settled: bool) -> None:
        """``append("sub-outcome", ts, {"delivery": delivery, "subscriber": subscriber,
        "outcome": outcome, "settled": settled})`` for the per-copy path. Consecutive
        calls for one subscriber with the same outcome, settled flag and timestamp (one
        loop iteration) make a run that is written as one "sub-outcomes" line (a run of
        one as the "sub-outcome" line) when anything else is appended or at the next
        flush, so every line keeps its place in ``seq`` order and the write discipline
        is unchanged: the run reaches the OS in the same ``write()`` as before. A
        delivery id is hex digits and a ".": JSON needs no escaping for it."""
        run = self._run
        if run:
            if (
                subscriber == self._run_subscriber
                and settled is self._run_settled
                and outcome == self._run_outcome
                and ts is self._run_ts
            ):
                run.append(delivery)
                return
            self._close_run()
            run = self._run
        run.append(delivery)
        self._run_subscriber = subscriber
        self._run_outcome = outcome
        self._run_settled = settled
        self._run_ts = ts

    def append_sub_outcomes(self, ts: float, deliveries: list, subscriber: str, outcome: str, settled: bool) -> None:
        """``append_sub_outcome`` for each of ``deliveries``, in order."""
        run = self._run
        if run:
            if (
                subscriber == self._run_subscriber
                and settled is self._run_settled
                and outcome == self._run_outcome
                and ts is self._run_ts
            ):
                run += deliveries
                return
            self._close_run()
            run = self._run
        run += deliveries
        self._run_subscriber = subscriber
        self._run_outcome = outcome
        self._run_settled = settled
        self._run_ts = ts

    def _close_run(self) -> None:
        """Write the open run of append_sub_outcome() as its line."""
        run = self._run
        ts = self._run_ts
        if ts is not self._ts:
            self._ts = ts
            self._ts_piece = b',"ts":' + _dumps(ts)
            self._pieces = {}
        seq = self._seq + 1
        if len(run) == 1:
            subscriber, outcome, settled = self._run_subscriber, self._run_outcome, self._run_settled
            tail = self._sub_tails.get((subscriber, outcome, settled))
            if tail is None:
                tail = self._sub_tail(subscriber, outcome, settled)
            piece = self._pieces.get("sub-outcome")
            if piece is None:
                piece = self._piece("sub-outcome")
            self._write(b'{"seq":%d%b"delivery":"%b",%b' % (seq, piece, run[0].encode(), tail))
        else:
            piece = self._pieces.get("sub-outcomes")
            if piece is None:
                piece = self._piece("sub-outcomes")
            body = _dumps(
                {
                    "deliveries": run,
                    "subscriber": self._run_subscriber,
                    "outcome": self._run_outcome,
                    "settled": self._run_settled,
                }
            )
            self._write(b'{"seq":%d%b%b\n' % (seq, piece, body[1:]))
        self._seq = seq
        self._run = []

    def _sub_tail(self, subscriber: str, outcome: str, settled: bool) -> bytes:
        tails = self._sub_tails
        if len(tails) >= 4096:  # subscribers come and go: keep the cache bounded
            tails.clear()
        encoded = _dumps({"subscriber": subscriber, "outcome": outcome, "settled": settled})
        tail = tails[(subscriber, outcome, settled)] = encoded[1:] + b"\n"
        return tail

    def _piece(self, kind: str) -> bytes:
        """Everything of a line of ``kind`` between the seq and the kind's own fields:
        ',"ts":…,"router":…,"epoch":…,"boot":…,"event":"<kind>",' for the current
        timestamp (cached per timestamp; the "router" to "event" part per kind)."""
        head = self._heads.get(kind)
        if head is None:
            encoded = _dumps({"router": self._router_id, "epoch": self._epoch, "boot": self._boot_id, "event": kind})
            head = self._heads[kind] = b"," + encoded[1:-1] + b","
        piece = self._pieces[kind] = self._ts_piece + head
        return piece

    def flush(self) -> None:
        """Write every buffered event with one ``write()`` (looping on short writes),
        fsync if configured, then rotate if the file has reached ``max_bytes``.

        On a write error the unwritten bytes stay buffered (a half-written line is
        completed by the next successful flush) and the error propagates."""
        if self._run:
            self._close_run()
        out = self._out
        n = out.tell()
        if not n:
            return
        if self._fd < 0:
            raise EventLogError(f"event log {self._path} is closed; {self.pending} events not written")
        written = 0
        rest = None
        started = perf_counter()
        # Every view is released explicitly, even when a write raises (a traceback
        # may keep the argument alive): the buffer cannot grow while exported.
        try:
            with out.getbuffer() as view:
                try:
                    while written < n:  # more than once only after a short write (disk full, signal)
                        with view[written:n] as chunk:
                            written += os.write(self._fd, chunk)
                finally:
                    self._size += written
                    if written < n:
                        rest = bytes(view[written:n])
        finally:
            out.seek(0)
            if rest:  # a failed write: the unwritten bytes go first next time
                out.write(rest)
        self.bytes_written += written
        self.flush_seconds.observe(perf_counter() - started)
        if self._fsync:
            started = perf_counter()
            os.fsync(self._fd)
            self.fsync_seconds.observe(perf_counter() - started)
        if self._size >= self._max_bytes:
            self._rotate()
            self.rotations += 1

    def close(self) -> None:
        """Flush, close the file and release the data directory's lock. Idempotent."""
        if self._fd < 0:
            return
        try:
            self.flush()
        finally:
            os.close(self._fd)
            self._fd = -1
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -----------------------------------------------------------

    def _lock(self) -> int:
        fd = os.open(self._data_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise EventLogError(
                    f"data directory {self._data_dir} is in use by another router process "
                    f"(lock {self._data_dir / 'lock'} is held)"
                ) from None
            raise
        return fd

    def _next_epoch(self) -> int:
        """Read, increment and durably persist the restart counter. The counter also
        never goes below the newest epoch found in the log file names, so losing
        only the epoch file does not reuse an epoch."""
        epoch_file = self._data_dir / "epoch"
        try:
            text = epoch_file.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            stored = 0
        else:
            if not text.isdigit():
                raise EventLogError(f"{epoch_file}: expected a non-negative integer, found {text[:40]!r}")
            stored = int(text)
        from_files = max((int(m.group(1)) for n in _log_files(self._events_dir) if (m := _FILE_RE.match(n))), default=0)
        epoch = max(stored, from_files) + 1
        _write_atomic(epoch_file, f"{epoch}\n".encode("ascii"))
        return epoch

    def _open_next_file(self) -> None:
        self._file_no += 1
        path = self._events_dir / f"events-{self._epoch:06d}-{self._file_no:06d}.jsonl"
        fd = os.open(path, os.O_APPEND | os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
        self._fd = fd
        self._path = path
        self._size = os.fstat(fd).st_size
        if self._fsync:
            _fsync_dir(self._events_dir)
        self._apply_retention()

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = -1
        self._open_next_file()

    def _apply_retention(self) -> None:
        """Delete the oldest log files beyond ``retention``; never the open one."""
        names = _log_files(self._events_dir)
        excess = len(names) - self._retention
        for name in names:
            if excess <= 0:
                break
            if name == self._path.name:
                continue
            try:
                os.unlink(self._events_dir / name)
            except FileNotFoundError:
                pass
            excess -= 1


# ---------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------


class EventReader:
    """Iterates the events of one log file or of a directory of log files.

    A torn last line of a file (a partial write cut by a crash: unparsable, or not
    a JSON object) is skipped and counted: after iteration ``torn_lines`` is how
    many were skipped and ``torn`` lists ``(file, line_number)`` for each. The same
    problem on any other line raises EventLogError naming the file and line."""

    def __init__(self, path: str | os.PathLike, *, raw: bool = False) -> None:
        self.path = Path(path)
        self.raw = raw  # True: lines as written; False: folded lines unfolded (unfold())
        self.torn_lines = 0
        self.torn: list[tuple[Path, int]] = []
        self._files = self._list_files(self.path)
        self._iter = self._events()

    @property
    def files(self) -> list[Path]:
        """The files read, in order."""
        return list(self._files)

    @staticmethod
    def _list_files(path: Path) -> list[Path]:
        if path.is_dir():
            names = _log_files(path)
            if not names and (path / "events").is_dir():  # a router's data_dir
                path = path / "events"
                names = _log_files(path)
            return [path / n for n in names]
        if path.exists():
            return [path]
        raise FileNotFoundError(f"no event log at {path}")

    def __iter__(self) -> EventReader:
        return self

    def __next__(self) -> dict:
        return next(self._iter)

    def _events(self) -> Iterator[dict]:
        loads = orjson.loads
        raw = self.raw
        for file in self._files:
            with open(file, "rb") as f:
                lineno = 0
                for line in f:
                    lineno += 1
                    try:
                        record = loads(line)
                    except orjson.JSONDecodeError as exc:
                        problem = f"unparsable line ({exc})"
                    else:
                        if isinstance(record, dict):
                            if raw or record.get("event") not in FOLDED:
                                yield record
                            else:
                                yield from unfold(record)
                            continue
                        problem = f"not a JSON object ({type(record).__name__})"
                    if f.read(1) == b"":  # the last line: a torn write
                        self.torn_lines += 1
                        self.torn.append((file, lineno))
                        break
                    raise EventLogError(f"{file}:{lineno}: {problem}: {line[:80]!r}")


def read_events(path: str | os.PathLike, *, raw: bool = False) -> EventReader:
    """Events from a log file, or from every ``events-*.jsonl`` of a directory in
    name order (which is (epoch, file number) order). Given a router's data_dir, the
    files of its ``events`` subdirectory are read. Returns an EventReader: iterate
    it for dicts, then look at its ``torn_lines``. A folded line ("completed") is
    given as the events it stands for (``unfold()``, same ``seq``); ``raw=True``
    gives every line as written."""
    return EventReader(path, raw=raw)
