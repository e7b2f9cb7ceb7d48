"""``victor-actors serve PATH``: the web inspector over a store, read-only, in the foreground."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import lmdb

from victor_actors import GlobalStateManager, VictorActorsError

__all__ = ["add_parser", "open_read_only", "run_command"]

# Scopes the inspector loads (to rebuild a version) are passivated after this long unviewed.
IDLE_TIMEOUT = 30.0


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 0 to 65535, not {text!r}")
    return int(text)


def add_parser(sub: Any) -> None:
    """Add ``serve`` to the command line's subcommands."""
    text = (
        "a read-only web inspector over a store (also while another process owns it): the scope tree, "
        "histories, diffs, conversations, checkpoints"
    )
    p = sub.add_parser("serve", help=text, description=text + ". It never writes to the store.")
    p.add_argument("path", metavar="PATH", help="the store directory")
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=_port, default=8765, help="the port (default 8765; 0 picks a free one)")
    p.add_argument(
        "--key-file",
        metavar="FILE",
        help="the key file of an encrypted store (mode 0600); default: $VICTOR_ACTORS_KEYS if set",
    )


def open_read_only(path: str, *, encryption: Any = None) -> GlobalStateManager:
    """The read-only manager the inspector reads ``path`` through.

    ``encryption`` (a keyring, for an encrypted store) is passed on to
    :meth:`GlobalStateManager.open` when given.
    """
    extra: dict[str, Any] = {} if encryption is None else {"encryption": encryption}
    return GlobalStateManager.open(path, read_only=True, idle_timeout=IDLE_TIMEOUT, **extra)


def run_command(args: argparse.Namespace, *, encryption: Any = None) -> int:
    """``victor-actors serve``: 0 once stopped with Ctrl-C; 2 if the store or the address is refused."""
    from victor_actors.web._server import EXTRA, is_loopback, serve_forever

    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        print(f"victor-actors: error: {EXTRA}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"victor-actors: serving {args.path} read-only at {url} (Ctrl-C stops)", flush=True)
        if not is_loopback(args.host):
            print(
                f"victor-actors: warning: {args.host} is not a loopback address: anyone who can reach it "
                "can read this store",
                file=sys.stderr,
                flush=True,
            )

    try:
        with open_read_only(args.path, encryption=encryption) as manager:
            serve_forever(manager, host=args.host, port=args.port, ready=ready)
    except KeyboardInterrupt:
        return 0
    except (VictorActorsError, OSError, lmdb.Error, ValueError) as exc:
        print(f"victor-actors: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0
