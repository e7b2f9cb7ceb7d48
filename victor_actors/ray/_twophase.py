"""A shard's side of a cross-shard batch: the participant's prepare and commit, home's decision.

A batch from a conversation on shard P that also writes the global scope
(on home, shard 0) commits in three steps (``docs/ray.md``, ADR 0030):

1. **Prepare at P.** P holds the scopes its part writes, waits for the
   writes already in progress, checks ``expected_version``, dry-runs the
   part through the pure reducer, writes a durable **prepare record** and
   votes yes, with the version of global its mirror holds (a lower bound
   of the version home will commit at).
2. **Decide at home.** Home applies the global part as an ordinary commit
   whose first transition carries the transaction id: the decision is
   durable in the same LMDB transaction as the data, and home never holds
   the global scope across a round trip. Commits that arrive together share
   a group commit, like any other writes of one scope.
3. **Commit at P**, carrying global's new state for P's mirror; P deletes
   its prepare record.

**Presumed abort.** A participant left in doubt (it restarted, or its hold
outlived ``hold_timeout``) asks home for the outcome. Home answers
"committed" when global's log holds the transaction id above the
participant's lower bound; otherwise it writes a durable **tombstone** for
the transaction and answers "aborted", and a decision that arrives after
that is refused. A decision being written when the question comes is
waited for first. Home is the only place an outcome is decided.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Protocol

import lmdb

from victor_actors._errors import (
    CheckpointCorruptError,
    ScopeAccessError,
    ScopeFailedError,
    VersionConflictError,
    VictorActorsError,
)
from victor_actors._model import GLOBAL_REF, ScopeRef, StateTransition
from victor_actors._reducer import reduce
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors.ray import _wire as w
from victor_actors.ray._holds import Holds
from victor_actors.ray._mirror import Mirror
from victor_actors.ray._placement import HOME, Address
from victor_actors.remote._host import carries, expected_of, parse_address, parse_ref, tagged

__all__ = ["TwoPhase", "check_and_dry_run"]

DECIDED_KEPT = 65536  # recent decisions home answers from memory
TOMBSTONE_DAYS = 1.0  # how long home remembers an abort it decided for a participant in doubt
SCAN_LIMIT = 1_000_000  # global commits home reads back, at most, to answer an outcome


class Shard(Protocol):
    """What the protocol needs of its shard (the shard passes itself in)."""

    index: int
    hold_timeout: float
    holds: Holds
    mirror: Mirror
    counters: collections.Counter[str]
    manager: Any

    def handle_at(self, address: Address) -> Any: ...

    def written(self, handle: Any, steps: tuple[StateTransition, ...]) -> frozenset[ScopeRef]: ...

    async def write(
        self, handle: Any, steps: tuple[StateTransition, ...], expected: Any, timeout: float, txid: str | None
    ) -> StateChanged: ...

    def find(self, refs: frozenset[ScopeRef], batch_id: str) -> StateChanged | None: ...

    def crash_at(self, point: str) -> None: ...

    def peer(self, n: int) -> Any: ...

    def drop_peer(self, n: int) -> None: ...

    async def global_state(self) -> bytes: ...


class _Prepared:
    __slots__ = ("address", "deadline", "deciding", "home", "low", "refs", "role", "steps", "versions")

    def __init__(
        self,
        role: str,
        address: Address,
        steps: tuple[StateTransition, ...],
        versions: dict[ScopeRef, int],
        deadline: float,
        home: int,
        low: int,
    ) -> None:
        self.role = role
        self.address = address
        self.steps = steps
        self.versions = versions
        self.refs = frozenset(versions)
        self.deadline = deadline
        self.home = home
        self.low = low  # global's version is above this when home decides
        self.deciding: asyncio.Event | None = None  # set while its commit is being written


class TwoPhase:
    """Prepared parts, their durable records, home's decisions and tombstones (on one shard)."""

    def __init__(self, shard: Shard, env: lmdb.Environment, durable: bool) -> None:
        self.shard = shard
        self.env = env
        self.durable = durable
        self.txdb = env.open_db(b"txn")
        self.abortdb = env.open_db(b"abort")
        self.prepared: dict[str, _Prepared] = {}
        self.deciding: dict[str, asyncio.Event] = {}
        self.decided: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.aborted: set[str] = set()
        self.in_doubt = self._read_records()

    # -- start-up ------------------------------------------------------------------

    def _read_records(self) -> list[str]:
        """Prepare records left by the last run (their scopes stay held until resolved), and
        home's tombstones (older ones dropped)."""
        out = []
        with self.env.begin(db=self.txdb) as t:
            for key, raw in t.cursor():
                try:
                    txid = bytes(key).decode()
                    p = w.decode(bytes(raw))
                    address = parse_address(p["a"])
                    steps = w.transitions_from(p["t"])
                    versions = {parse_ref(r): int(v) for r, v in p["v"]}
                    low = int(p["g"]) if "g" in p else max(int(p.get("gv", 1)) - 1, 0)
                except (UnicodeDecodeError, VictorActorsError, KeyError, TypeError, ValueError) as exc:
                    raise CheckpointCorruptError(
                        f"shard {self.shard.index}'s prepare record {bytes(key)!r} is unreadable ({exc}): "
                        "its cross-shard part can be neither finished nor dropped safely; "
                        "the shard refuses to start"
                    ) from None
                prepared = _Prepared("part", address, steps, versions, 0.0, int(p.get("home", HOME)), low)
                self.prepared[txid] = prepared
                self.shard.holds.take(prepared.refs, txid)
                out.append(txid)
        old = time.time() - TOMBSTONE_DAYS * 86400
        with self.env.begin(db=self.abortdb, write=True) as t:
            for key, raw in list(t.cursor()):
                if float(bytes(raw).decode() or 0) < old:
                    t.delete(key)
                else:
                    self.aborted.add(bytes(key).decode())
        return out

    async def watchdog(self) -> None:
        """Resolve the parts left in doubt by a restart, then any hold that outlives ``hold_timeout``."""
        for txid in self.in_doubt:
            await self.resolve(txid)
        hold_timeout = self.shard.hold_timeout
        while True:
            await asyncio.sleep(min(1.0, max(hold_timeout / 4, 0.05)))
            now = time.monotonic()
            for txid, p in list(self.prepared.items()):
                if p.deadline and now > p.deadline and p.deciding is None:
                    if p.role == "part":
                        await self.resolve(txid)
                    else:
                        self.shard.counters["holds_expired"] += 1
                        await self.release(txid)

    # -- the participant -------------------------------------------------------------

    def _vote(self, p: _Prepared) -> Any:
        return {"v": tuple((str(r), v) for r, v in p.versions.items()), "g": p.low}

    async def prepare(self, op: Any) -> Any:
        """Vote on one part of a cross-shard batch; yes holds its scopes until the decision."""
        shard = self.shard
        txid, role = str(op["id"]), str(op.get("role", "part"))
        again = self.prepared.get(txid)
        if again is not None:  # a prepare sent again (after a restart, or a lost reply)
            return self._vote(again)
        address = parse_address(op["a"])
        handle = shard.handle_at(address)
        steps = w.transitions_from(op["t"])
        refs = shard.written(handle, steps) | {handle.ref}
        if GLOBAL_REF in refs and shard.index != HOME:
            raise ScopeAccessError(
                f"a part prepared on shard {shard.index} writes the global scope, which lives on shard "
                f"{HOME}; nothing was held"
            )
        deadline = time.monotonic() + float(op.get("to") or 30.0)
        await shard.holds.hold(refs, txid, deadline)
        try:
            await shard.mirror.fresh(-1)
            low = max(shard.mirror.version, 0)
            versions = check_and_dry_run(handle.snapshot(), steps, expected_of(op.get("x")), txid)
        except BaseException:
            await shard.holds.release(refs, txid)
            raise
        prepared = _Prepared(
            role,
            address,
            steps,
            versions,
            time.monotonic() + shard.hold_timeout,
            int(op.get("home", HOME)),
            low,
        )
        self.prepared[txid] = prepared
        if role == "part":  # durable before the vote: a restart must find it
            record = w.encode(
                {
                    "a": address,
                    "t": w.transitions_to(steps),
                    "v": tuple((str(r), v) for r, v in versions.items()),
                    "home": prepared.home,
                    "g": low,
                }
            )
            with self.env.begin(db=self.txdb, write=True) as t:
                t.put(txid.encode(), record)
            if self.durable:
                self.env.sync(True)
            shard.crash_at("part_after_prepare")
        shard.counters["prepared"] += 1
        return self._vote(prepared)

    async def commit(self, op: Any) -> Any:
        """Write a prepared part (home decided it committed), release it and drop its record."""
        shard = self.shard
        txid = str(op["id"])
        if "m" in op:
            shard.mirror.set(op["m"])
        p = self.prepared.get(txid)
        if p is None:
            # already decided here: a part resolved after a restart, or a commit sent again
            found = shard.find(frozenset(parse_ref(r) for r in op.get("refs", ())), txid)
            if found is not None:
                return {"r": w.record_to(found)}
            raise ScopeFailedError(
                f"cross-shard commit {txid} is not prepared on shard {shard.index} (it was aborted, "
                "or its hold expired); nothing was applied here"
            )
        if p.deciding is not None:  # a commit sent again while the first is being written
            await p.deciding.wait()
            return await self.commit(op)
        p.deciding = asyncio.Event()
        try:
            handle = shard.handle_at(p.address)
            record = await shard.write(handle, tagged(p.steps, txid), dict(p.versions), 30.0, txid)
            await self.release(txid)
        finally:
            p.deciding.set()
        shard.counters["committed"] += 1
        return {"r": w.record_to(record)}

    async def abort(self, op: Any) -> Any:
        txid = str(op["id"])
        if txid in self.prepared:
            self.shard.counters["aborted"] += 1
        await self.release(txid)
        return None

    async def release(self, txid: str) -> None:
        p = self.prepared.pop(txid, None)
        if p is None:
            return
        if p.role == "part":
            with self.env.begin(db=self.txdb, write=True) as t:
                t.delete(txid.encode())
        await self.shard.holds.release(p.refs, txid)

    async def resolve(self, txid: str) -> None:
        """A participant's part in doubt: ask home for the outcome and finish it."""
        shard = self.shard
        p = self.prepared.get(txid)
        if p is None or p.deciding is not None:
            return
        try:
            reply = await shard.peer(p.home).call.remote(
                w.encode({"ops": ({"k": "status", "id": txid, "g": p.low},)})
            )
            ok, outcome = w.decode(reply)["r"][0]
        except Exception:
            shard.drop_peer(p.home)
            p.deadline = time.monotonic() + 0.5
            return
        if not ok or outcome == "unknown":
            p.deadline = time.monotonic() + 0.5
            return
        if p.deciding is not None or txid not in self.prepared:
            return  # the driver's own commit (or abort) got here first
        p.deciding = asyncio.Event()
        try:
            if outcome == "committed":
                if shard.find(p.refs, txid) is None:
                    await shard.mirror.fresh(shard.mirror.version + 1)  # newer than the copy: ask home
                    handle = shard.handle_at(p.address)
                    await shard.write(handle, tagged(p.steps, txid), dict(p.versions), 30.0, txid)
                shard.counters["recovered_commits"] += 1
            else:
                shard.counters["recovered_aborts"] += 1
            await self.release(txid)
        finally:
            p.deciding.set()

    # -- home: the decision ------------------------------------------------------------

    async def decide(self, op: Any) -> Any:
        """Home only: commit the global part of a cross-shard batch; the commit is the decision.

        Raises:
            ScopeFailedError: home answered "aborted" for it already (a participant in doubt asked
                first); nothing was applied.
            VersionConflictError, TransitionValidationError, ...: as a plain write; nothing was applied.
        """
        shard = self.shard
        txid = str(op["id"])
        low = int(op.get("g", 0))
        deciding = self.deciding.get(txid)
        if deciding is not None:  # sent again while the first attempt is being written
            await deciding.wait()
        if txid in self.aborted:
            raise ScopeFailedError(
                f"cross-shard commit {txid} was aborted by the global scope's home (a participant "
                "asked for its outcome first); nothing was applied"
            )
        if op.get("rt") or deciding is not None or txid in self.decided:
            found = self._committed(txid, low)
            if found is not None:
                shard.counters["deduplicated"] += 1
                return {"r": w.record_to(found), "m": await shard.global_state()}
        address = parse_address(op["a"])
        handle = shard.handle_at(address)
        if handle.ref != GLOBAL_REF:
            raise ScopeAccessError(f"a decision is a commit of the global scope, not of {handle.ref}")
        steps = tagged(w.transitions_from(op["t"]), txid)
        event = asyncio.Event()
        self.deciding[txid] = event
        try:
            shard.crash_at("home_before_commit")
            record = await shard.write(
                handle, steps, expected_of(op.get("x")), float(op.get("to") or 30.0), None
            )
            self.decided[txid] = record.new_version
            while len(self.decided) > DECIDED_KEPT:
                self.decided.popitem(last=False)
            shard.crash_at("home_after_commit")
        finally:
            del self.deciding[txid]
            event.set()
        shard.counters["decided"] += 1
        return {"r": w.record_to(record), "m": await shard.global_state()}

    def _committed(self, txid: str, low: int) -> StateChanged | None:
        version = self.decided.get(txid)
        if version is not None:
            return self.shard.find(frozenset({GLOBAL_REF}), txid) or self._record_at(version)
        found = self._version_of(txid, low)
        return None if found is None else self._record_at(found)

    def _record_at(self, version: int) -> StateChanged | None:
        store = self.shard.manager.store
        if store is None:
            return None
        rec = store.commit_record(GLOBAL_REF, version)
        before = self.shard.manager.state_at(GLOBAL_REF, version - 1)._state
        _state, full = reduce(
            before, rec.transitions, commit_id=rec.commit_id, run_id=rec.run_id, timestamp=rec.timestamp
        )
        return full

    def _version_of(self, txid: str, low: int) -> int | None:
        """The version of global's commit carrying ``txid`` above ``low``, read back from its log.

        Raises:
            ScopeFailedError: the log could not be read back that far (the outcome is unknown).
        """
        if txid in self.decided:
            return self.decided[txid]
        store = self.shard.manager.store
        if store is None:
            return None
        head = store.head(GLOBAL_REF) or 0
        if head - low > SCAN_LIMIT:
            raise ScopeFailedError(f"the outcome of {txid} lies more than {SCAN_LIMIT} global commits back")
        for v in range(head, low, -1):
            rec = store.commit_record(GLOBAL_REF, v)
            if carries(rec.transitions, txid):
                return v
        return None

    async def status(self, op: Any) -> Any:
        """Home only: the outcome of ``txid``, deciding abort (durably) if home never committed it."""
        txid, low = str(op["id"]), int(op.get("g", 0))
        deciding = self.deciding.get(txid)
        if deciding is not None:  # its commit is being written: the answer is in the log after it
            await deciding.wait()
        if txid in self.aborted:
            return "aborted"
        try:
            if self._version_of(txid, low) is not None:
                return "committed"
        except VictorActorsError:
            return "unknown"
        self.aborted.add(txid)
        with self.env.begin(db=self.abortdb, write=True) as t:
            t.put(txid.encode(), repr(time.time()).encode())
        if self.durable:
            self.env.sync(True)
        self.shard.counters["aborted_by_status"] += 1
        return "aborted"

    # -- stats -----------------------------------------------------------------------------

    def in_doubt_count(self) -> int:
        return sum(1 for p in self.prepared.values() if p.role == "part")


