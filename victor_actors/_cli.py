"""The ``victor-actors`` command line: read-only views of an LMDB store.

Every command opens the store with ``GlobalStateManager.open(path, read_only=True)``,
so it works while another process owns the store for writing. Errors print
one line to stderr and exit with status 2. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import attrs
import lmdb

from victor_actors import __version__
from victor_actors._bench import add_parser as _add_bench
from victor_actors._bench import run_command as _bench
from victor_actors._errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    ScopeAccessError,
    VictorActorsError,
)
from victor_actors._manager import GlobalStateManager
from victor_actors._model import ScopeRef, StateScope, TransitionType
from victor_actors._simulate import add_parser as _add_simulate
from victor_actors._simulate import run_command as _simulate
from victor_actors._state import ContextSnapshot
from victor_actors._values import thaw
from victor_actors.store import CommitRecord, Store

__all__ = ["main"]

PROG = "victor-actors"
_LEVEL = {scope: i for i, scope in enumerate(StateScope)}
_KEYED = (TransitionType.UPDATE_STATE, TransitionType.DELETE_STATE)
Command = Callable[[GlobalStateManager, Store, argparse.Namespace], int]


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _json(value: Any, *, pretty: bool = False) -> str:
    return json.dumps(thaw(value), default=_json_default, ensure_ascii=False, indent=2 if pretty else None)


def _plain(_inst: Any, _field: Any, value: Any) -> Any:
    return str(value) if isinstance(value, ScopeRef) else value


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _err(message: object) -> None:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)


def _scope_key(ref: ScopeRef) -> tuple[int, str]:
    return _LEVEL[ref.scope], ref.id


def _snapshot_dict(snap: ContextSnapshot) -> dict[str, Any]:
    """``snap.to_dict()`` with its maps in key order (persistent maps iterate in hash order)."""
    out = snap.to_dict()
    for name in ("state", "capabilities", "pending_tool_requests"):
        out[name] = dict(sorted(out[name].items()))
    return out


def _find(store: Store, ref: ScopeRef) -> ScopeRef:
    if store.scope_record(ref) is None:
        raise ScopeAccessError(f"no scope {ref} exists")
    return ref


# -- commit summaries ---------------------------------------------------------


def _tally(rec: CommitRecord) -> tuple[dict[str, int], dict[str, list[str]]]:
    counts: dict[str, int] = {}
    keys: dict[str, list[str]] = {}
    for outer in rec.transitions:
        for t in outer.flatten():
            name = t.transition_type.value
            counts[name] = counts.get(name, 0) + 1
            if t.transition_type in _KEYED and t.data["key"] not in keys.setdefault(name, []):
                keys[name].append(t.data["key"])
    return counts, keys


def _summary(rec: CommitRecord) -> str:
    if rec.kind == "reset":
        state = rec.state
        size = "" if state is None else f": {len(state.values)} keys, {len(state.messages)} messages"
        return f"scope set as a whole (restore or rollback){size}"
    counts, keys = _tally(rec)
    parts = []
    for name, n in counts.items():
        named = keys.get(name)
        parts.append(f"{name} x{n}" + (f" ({', '.join(named)})" if named else ""))
    return "; ".join(parts) or "no transitions"


def _commit_json(rec: CommitRecord) -> dict[str, Any]:
    counts, keys = _tally(rec)
    out: dict[str, Any] = {"version": rec.version, "commit_id": rec.commit_id, "time": _iso(rec.timestamp)}
    out |= {"run_id": rec.run_id, "kind": rec.kind, "summary": _summary(rec)}
    return out | {"transitions": counts, "keys": keys}


# -- commands -----------------------------------------------------------------


def _inspect(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    records = store.scope_records()
    known = {r.ref for r in records}
    children: dict[ScopeRef | None, list[ScopeRef]] = {}
    for r in records:
        parent = r.lineage[0] if r.lineage and r.lineage[0] in known else None
        children.setdefault(parent, []).append(r.ref)
    rows: list[tuple[str, str, str, str]] = []
    failed = 0

    def walk(ref: ScopeRef, depth: int) -> None:
        nonlocal failed
        name = "  " * depth + str(ref)
        try:
            version = manager.scope(ref).version
            ckpts = manager.list_checkpoints(ref)
        except VictorActorsError as exc:
            failed += 1
            rows.append((name, "-", "-", f"unreadable: {exc}"))
        else:
            newest = f" (newest v{ckpts[0].version})" if ckpts else ""
            rows.append((name, str(version), f"{len(ckpts)}{newest}", str(store.size_of(ref))))
        for child in sorted(children.get(ref, []), key=_scope_key):
            walk(child, depth + 1)

    for root in sorted(children.get(None, []), key=_scope_key):
        walk(root, 0)
    print(f"store {os.path.abspath(store.path)}: {len(records)} scopes")
    table = [("SCOPE", "VERSION", "CHECKPOINTS", "BYTES"), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for name, version, ckpts, size in table:
        print(f"{name:<{widths[0]}}  {version:>{widths[1]}}  {ckpts:<{widths[2]}}  {size}".rstrip())
    reports = manager.recovery_reports
    if reports:
        print("recovery reports:")
    for rep in reports:
        base = "no checkpoint" if rep.checkpoint_version is None else f"checkpoint v{rep.checkpoint_version}"
        print(
            f"  {rep.ref}: loaded at v{rep.version} from {base} + {rep.replayed} replayed commits, "
            f"newest stored v{rep.latest_stored_version}"
        )
        for why in rep.skipped:
            print(f"    skipped {why}")
    if not reports and not failed:
        print("recovery: every scope loaded cleanly")
    if failed:
        _err(f"{failed} scope(s) could not be loaded (see the table above)")
        return 2
    return 0


def _history(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    ref = _find(store, args.scope)
    ckpts = {c.version: c for c in store.checkpoints(ref)}
    logged = store.log_versions(ref)
    in_log = set(logged)
    span = f" (v{logged[0]}..v{logged[-1]})" if logged else ""
    marks = ", ".join(f"v{v}" for v in sorted(ckpts)) or "none"
    print(f"{ref}: {len(logged)} commit(s) in the log{span}; checkpoints: {marks}")
    bad = 0
    for v in sorted(in_log | set(ckpts)):
        info = ckpts.get(v)
        mark = "" if info is None else f"  [checkpoint{'' if info.label is None else ' ' + repr(info.label)}]"
        if v not in in_log:
            print(f"v{v:<4} (commit no longer in the log){mark}")
            continue
        try:
            rec = store.commit_record(ref, v)
        except CheckpointCorruptError as exc:
            bad += 1
            print(f"v{v:<4} UNREADABLE: {exc}{mark}")
            continue
        except CheckpointNotFoundError:
            print(f"v{v:<4} (pruned while reading){mark}")
            continue
        run = f"run={rec.run_id}" if rec.run_id else "-"
        print(f"v{v:<4} {rec.commit_id}  {_iso(rec.timestamp)}  {run}  {rec.kind:<5}  {_summary(rec)}{mark}")
    if bad:
        _err(f"{ref}: {bad} stored commit(s) are unreadable")
        return 2
    return 0


def _show(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    ref, version = args.scope, args.version
    snap = manager.scope(ref).snapshot() if version is None else _state_at(manager, store, ref, version)
    print(_json(_snapshot_dict(snap), pretty=True))
    return 0


def _map_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in old:
            lines.append(f"  + {key} = {_json(new[key])}")
        elif key not in new:
            lines.append(f"  - {key} (was {_json(old[key])})")
        elif old[key] != new[key]:
            lines.append(f"  ~ {key}: {_json(old[key])} -> {_json(new[key])}")
    return lines


def _section(title: str, lines: list[str]) -> None:
    print(f"{title}: {'no changes' if not lines else ''}".rstrip())
    for line in lines:
        print(line)


def _state_at(manager: GlobalStateManager, store: Store, ref: ScopeRef, version: int) -> ContextSnapshot:
    try:
        return manager.state_at(ref, version)
    except CheckpointNotFoundError:
        newest = max([0, *store.log_versions(ref), *(c.version for c in store.checkpoints(ref))])
        if version > newest:
            raise CheckpointNotFoundError(f"{ref} has no version {version}; its newest is {newest}") from None
        raise


def _diff(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    a = _state_at(manager, store, args.scope, args.v1)
    b = _state_at(manager, store, args.scope, args.v2)
    print(f"{a.ref}: v{a.version} -> v{b.version}")
    _section("state", _map_diff(a.state, b.state))
    old, new = a.messages, b.messages
    common = 0
    while common < min(len(old), len(new)) and old[common] == new[common]:
        common += 1
    removed, added = len(old) - common, new[common:]
    gone = f", {removed} no longer present" if removed else ""
    if added or removed:
        print(f"messages: {len(added)} added{gone} ({len(old)} -> {len(new)})")
    else:
        print(f"messages: no changes ({len(new)})")
    for message in added:
        print(f"  + {_json(message)}")
    _section("capabilities", _map_diff(a.capabilities, b.capabilities))
    if a.conversation_stage != b.conversation_stage:
        print(f"stage: {a.conversation_stage} -> {b.conversation_stage}")
    else:
        print(f"stage: unchanged ({a.conversation_stage})")
    if a.is_closed != b.is_closed:
        print(f"closed: {a.is_closed} -> {b.is_closed}")
    return 0


def _scope_json(manager: GlobalStateManager, store: Store, ref: ScopeRef) -> dict[str, Any]:
    snap = manager.scope(ref).snapshot()
    out: dict[str, Any] = {"ref": str(ref), "version": snap.version}
    out["parent"] = None if snap.parent is None else str(snap.parent)
    out["lineage"] = [str(r) for r in snap.ancestors]
    out.update(_snapshot_dict(snap))  # keeps the order above for ref and version
    out["stored_bytes"] = store.size_of(ref)
    out["checkpoints"] = []
    for c in manager.list_checkpoints(ref):  # an unreadable checkpoint is listed with timestamp 0.0
        when = _iso(c.timestamp) if c.timestamp else None
        info = {"id": c.checkpoint_id, "version": c.version, "label": c.label, "time": when, "size": c.size}
        out["checkpoints"].append(info)
    out["log"] = [_commit_json(store.commit_record(ref, v)) for v in store.log_versions(ref)]
    return out


def _export(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    if args.scope is not None:
        refs = [_find(store, args.scope)]
    else:
        refs = sorted((r.ref for r in store.scope_records()), key=_scope_key)
    scopes = [_scope_json(manager, store, ref) for ref in refs]
    reports = [attrs.asdict(r, value_serializer=_plain) for r in manager.recovery_reports]
    doc = {"store": os.path.abspath(store.path), "victor_actors": __version__, "scopes": scopes}
    text = _json(doc | {"recovery_reports": reports}, pretty=True) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {len(scopes)} scope(s) to {args.output}")
    return 0


# -- parsing ------------------------------------------------------------------


def _ref_arg(text: str) -> ScopeRef:
    try:
        return ScopeRef.parse(text)
    except VictorActorsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _version_arg(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a version is a non-negative integer, not {text!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Read-only views of a victor_actors store.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Command, text: str, scope: str | None = "SCOPE") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("path", metavar="PATH", help="the store directory")
        if scope == "SCOPE":
            p.add_argument("scope", type=_ref_arg, metavar="SCOPE", help="a scope ref, e.g. conversation:c1")
        elif scope == "SCOPE?":
            p.add_argument("scope", type=_ref_arg, nargs="?", metavar="SCOPE", help="one scope (default all)")
        p.set_defaults(run=run)
        return p

    command("inspect", _inspect, "the scope tree with versions, checkpoints and stored bytes", None)
    command("history", _history, "one line per stored commit of a scope")
    show = command("show", _show, "a scope's state as JSON (current, or at --version)")
    show.add_argument("--version", type=_version_arg, metavar="V", help="the version to rebuild")
    diff = command("diff", _diff, "what changed in a scope between two versions")
    diff.add_argument("v1", type=_version_arg, metavar="V1")
    diff.add_argument("v2", type=_version_arg, metavar="V2")
    export = command("export", _export, "state, checkpoints and commit log as JSON", "SCOPE?")
    export.add_argument("--json", action="store_true", help="JSON output (the only format; the default)")
    export.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    _add_simulate(sub)
    _add_bench(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0; 2 on any error; 1 when stdout closes early)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    if args.command == "simulate":  # writes its own store: not a read-only view
        return _simulate(args)
    if args.command == "bench":  # runs the benchmark scripts: not a view of a store
        return _bench(args)
    run: Command = args.run
    try:
        with GlobalStateManager.open(args.path, read_only=True) as manager:
            store = manager.store
            assert store is not None
            return run(manager, store, args)
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (VictorActorsError, OSError, lmdb.Error) as exc:
        _err(exc)
        return 2
