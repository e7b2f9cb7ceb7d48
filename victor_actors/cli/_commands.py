"""The read-only views of a store: ``inspect``, ``history``, ``show``, ``diff``, ``export``.

Each takes the read-only manager, its store and the parsed arguments, prints
its view, and returns the exit status; errors it cannot report in the view
itself are raised (the caller prints them on one line, status 2).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import dataclasses
import difflib
import itertools
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from victor_actors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    ContextSnapshot,
    GlobalStateManager,
    ScopeAccessError,
    ScopeRef,
    StateScope,
    VictorActorsError,
    __version__,
)
from victor_actors.cli._format import (
    commit_json,
    iso,
    kind_of,
    plain,
    scope_key,
    snapshot_dict,
    summary,
    to_json,
)
from victor_actors.store import Store

__all__ = [
    "DEFAULT_LIMIT",
    "diff",
    "did_you_mean",
    "err",
    "export",
    "history",
    "inspect",
    "parse_inspect",
    "show",
]

PROG = "victor-actors"


DEFAULT_LIMIT = 200  # inspect's rows per page when --limit is not given
SCAN_ALL = 2000  # did_you_mean reads every scope record only in a store of at most this many
_NEAR_WANT = 150  # did_you_mean on a bigger store: stop gathering candidates past this many
_LEVELS = ", ".join(s.value for s in StateScope)


def err(message: object) -> None:
    """One line on stderr: ``victor-actors: error: ...``."""
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)


def _find(store: Store, ref: ScopeRef) -> ScopeRef:
    if store.scope_record(ref) is None:
        raise ScopeAccessError(f"no scope {ref} exists{did_you_mean(store, ref)}")
    return ref


def did_you_mean(store: Store, ref: ScopeRef) -> str:
    """``"; did you mean conversation:alice?"`` for a near miss among the stored scopes, else ``""``.

    A store of at most :data:`SCAN_ALL` scopes is compared as a whole; in a
    bigger one only a bounded set of candidates is read (see ``_near``).
    """
    if store.scope_count() <= SCAN_ALL:
        names = [str(r.ref) for r in store.scope_records()]
    else:
        names = sorted(str(r) for r in _near(store, ref))
    close = difflib.get_close_matches(str(ref), names, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _near(store: Store, ref: ScopeRef) -> set[ScopeRef]:
    """Stored scopes that may be what ``ref`` meant, from a few bounded reads.

    The same id (and its lower and upper case) at each level, one lookup
    each; in a plaintext store also the scopes of ``ref``'s level whose id
    shares a beginning with ``ref``'s (longest first, in each case, one page
    of at most 50 per prefix) and the 20 after ``ref`` in key order. An
    encrypted store's keys hold no ids, so there only the lookups are made.
    """
    ident = ref.id
    cases = (str, str.lower, str.upper)
    found: set[ScopeRef] = set()
    for level in StateScope:
        for variant in dict.fromkeys(case(ident) for case in cases):
            with contextlib.suppress(VictorActorsError):
                cand = ScopeRef(level, variant)
                if cand != ref and store.scope_record(cand) is not None:
                    found.add(cand)
    if store.layout.hashed:
        return found
    with contextlib.suppress(VictorActorsError):
        found.update(r.ref for r in store.level_page(ref.scope, ref, 20))
    n = len(ident)
    cuts = {k for k in (n, n - 1, n - 2, n - 3, 2 * n // 3, n // 2, n // 3, 1) if k > 0}
    for k in sorted(cuts, reverse=True):  # the longest shared beginnings first
        for prefix in dict.fromkeys(case(ident[:k]) for case in cases):
            with contextlib.suppress(VictorActorsError):
                found.update(r.ref for r in store.prefix_page(prefix, ref.scope, None, 50))
        if len(found) >= _NEAR_WANT:
            break
    found.discard(ref)
    return found


# -- inspect ---------------------------------------------------------------------------------------


def parse_inspect(args: argparse.Namespace) -> None:
    """Check and convert ``inspect``'s options in place (before the store is opened).

    Raises:
        ValueError: an option is malformed (one line, for the caller to print).
    """
    text = args.limit
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"--limit takes a number of rows (0: all), not {text!r}")
    args.limit = min(int(text), sys.maxsize - 1)
    if args.level is not None:
        try:
            args.level = StateScope(args.level)
        except ValueError:
            raise ValueError(f"--level takes one of {_LEVELS}, not {args.level!r}") from None
    if args.after is not None:
        try:
            args.after = ScopeRef.parse(args.after)
        except VictorActorsError as exc:
            raise ValueError(
                f"--after takes a scope ref as the previous page printed it (e.g. conversation:c1): {exc}"
            ) from None
        if args.level is not None and args.after.scope != args.level:
            raise ValueError(f"--after {args.after} is not of --level {args.level}")


@dataclasses.dataclass
class _Frame:
    """One level of the tree walk: the children of ``parent`` past ``cursor``, read a page at a time."""

    parent: ScopeRef | None
    cursor: ScopeRef | None
    depth: int
    todo: collections.deque[ScopeRef] = dataclasses.field(default_factory=collections.deque)
    parents: set[ScopeRef] = dataclasses.field(default_factory=set)
    done: bool = False


class _Children:
    """Pages of a parent's children in key order: from the store's ``children`` index, one range read each.

    A store from before the index (opened read-only) has none: its scope
    records are read once and paged in memory.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._map: dict[ScopeRef | None, tuple[list[bytes], list[ScopeRef]]] | None = None
        if not store.indexed:
            grouped: dict[ScopeRef | None, list[tuple[bytes, ScopeRef]]] = {}
            for rec in store.scope_records():
                up = rec.lineage[0] if rec.lineage else None
                grouped.setdefault(up, []).append((store.layout.ref_key(rec.ref), rec.ref))
            self._map = {}
            for up, keyed in grouped.items():
                keyed.sort(key=lambda kr: kr[0])
                self._map[up] = ([k for k, _ in keyed], [r for _, r in keyed])

    def page(self, parent: ScopeRef | None, after: ScopeRef | None, limit: int) -> list[ScopeRef]:
        if self._map is None:
            return [r.ref for r in self.store.children_page(parent, after, limit)]
        keys, refs = self._map.get(parent, ([], []))
        start = 0 if after is None else bisect.bisect_right(keys, self.store.layout.ref_key(after))
        return refs[start : start + limit]

    def with_children(self, refs: list[ScopeRef]) -> set[ScopeRef]:
        if self._map is None:
            return self.store.with_children(refs)
        return {ref for ref in refs if ref in self._map}


