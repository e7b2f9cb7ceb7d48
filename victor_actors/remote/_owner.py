"""``victor-actors owner`` (one process owns a store and serves it) and ``victor-actors ping``.

The owner opens the store for writing (waiting ``--lock-timeout`` seconds for
a previous owner to let go: a rolling update), listens on a unix socket and,
if asked, on TCP, prints one line saying where, and serves until SIGTERM or
SIGINT. Then it stops accepting, lets the requests in progress finish,
flushes the store and exits 0. Any failure to start is one line on stderr
and exit status 2.

``ping`` asks an owner whether it answers (a readiness probe): exit 0 with
its pid and store, or 2 with why not.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from victor_actors._errors import VictorActorsError
from victor_actors._manager import GlobalStateManager
from victor_actors.remote._frames import read_token
from victor_actors.remote._manager import connect
from victor_actors.store import Keyring

__all__ = ["add_parser", "run_command"]

KEYS_ENV = "VICTOR_ACTORS_KEYS"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, not {text!r}") from None
    if not value >= 0 or value > 86400 * 7:
        raise argparse.ArgumentTypeError(f"a number of seconds from 0 to a week, not {text!r}")
    return value


def add_parser(sub: Any) -> None:
    """Add ``owner`` and ``ping`` to the ``victor-actors`` command line."""
    text = "own a store and serve its scopes to other processes until SIGTERM; this command writes"
    p = sub.add_parser("owner", help=text, description=text + ". See docs/deploying.md.")
    p.add_argument("path", metavar="PATH", help="the store directory (created if missing)")
    p.add_argument("--socket", metavar="SOCK", help="listen on this unix socket path")
    p.add_argument(
        "--tcp", metavar="HOST:PORT", help="also listen on TCP (beyond loopback: needs --token-file)"
    )
    p.add_argument("--token-file", metavar="F", help="clients must present the token in this file")
    p.add_argument(
        "--lock-timeout",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for a previous owner to release the store (a rolling update; default 0)",
    )
    p.add_argument(
        "--durability", choices=("sync", "async"), default="sync", help="commit durability (default sync)"
    )
    p.add_argument(
        "--key-file",
        metavar="FILE",
        help=f"the key file of an encrypted store (mode 0600); default: ${KEYS_ENV} if set",
    )
    p.add_argument(
        "--drain",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, let requests in progress finish for up to this long (default 10)",
    )
    text = "exit 0 if an owner answers at URL (a readiness probe), 2 if not"
    q = sub.add_parser("ping", help=text, description=text)
    q.add_argument("url", metavar="URL", help="unix:///path/to/socket or tcp://host:port")
    q.add_argument("--token-file", metavar="F", help="the owner's token file")
    q.add_argument("--timeout", type=_seconds, default=5.0, metavar="SECONDS", help="default 5")


def _err(exc: BaseException) -> None:
    sys.stderr.write(f"victor-actors: {type(exc).__name__}: {exc}\n")


def _urls(args: argparse.Namespace) -> list[str]:
    urls = []
    if args.socket:
        urls.append("unix://" + os.path.abspath(args.socket))
    if args.tcp:
        urls.append("tcp://" + args.tcp)
    if not urls:
        raise ValueError("give --socket SOCK (and/or --tcp HOST:PORT): the owner must listen somewhere")
    return urls


def _owner(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        urls = _urls(args)
        keys = None
        if args.key_file:
            keys = Keyring.from_file(args.key_file)
        elif os.environ.get(KEYS_ENV):
            keys = Keyring.from_env(KEYS_ENV)
        read_token(args.token_file)  # an unreadable token file is refused before the store is opened
        manager = GlobalStateManager.open(
            args.path,
            durability=args.durability,
            lock_timeout=args.lock_timeout,
            listen=urls,
            token_file=args.token_file,
            encryption=keys,
        )
    except (VictorActorsError, OSError, ValueError) as exc:
        _err(exc)
        return 2
    where = " ".join(manager.listening)
    # one write: a reader waiting for this line never sees half of it
    line = f"victor-actors owner: serving {os.path.abspath(args.path)} at {where} (pid {os.getpid()})\n"
    os.write(1, line.encode())
    try:
        while not stop.wait(0.5):  # wake now and then: a signal handler runs between waits
            pass
    finally:
        manager.close(timeout=args.drain)  # stops listening, drains the requests in progress, flushes
    os.write(1, b"victor-actors owner: stopped; every acknowledged commit is durable\n")
    return 0


def _ping(args: argparse.Namespace) -> int:
    try:
        client = connect(args.url, token_file=args.token_file, connect_timeout=max(args.timeout, 0.1))
        try:
            client.ping(timeout=max(args.timeout, 0.1))
            info = client.info()
        finally:
            client.close()
    except (VictorActorsError, OSError) as exc:
        _err(exc)
        return 2
    print(f"owner pid {info.get('pid')} serving {info.get('path') or 'a store in memory'}")
    return 0


def run_command(args: argparse.Namespace) -> int:
    """Run ``owner`` or ``ping`` (``args.command``)."""
    return _owner(args) if args.command == "owner" else _ping(args)
