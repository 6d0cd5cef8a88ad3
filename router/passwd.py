"""``eorouter passwd``: the users of password logins (SASL PLAIN and SCRAM), kept in a
Cyrus sasldb that a router's ``[sasl] users_db`` names (docs/security.md, "Logins").

Cyrus's own ``saslpasswd2`` writes the file (the router checks passwords with Cyrus,
so the file is Cyrus's format, written by Cyrus's tool); this command gives it the
router's realm, reads the password without echo or from stdin, keeps the file
private to its owner, and lists users with ``sasldblistusers2``.
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_REALM = "eorouter"


def register(commands) -> None:
    cmd = commands.add_parser(
        "passwd",
        help="add, change, delete or list the users of password logins",
        description="Add or change a user of SASL PLAIN/SCRAM logins in a sasldb ([sasl] users_db). "
        "Clients then log in as NAME@REALM (docs/security.md).",
    )
    cmd.add_argument("name", nargs="?", metavar="NAME", help="the user (without @realm)")
    cmd.add_argument("--db", required=True, metavar="FILE", help="the sasldb file (created when missing)")
    cmd.add_argument("--realm", default=DEFAULT_REALM, help=f"the realm, as [sasl] realm says (default: {DEFAULT_REALM})")
    what = cmd.add_mutually_exclusive_group()
    what.add_argument("--delete", action="store_true", help="remove NAME")
    what.add_argument("--list", action="store_true", help="list the users in the file")
    cmd.add_argument("--password-stdin", action="store_true", help="read the password from stdin (one line), no prompt")
    cmd.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"eorouter passwd: {message}", file=sys.stderr, flush=True)
    return 2


def _tool(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), None)


def run(args: argparse.Namespace) -> int:
    db = Path(args.db).expanduser()
    if args.list:
        if not db.exists():
            return _fail(f"no such file: {db}")
        try:
            users = _users(db)
        except OSError as exc:
            return _fail(str(exc))
        for user in users:
            print(user)
        return 0
    if not args.name:
        return _fail("NAME is required (or --list)")
    if "@" in args.name or not args.name.strip() or any(c.isspace() for c in args.name):
        return _fail(f"{args.name!r}: a user name without '@' or spaces (the realm is --realm)")
    tool = _tool("saslpasswd2")
    if tool is None:
        return _fail("saslpasswd2 not found: install Cyrus SASL's tools (Debian: sasl2-bin; sudo scripts/setup-root)")
    if args.delete:
        if not db.exists():
            return _fail(f"no such file: {db}")
        if f"{args.name}@{args.realm}" not in _users(db):  # saslpasswd2 -d says nothing either way
            return _fail(f"no user {args.name}@{args.realm} in {db}")
        out = subprocess.run([tool, "-f", str(db), "-u", args.realm, "-d", args.name], capture_output=True, text=True)
        if out.returncode:
            return _fail(f"cannot delete {args.name}@{args.realm}: {out.stderr.strip() or 'no such user'}")
        print(f"deleted {args.name}@{args.realm} from {db}")
        return 0
    password = _read_password(args.password_stdin)
    if password is None:
        return _fail("the two passwords differ")
    if not password:
        return _fail("an empty password")
    db.parent.mkdir(parents=True, exist_ok=True)
    old_umask = os.umask(0o077)  # a sasldb holds what SCRAM and PLAIN check: its owner's only
    try:
        out = subprocess.run(
            [tool, "-p", "-f", str(db), "-u", args.realm, "-c", args.name], input=password, capture_output=True, text=True
        )
    finally:
        os.umask(old_umask)
    if out.returncode:
        return _fail(f"cannot write {db}: {out.stderr.strip() or out.stdout.strip()}")
    os.chmod(db, 0o600)
    print(f"{args.name}@{args.realm} set in {db}")
    return 0


def _users(db: Path) -> list[str]:
    """The users (name@realm) in ``db``; OSError when it cannot be read."""
    lister = _tool("sasldblistusers2")
    if lister is None:
        raise OSError("sasldblistusers2 not found: install Cyrus SASL's tools (Debian: sasl2-bin; sudo scripts/setup-root)")
    out = subprocess.run([lister, "-f", str(db)], capture_output=True, text=True)
    if out.returncode:
        raise OSError(f"cannot read {db}: {out.stderr.strip() or out.stdout.strip()}")
    return sorted({line.partition(":")[0].strip() for line in out.stdout.splitlines() if line.strip()})


def _read_password(from_stdin: bool) -> str | None:
    if from_stdin or not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("password: ")
    second = getpass.getpass("again: ")
    return first if first == second else None
