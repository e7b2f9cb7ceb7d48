"""The ``victor-actors`` command: parse the arguments, open the store read-only, run the view.

``simulate`` and ``bench`` are their own subpackages' commands (they write
their own stores); every other command opens ``PATH`` with
``GlobalStateManager.open(path, read_only=True)`` and prints a view of it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable

import lmdb

import victor_actors.bench as bench
import victor_actors.remote._owner as owner
import victor_actors.sim as sim
import victor_actors.web as web
from victor_actors import GlobalStateManager, Keyring, ScopeRef, VictorActorsError, __version__
from victor_actors.cli import _commands as views
from victor_actors.store import Store, rekey

__all__ = ["main"]

PROG = views.PROG
KEYS_ENV = "VICTOR_ACTORS_KEYS"
Command = Callable[[GlobalStateManager, Store, argparse.Namespace], int]


def _ref_arg(text: str) -> ScopeRef:
    try:
        return ScopeRef.parse(text)
    except VictorActorsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _version_arg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a version is a non-negative integer, not {text!r}")
    return int(text)


def add_key_file(parser: argparse.ArgumentParser) -> None:
    """``--key-file FILE`` for commands that read a store (else ``$VICTOR_ACTORS_KEYS``, else no key)."""
    parser.add_argument(
        "--key-file",
        metavar="FILE",
        help=f"the key file of an encrypted store (mode 0600); default: ${KEYS_ENV} if set",
    )


def keyring_of(args: argparse.Namespace) -> Keyring | None:
    """The keyring the command was given, or None (a plaintext store).

    Raises:
        EncryptionKeyError: the key file or the variable is unreadable or malformed.
    """
    path = getattr(args, "key_file", None)
    if path:
        return Keyring.from_file(path)
    if os.environ.get(KEYS_ENV):
        return Keyring.from_env(KEYS_ENV)
    return None


def _rekey(args: argparse.Namespace) -> int:
    new = Keyring.from_file(args.key_file)
    old = Keyring.from_file(args.old_key_file) if args.old_key_file else None
    dropped = _Dropped()
    logger = logging.getLogger("victor_actors")
    if args.drop_damaged:
        logger.addHandler(dropped)
    try:
        written = rekey(args.path, new, old, drop_damaged=args.drop_damaged)
    finally:
        logger.removeHandler(dropped)
    for line in dropped.lines:
        print(f"{PROG}: warning: {line}", file=sys.stderr)
    left_out = f"; {len(dropped.lines)} damaged record(s) left out (listed above)" if dropped.lines else ""
    print(
        f"rekeyed {args.path}: {written} records under key {new.active!r}{left_out}; "
        "the old key is no longer needed"
    )
    return 0


class _Dropped(logging.Handler):
    """Collects what ``rekey --drop-damaged`` left out (the rewrite logs each record)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("rewrite: "):
            self.lines.append(record.getMessage())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Views of a victor_actors store, and the runtime's tools. inspect, history, show, diff and "
            "export only read a store (also while another process owns it) and never write to it; "
            "simulate writes a store of its own (a temporary one unless --store is given); bench "
            "writes only temporary stores; rekey rewrites a store under a new key."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Command, text: str, scope: str | None = "SCOPE") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("path", metavar="PATH", help="the store directory")
        add_key_file(p)
        if scope == "SCOPE":
            p.add_argument("scope", type=_ref_arg, metavar="SCOPE", help="a scope ref, e.g. conversation:c1")
        elif scope == "SCOPE?":
            p.add_argument("scope", type=_ref_arg, nargs="?", metavar="SCOPE", help="one scope (default all)")
        p.set_defaults(run=run)
        return p

    tree = "the scope tree with versions, checkpoints and stored bytes, a page at a time"
    inspect = command("inspect", views.inspect, tree, None)
    inspect.set_defaults(check=views.parse_inspect)
    inspect.add_argument(
        "--limit",
        default=str(views.DEFAULT_LIMIT),
        metavar="N",
        help=f"at most N rows, read a page at a time (default {views.DEFAULT_LIMIT}; 0: all of them)",
    )
    inspect.add_argument(
        "--after",
        metavar="REF",
        help="start after this scope: the --after value the previous page printed, e.g. conversation:c000123",
    )
    inspect.add_argument(
        "--level",
        metavar="LEVEL",
        help="a flat list of the scopes of LEVEL (global, team, workflow or conversation), in key order",
    )
    inspect.add_argument(
        "--prefix",
        metavar="ID_PREFIX",
        help="a flat list of the scopes whose id starts with ID_PREFIX (of --level if given, else any level)",
    )
    history = command("history", views.history, "one line per stored commit of a scope")
    history.add_argument(
        "--limit", type=_version_arg, metavar="N", help="only the newest N commits (0: all, the default)"
    )
    show = command("show", views.show, "a scope's state as JSON (current, or at --version)")
    show.add_argument("--version", type=_version_arg, metavar="V", help="the version to rebuild")
    diff = command("diff", views.diff, "what changed in a scope between two versions")
    diff.add_argument("v1", type=_version_arg, metavar="V1", help="the older version")
    diff.add_argument("v2", type=_version_arg, metavar="V2", help="the newer version")
    export = command("export", views.export, "state, checkpoints and commit log as JSON", "SCOPE?")
    export.add_argument("--json", action="store_true", help="JSON output (the only format; the default)")
    export.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    rekey = sub.add_parser(
        "rekey",
        help="rewrite an encrypted (or plaintext) store under a new key; this command writes",
        description=(
            "Rewrite every record and key of the store at PATH under the active key of --key-file, into a "
            "fresh environment swapped in by renames: a crash at any point leaves the old store or the new "
            "one, whole. Afterwards the old key is not needed. The store must not be open elsewhere."
        ),
    )
    rekey.add_argument("path", metavar="PATH", help="the store directory")
    rekey.add_argument("--key-file", required=True, metavar="NEW", help="the new key file (mode 0600)")
    rekey.add_argument(
        "--old-key-file",
        metavar="OLD",
        help=(
            "the key file the store is encrypted with now (none: it is plaintext); records it does not "
            "open are tried with NEW (sealed after the first step of a rotation)"
        ),
    )
    rekey.add_argument(
        "--drop-damaged",
        action="store_true",
        help=(
            "leave out records that open with neither key file (each is listed) instead of refusing; "
            "without it, any such record refuses the rewrite and the store is left as it was"
        ),
    )
    sim.add_parser(sub)
    web.add_parser(sub)
    owner.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0; 2 on any error; 1 when stdout closes early).

    Every error of the runtime (a :class:`VictorActorsError`), of the file
    system or of LMDB is one line on stderr and exit status 2, whatever the
    command; never a traceback.
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        return _run(args)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (VictorActorsError, OSError, lmdb.Error) as exc:
        views.err(exc)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "simulate":  # writes its own store: not a read-only view
        return sim.run_command(args)
    if args.command == "bench":  # runs the benchmarks: not a view of a store
        return bench.run_command(args)
    if args.command == "serve":  # serves a read-only view until stopped
        return web.run_command(args, encryption=keyring_of(args))
    if args.command == "rekey":
        return _rekey(args)
    if args.command in ("owner", "ping"):  # owns a store and serves it; asks an owner
        return owner.run_command(args)
    check: Callable[[argparse.Namespace], None] | None = getattr(args, "check", None)
    if check is not None:  # the command's own options, checked before the store is opened
        try:
            check(args)
        except ValueError as exc:
            views.err(exc)
            return 2
    run: Command = args.run
    with GlobalStateManager.open(args.path, read_only=True, encryption=keyring_of(args)) as manager:
        store = manager.store
        assert store is not None
        return run(manager, store, args)