def check_and_dry_run(
    snap: ContextSnapshot, steps: tuple[StateTransition, ...], expected: Any, txid: str
) -> dict[ScopeRef, int]:
    """The versions of the scopes ``steps`` write; raises as ``apply`` would if they cannot commit."""
    own = snap._state
    states = {own.ref: own}
    for anc in snap._ancestors:
        states[anc.ref] = anc
    by_name: dict[str, ScopeRef] = {}
    for ref in states:
        by_name[ref.scope.value] = ref
        by_name[str(ref)] = ref
    parts: dict[ScopeRef, list[StateTransition]] = {}
    indices: dict[ScopeRef, list[int]] = {}
    for i, t in enumerate(steps):
        target = t.data.get("scope")
        found = own.ref if target is None else by_name.get(str(target))
        if found is None:
            raise ScopeAccessError(
                f"transition {i} targets {target!r}, which is not {own.ref} or an ancestor"
            )
        parts.setdefault(found, []).append(t)
        indices.setdefault(found, []).append(i)
    parts.setdefault(own.ref, [])
    indices.setdefault(own.ref, [])  # a part with nothing to write (a batch that writes only global)
    versions = {}
    for ref, part in parts.items():
        state = states[ref]
        want = expected if isinstance(expected, int) and ref == own.ref else None
        if isinstance(expected, dict):
            want = expected.get(ref)
        if want is not None and want != state.version:
            raise VersionConflictError(ref, want, state.version)
        reduce(state, part, commit_id=txid, indices=indices[ref])
        versions[ref] = state.version
    return versions
