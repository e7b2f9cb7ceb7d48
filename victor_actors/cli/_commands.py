"""The read-only views of a store: ``inspect``, ``history``, ``show``, ``diff``, ``export``.

Each takes the read-only manager, its store and the parsed arguments, prints
its view, and returns the exit status; errors it cannot report in the view
itself are raised (the caller prints them on one line, status 2).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import attrs

from victor_actors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    ContextSnapshot,
    GlobalStateManager,
    ScopeAccessError,
    ScopeRef,
    VictorActorsError,
    __version__,
)
from victor_actors.cli._format import commit_json, iso, plain, scope_key, snapshot_dict, summary, to_json
from victor_actors.store import Store

__all__ = ["diff", "err", "export", "history", "inspect", "show"]

PROG = "victor-actors"


def err(message: object) -> None:
    """One line on stderr: ``victor-actors: error: ...``."""
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)


def _find(store: Store, ref: ScopeRef) -> ScopeRef:
    if store.scope_record(ref) is None:
        raise ScopeAccessError(f"no scope {ref} exists{did_you_mean(store, ref)}")
    return ref


def did_you_mean(store: Store, ref: ScopeRef) -> str:
    """``"; did you mean conversation:alice?"`` for a near miss among the stored scopes, else ``""``."""
    names = [str(r.ref) for r in store.scope_records()]
    close = difflib.get_close_matches(str(ref), names, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def inspect(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
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
        for child in sorted(children.get(ref, []), key=scope_key):
            walk(child, depth + 1)

    for root in sorted(children.get(None, []), key=scope_key):
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
        err(f"{failed} scope(s) could not be loaded (see the table above)")
        return 2
    return 0


def history(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    ref = _find(store, args.scope)
    ckpts = {c.version: c for c in store.checkpoints(ref)}
    logged = store.log_versions(ref)
    in_log = set(logged)
    span = f" (v{logged[0]}..v{logged[-1]})" if logged else ""
    marks = ", ".join(f"v{v}" for v in sorted(ckpts)) or "none"
    print(f"{ref}: {len(logged)} commit(s) in the log{span}; checkpoints: {marks}")
    bad = 0
    versions = sorted(in_log | set(ckpts))
    if args.limit is not None:
        if len(versions) > args.limit:
            print(f"(the newest {args.limit} of {len(versions)}; --limit 0 for all)")
        versions = versions[-args.limit :] if args.limit else versions
    for v in versions:
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
        print(f"v{v:<4} {rec.commit_id}  {iso(rec.timestamp)}  {run}  {rec.kind:<5}  {summary(rec)}{mark}")
    if bad:
        err(f"{ref}: {bad} stored commit(s) are unreadable")
        return 2
    return 0


def show(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    ref, version = _find(store, args.scope), args.version
    snap = manager.scope(ref).snapshot() if version is None else _state_at(manager, store, ref, version)
    print(to_json(snapshot_dict(snap), pretty=True))
    return 0


def _map_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    lines = []
    for key in sorted(old.keys() | new.keys()):
        if key not in old:
            lines.append(f"  + {key} = {to_json(new[key])}")
        elif key not in new:
            lines.append(f"  - {key} (was {to_json(old[key])})")
        elif old[key] != new[key]:
            lines.append(f"  ~ {key}: {to_json(old[key])} -> {to_json(new[key])}")
    return lines


def _section(title: str, lines: list[str]) -> None:
    print(f"{title}: {'no changes' if not lines else ''}".rstrip())
    for line in lines:
        print(line)


def _state_at(manager: GlobalStateManager, store: Store, ref: ScopeRef, version: int) -> ContextSnapshot:
    _find(store, ref)
    try:
        return manager.state_at(ref, version)
    except CheckpointNotFoundError:
        stored = [*store.log_versions(ref), *(c.version for c in store.checkpoints(ref))]
        newest = max([0, *stored])
        if version > newest:
            raise CheckpointNotFoundError(f"{ref} has no version {version}; its newest is {newest}") from None
        if stored:
            oldest = (
                min(c.version for c in store.checkpoints(ref)) if store.checkpoints(ref) else min(stored) - 1
            )
            raise CheckpointNotFoundError(
                f"{ref}: version {version} is no longer stored; retention keeps v{oldest} to v{newest}"
            ) from None
        raise


def diff(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
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
        print(f"  + {to_json(message)}")
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
    out.update(snapshot_dict(snap))  # keeps the order above for ref and version
    out["stored_bytes"] = store.size_of(ref)
    out["checkpoints"] = []
    for c in manager.list_checkpoints(ref):  # an unreadable checkpoint is listed with timestamp 0.0
        when = iso(c.timestamp) if c.timestamp else None
        info = {"id": c.checkpoint_id, "version": c.version, "label": c.label, "time": when, "size": c.size}
        out["checkpoints"].append(info)
    out["log"] = [commit_json(store.commit_record(ref, v)) for v in store.log_versions(ref)]
    return out


def export(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    if args.scope is not None:
        refs = [_find(store, args.scope)]
    else:
        refs = sorted((r.ref for r in store.scope_records()), key=scope_key)
    scopes = [_scope_json(manager, store, ref) for ref in refs]
    reports = [attrs.asdict(r, value_serializer=plain) for r in manager.recovery_reports]
    doc = {"store": os.path.abspath(store.path), "victor_actors": __version__, "scopes": scopes}
    text = to_json(doc | {"recovery_reports": reports}, pretty=True) + "\n"
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_outside(store, args.output, text)
        print(f"wrote {len(scopes)} scope(s) to {args.output}")
    return 0


def write_outside(store: Store, output: str, text: str) -> None:
    """Write ``text`` to ``output`` through a temporary file and a rename, never inside the store.

    Raises:
        ScopeAccessError: ``output`` is inside the store's directory (also
            through a symbolic link); nothing was written.
    """
    target = os.path.realpath(output)
    home = os.path.realpath(store.path)
    if target == home or target.startswith(home + os.sep):
        raise ScopeAccessError(
            f"--output {output!r} is inside the store {store.path!r}; the command line only reads "
            "a store, so nothing was written"
        )
    directory = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(prefix=".victor-actors-export-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