def _walk(children: _Children, frames: list[_Frame], chunk: int) -> Iterator[tuple[ScopeRef, int]]:
    """The tree in pre-order (each scope, then its children in key order) from ``frames``, with depths."""
    while frames:
        frame = frames[-1]
        if not frame.todo:
            if frame.done:
                frames.pop()
                continue
            page = children.page(frame.parent, frame.cursor, chunk)
            frame.done = len(page) < chunk
            if not page:
                frames.pop()
                continue
            frame.cursor = page[-1]
            frame.todo.extend(page)
            frame.parents = children.with_children(page)
        ref = frame.todo.popleft()
        yield ref, frame.depth
        if ref in frame.parents:
            frames.append(_Frame(ref, None, frame.depth + 1))


def _resume_at(store: Store, after: ScopeRef | None) -> list[_Frame]:
    """The walk's frames that continue right after ``after`` (None: from the roots).

    Raises:
        ScopeAccessError: ``after`` is not a stored scope.
    """
    if after is None:
        return [_Frame(None, None, 0)]
    record = store.scope_record(after)
    if record is None:
        raise ScopeAccessError(f"--after {after}: no scope {after} exists{did_you_mean(store, after)}")
    path = [*reversed(record.lineage), after]  # from the root down to after
    frames = [_Frame(path[d - 1] if d else None, path[d], d) for d in range(len(path))]
    return [*frames, _Frame(after, None, len(path))]  # after's own children come first


Listing = list[tuple[ScopeRef, int]]  # each scope shown, with its depth in the tree (0 in a flat list)


def _tree_page(store: Store, after: ScopeRef | None, limit: int | None) -> tuple[Listing, bool, str | None]:
    """Up to ``limit`` (None: all) scopes of the tree past ``after``, whether more follow, and a note."""
    children = _Children(store)
    chunk = 1000 if limit is None else min(limit + 1, 1000)
    walk = _walk(children, _resume_at(store, after), chunk)
    listing = list(itertools.islice(walk, limit))
    if limit is not None and next(walk, None) is not None:
        return listing, True, None
    count = store.scope_count()
    if after is not None or len(listing) >= count:
        return listing, False, None
    if limit is None or count <= limit:  # the rest fits in this page: show it at the root, as --limit 0 does
        seen = {ref for ref, _ in listing}
        rest = [r for r in store.level_page(None, None, count) if r.ref not in seen]
        missing = {r.ref for r in rest}
        for rec in rest:
            if not rec.lineage or rec.lineage[0] not in missing:  # the top of an unreachable subtree
                listing.append((rec.ref, 0))
                listing.extend(_walk(children, [_Frame(rec.ref, None, 1)], chunk))
        return listing, False, None
    note = (
        f"note: {count - len(listing)} stored scope(s) are not under the tree (their parent has no "
        "record); --level lists them"
    )
    return listing, False, note


def _flat_page(store: Store, args: argparse.Namespace, limit: int | None) -> tuple[Listing, bool]:
    """Up to ``limit`` (None: all) scopes that pass ``--level`` and ``--prefix``, past ``--after``.

    In key order: one range read of the level, or ``prefix_page``'s reads.
    """
    want = sys.maxsize if limit is None else limit + 1  # one more than the page: is there a next one?
    if args.prefix is not None:
        records = store.prefix_page(args.prefix, args.level, args.after, want)
    else:
        records = store.level_page(args.level, args.after, want)
    rows = records if limit is None else records[:limit]
    return [(r.ref, 0) for r in rows], limit is not None and len(records) > limit


def _whole_tree(store: Store) -> tuple[Listing, int]:
    """``--limit 0``: every scope record read at once; orphans at the root, children by level and id."""
    records = store.scope_records()
    known = {r.ref for r in records}
    children: dict[ScopeRef | None, list[ScopeRef]] = {}
    for r in records:
        parent = r.lineage[0] if r.lineage and r.lineage[0] in known else None
        children.setdefault(parent, []).append(r.ref)
    listing: Listing = []

    def walk(ref: ScopeRef, depth: int) -> None:
        listing.append((ref, depth))
        for child in sorted(children.get(ref, []), key=scope_key):
            walk(child, depth + 1)

    for root in sorted(children.get(None, []), key=scope_key):
        walk(root, 0)
    return listing, len(records)


def _next_page(args: argparse.Namespace, last: ScopeRef) -> str:
    """The command line of the next page: this one's, with ``--after`` the last scope shown."""
    argv = [PROG, "inspect", args.path]
    if getattr(args, "key_file", None):
        argv += ["--key-file", args.key_file]
    argv += ["--limit", str(args.limit)]
    if args.level is not None:
        argv += ["--level", str(args.level)]
    if args.prefix is not None:
        argv += ["--prefix", args.prefix]
    argv += ["--after", str(last)]
    return "next page: " + " ".join(shlex.quote(a) for a in argv)


def inspect(manager: GlobalStateManager, store: Store, args: argparse.Namespace) -> int:
    limit = args.limit or None
    flat = args.level is not None or args.prefix is not None
    note = None
    if flat:
        listing, more = _flat_page(store, args, limit)
        count = store.scope_count()
    elif limit is None and args.after is None:
        listing, count = _whole_tree(store)
        more = False
    else:
        listing, more, note = _tree_page(store, args.after, limit)
        count = store.scope_count()
    whole = not flat and args.after is None and not more and note is None  # every stored scope is listed
    rows, failed = _rows(manager, store, listing)
    print(f"store {os.path.abspath(store.path)}: {count} scopes{_what(args, flat, len(listing), more)}")
    table = [("SCOPE", "VERSION", "CHECKPOINTS", "BYTES"), *rows]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for name, version, ckpts, size in table:
        print(f"{name:<{widths[0]}}  {version:>{widths[1]}}  {ckpts:<{widths[2]}}  {size}".rstrip())
    if note is not None:
        print(note)
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
        print(f"recovery: every scope {'' if whole else 'listed '}loaded cleanly")
    if more:
        print(_next_page(args, listing[-1][0]))
    if failed:
        err(f"{failed} scope(s) could not be loaded (see the table above)")
        return 2
    return 0


def _rows(manager: GlobalStateManager, store: Store, listing: Listing) -> tuple[list[tuple[str, ...]], int]:
    """The table's rows (each scope loaded read-only), and how many scopes could not be loaded."""
    rows: list[tuple[str, ...]] = []
    failed = 0
    for ref, depth in listing:
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
    return rows, failed


def _what(args: argparse.Namespace, flat: bool, shown: int, more: bool) -> str:
    """What the listing below the header shows, when it is not simply the whole tree."""
    parts = []
    if flat:
        parts.append("level " + (str(args.level) if args.level is not None else "any"))
        if args.prefix is not None:
            parts.append(f"id prefix {args.prefix!r}")
    if args.after is not None:
        parts.append(f"after {args.after}")
    if not parts and not more:
        return ""
    if not parts:
        return f"; the first {shown} shown (tree order)"
    order = "key order" if flat else "tree order"
    return f"; {shown} shown ({', '.join(parts)}; {order})"


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
        kind = kind_of(rec)
        print(f"v{v:<4} {rec.commit_id}  {iso(rec.timestamp)}  {run}  {kind:<5}  {summary(rec)}{mark}")
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
