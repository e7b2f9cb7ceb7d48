"""Copy every record of one store into a new one by key range: the body of rekey and encryption in place.

What a rewrite must never do is delete what it did not copy (the swap that
follows deletes the source). So:

- **Every database is read in full, by key range**: a cursor from its first
  key to its last, never a walk from the scope records that happen to read.
  Each record is opened with the old keys (and, failing that, the new ones:
  a store halfway through a rotation holds records under both), its checksum
  checked at its old place, then bound to its new place (the new key layout,
  the new store id), sealed under the new active key and written. Its body
  is copied as it is: nothing is decoded and encoded again but the scope
  records, whose ids name the new keys.
- **Anything that does not open refuses the rewrite** before the swap
  (``CheckpointCorruptError``, or ``EncryptionKeyError`` when the only
  trouble is records sealed under a key neither keyring holds), naming what
  failed. With ``drop_damaged`` the copy goes on without those records, and
  logs each one; a scope record that does not open is then taken from the
  scope's ``children`` index entry (which holds the same record), so the
  scope keeps its commits.
- **Quarantine** holds records recovery could not use: they are copied
  whether or not they open (one that does not open keeps its bytes as they
  were, sealed again), so a rewrite never refuses because of them.
- **Nothing it does not know**: a named database other than the store's own,
  or a second record in ``meta`` (but ``meta/wal``, where the data file is in
  its write-ahead log), refuses the rewrite. The source's log is replayed and
  emptied under the owner lock before the copy starts (``_rekey.py``), so no
  acknowledged commit lives only in a log the copy would not read.
- **Counted before the swap**: each database of the copy must hold as many
  records as were written to it (no two records landed on one key), and at
  least as many as the source holds, less those dropped on request; the
  ``children`` index is built again from the scope records and must hold one
  entry for each.

The records' keys change with the layout: a scope key is the scope id (a
plaintext store) or a keyed hash of it (an encrypted one, under the store's
id key and store id), so each record's scope prefix is mapped to its scope,
found in the scope record under that prefix.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

from victor_actors._errors import CheckpointCorruptError, EncryptionKeyError, VictorActorsError
from victor_actors._model import ScopeRef
from victor_actors.store._codec import ScopeRecord
from victor_actors.store._crypto import Sealer, sealed_key_id
from victor_actors.store._heads import decode_head, encode_head
from victor_actors.store._keys import ROOT_PARENT, is_head, place, ref_from_key
from victor_actors.store._meta import META_KEY
from victor_actors.store._store import Store
from victor_actors.store._wal import WAL_KEY
from victor_actors.store._writer import WriteTxn

__all__ = ["Copier"]

logger = logging.getLogger("victor_actors")

BATCH = 512  # records per write transaction of the copy, and per read transaction of the source
COPIED = ("scopes", "log", "ckpt", "chunks", "kv", "quarantine")  # by key range; children built again
_SHOWN = 5  # damaged records named in a refusal


class Copier:
    """Copies ``source`` (opened read-only) into ``target`` (a new, empty store) and checks the copy.

    ``fallback`` opens what the source's own sealer cannot (the new keyring,
    during a rotation). :meth:`run` returns how many records were written.
    """

    def __init__(self, source: Store, target: Store, fallback: Sealer | None, *, drop_damaged: bool) -> None:
        self.source = source
        self.target = target
        self.openers = [source.sealer] + ([fallback] if fallback is not None else [])
        self.drop_damaged = drop_damaged
        self.damaged: list[str] = []  # the first few, for the refusal's message
        self.damage_count = 0
        self.missing_keys: set[str] = set()
        self.other_damage = False
        self.written: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self._ops: list[tuple[str, bytes, bytes]] = []
        self._unread: dict[bytes, bool] = {}  # source scope key whose scope record does not open -> for
        # want of a key (True) or damaged (False)
        self._recovered: dict[bytes, ScopeRef] = {}  # the same, the scope found in its index entry
        self._last: tuple[bytes, ScopeRef | None] | None = None

    # -- the copy -------------------------------------------------------------------------------

    def run(self) -> int:
        self._refuse_unknown()
        self._copy_scopes()
        self._read_index()
        for db in ("log", "ckpt", "chunks", "kv"):
            self._copy_scoped(db)
        self._copy_quarantine()
        self._flush()
        self._refuse_damage()
        self._check_counts()
        return sum(self.written.values())

    def _copy_scopes(self) -> None:
        """Every scope record, bound to its new key, and its ``children`` entry built for the copy."""
        for key, raw in self._records("scopes"):
            what = f"the scope record at scopes/{key.hex()}"
            plain = self._open("scopes", key, raw, what)
            if plain is None:
                self._unread[key] = self._lacking(raw) is not None
                continue
            try:
                record = self.source.codec.decode_scope(plain, ref=what, place=place("scopes", key))
                if self.source.layout.ref_key(record.ref) != key:
                    raise CheckpointCorruptError(f"{what} holds another scope ({record.ref})")
            except (CheckpointCorruptError, VictorActorsError) as exc:
                self._damage("scopes", what, str(exc))
                self._unread[key] = False
                continue
            self._put_scope(record, key, plain)

    def _put_scope(self, record: ScopeRecord, old_key: bytes, plain: bytes | None) -> None:
        target = self.target
        key = target.layout.ref_key(record.ref)
        where = place("scopes", key)
        if plain is None:  # taken from the index entry: framed again for its place
            framed = target.codec.encode_scope(record, place=where)
        else:
            framed = target.codec.rebind(
                plain, place("scopes", old_key), where, f"the scope record of {record.ref}"
            )
        self._put("scopes", key, target.sealer.seal(framed, where))
        child_key, child = target._child_entry(record, key)
        self._put("children", child_key, child)

    def _read_index(self) -> None:
        """Check every ``children`` entry opens; take a scope from it when its scope record did not.

        The copy's index is built from the scope records (``_put_scope``),
        so an entry is needed only when the scope record is unreadable or
        gone; one that does not open is damage like any other record.
        """
        layout = self.source.layout
        for key, raw in self._records("children"):
            what = f"the children index entry at children/{key.hex()}"
            plain = self._open("children", key, raw, what)
            if plain is None:
                continue
            try:
                record = self.source.codec.decode_scope(plain, ref=what, place=place("children", key))
                own = layout.ref_key(record.ref)
                parent = layout.ref_key(record.lineage[0]) if record.lineage else ROOT_PARENT
                if key != parent + own:
                    raise CheckpointCorruptError(f"{what} holds another scope ({record.ref})")
            except (CheckpointCorruptError, VictorActorsError) as exc:
                self._damage("children", what, str(exc))
                continue
            if own in self._unread or self._get("scopes", own) is None:
                self._recovered[own] = record.ref
                if self.drop_damaged:
                    logger.warning(
                        "rewrite: the scope record of %s is taken from its index entry", record.ref
                    )
                    self._put_scope(record, own, None)
                    self._unread.pop(own, None)
                elif own not in self._unread:
                    why = "it is missing (its index entry is there)"
                    self._damage("scopes", f"the scope record of {record.ref}", why)

    def _copy_scoped(self, db: str) -> None:
        """Every record of ``db`` (keys: a scope key, then a suffix kept as it is)."""
        for key, raw in self._records(db):
            head = db == "log" and is_head(key)
            prefix, ref = self._scope_of(key)
            if ref is None:
                what = f"a record at {db}/{key.hex()}"
                self._damage(db, what, self._no_scope(prefix), key=self._unread.get(prefix, False))
                continue
            what = f"the head record of {ref}" if head else f"a record of {ref} in {db}"
            plain = self._open(db, key, raw, what)
            if plain is None:
                continue
            new_key = self.target.layout.ref_key(ref) + key[len(prefix) :]
            where = place(db, new_key)
            try:
                if head:
                    framed = self._head(key, new_key, plain, what)
                else:
                    framed = self.target.codec.rebind(plain, place(db, key), where, what)
            except CheckpointCorruptError as exc:
                self._damage(db, what, str(exc))
                continue
            self._put(db, new_key, self.target.sealer.seal(framed, where))

    def _copy_quarantine(self) -> None:
        """Quarantined records: kept whether or not they open (they are there because recovery could not
        use them); only one whose scope cannot be named is damage."""
        for key, raw in self._records("quarantine"):
            db_name, _, original = key.partition(b"/")
            what = f"a quarantined record at quarantine/{key.hex()}"
            if db_name.decode("latin-1") not in Store.DBS or not original:
                self._damage("quarantine", what, "its key names no database of the store")
                continue
            prefix, ref = self._scope_of(original)
            if ref is None:
                self._damage("quarantine", what, self._no_scope(prefix), key=self._unread.get(prefix, False))
                continue
            old_where = place(db_name.decode(), original)
            new_original = self.target.layout.ref_key(ref) + original[len(prefix) :]
            new_where = place(db_name.decode(), new_original)
            plain = raw
            for sealer in self.openers:
                try:
                    plain = sealer.open(raw, old_where, what)
                    break
                except CheckpointCorruptError:
                    continue
            try:
                plain = self.target.codec.rebind(plain, old_where, new_where, what)
            except CheckpointCorruptError:
                pass  # damaged (that may be why it is here): kept as it is
            self._put("quarantine", db_name + b"/" + new_original, self.target.sealer.seal(plain, new_where))

    # -- pieces -------------------------------------------------------------------------------

    def _records(self, db: str) -> Iterator[tuple[bytes, bytes]]:
        """Every record of the source's ``db`` in key order, read ``BATCH`` at a time.

        Each read transaction ends before the records are written to the
        copy (the copy's map may grow meanwhile); nothing writes the source,
        whose owner lock the rewrite holds.
        """
        handle = self.source.dbs.get(db)
        if handle is None:
            return
        env = self.source.env
        start: bytes | None = None
        while True:
            rows: list[tuple[bytes, bytes]] = []
            with env.begin(db=handle) as txn, txn.cursor() as cur:
                found = cur.first() if start is None else cur.set_range(start)
                while found and len(rows) < BATCH:
                    rows.append((bytes(cur.key()), bytes(cur.value())))
                    found = cur.next()
            yield from rows
            if not found:
                return
            start = rows[-1][0] + b"\x00"  # the least key past the last one read

    def _get(self, db: str, key: bytes) -> bytes | None:
        handle = self.source.dbs.get(db)
        if handle is None:
            return None
        with self.source.env.begin(db=handle) as txn:
            raw = txn.get(key)
        return None if raw is None else bytes(raw)

    def _open(self, db: str, key: bytes, raw: bytes, what: str) -> bytes | None:
        """The record opened with the old keys, else the new ones; None (and noted) if neither opens."""
        where = place(db, key)
        first: CheckpointCorruptError | None = None
        for sealer in self.openers:
            try:
                return sealer.open(raw, where, what)
            except CheckpointCorruptError as exc:
                first = first or exc
        key_id = self._lacking(raw)
        if key_id is not None:
            self.missing_keys.add(key_id)
            self._damage(db, what, f"sealed under key {key_id!r}, which neither keyring holds", key=True)
        else:
            self._damage(db, what, str(first))
        return None

    def _lacking(self, raw: bytes) -> str | None:
        """The key id ``raw`` is sealed under when no keyring holds it (None: not that trouble)."""
        key_id = sealed_key_id(raw)
        if key_id is None or any(s.keyring is None or key_id in s.keyring for s in self.openers):
            return None
        return key_id

    def _scope_of(self, key: bytes) -> tuple[bytes, ScopeRef | None]:
        """The scope prefix of ``key`` and its scope (None: no readable record names it)."""
        layout = self.source.layout
        try:
            prefix = layout.prefix_of(key)
        except Exception:
            return b"", None
        if self._last is not None and self._last[0] == prefix:
            return self._last
        ref = self._recovered.get(prefix)
        if ref is None and prefix not in self._unread:
            ref = self._ref_at(prefix)
        if ref is None and not layout.hashed:
            try:  # a plaintext key is the scope id itself
                ref = ref_from_key(prefix)
                if layout.ref_key(ref) != prefix:
                    ref = None
            except Exception:
                ref = None
        self._last = (prefix, ref)
        return self._last

    def _ref_at(self, prefix: bytes) -> ScopeRef | None:
        """The scope the source's scope record at ``prefix`` names (None: none there, or it does not open)."""
        raw = self._get("scopes", prefix)
        if raw is None:
            return None
        where = place("scopes", prefix)
        for sealer in self.openers:
            try:
                record = self.source.codec.decode_scope(
                    sealer.open(raw, where, "a scope record"), place=where
                )
            except (CheckpointCorruptError, VictorActorsError):
                continue
            return record.ref if self.source.layout.ref_key(record.ref) == prefix else None
        return None

    def _no_scope(self, prefix: bytes) -> str:
        if self._unread.get(prefix):
            return "its scope's record is sealed under a key neither keyring holds"
        if prefix in self._unread:
            return "its scope's record does not open, so its new key cannot be named"
        return "no scope record names its scope, so its new key cannot be named"

    def _head(self, key: bytes, new_key: bytes, plain: bytes, what: str) -> bytes:
        return encode_head(new_key, decode_head(plain, key, None, what))

    def _damage(self, db: str, what: str, why: str, *, key: bool = False) -> None:
        self.damage_count += 1
        if len(self.damaged) < _SHOWN:
            self.damaged.append(f"{what}: {why}")
        self.other_damage |= not key
        self.dropped[db] += 1
        if self.drop_damaged:
            logger.warning("rewrite: left out %s: %s", what, why)

    def _put(self, db: str, key: bytes, value: bytes) -> None:
        if self.damage_count and not self.drop_damaged:
            return  # it will be refused: only the damage is still counted
        self._ops.append((db, key, value))
        self.written[db] += 1
        if len(self._ops) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        ops, self._ops = self._ops, []
        if not ops:
            return

        def write(t: WriteTxn) -> None:
            for db, key, value in ops:
                t.put(db, key, value)

        self.target.submit([write], wait=True)

    # -- the checks before the swap -----------------------------------------------------------------

    def _refuse_unknown(self) -> None:
        """Refuse a source holding a database, or a meta record, the copy would not carry."""
        env = self.source.env
        with env.begin() as txn:
            names = [bytes(k) for k, _ in txn.cursor()]
        unknown = sorted(n.decode("utf-8", "replace") for n in names if n.decode("latin-1") not in Store.DBS)
        # meta/wal is the data file's place in its own write-ahead log: the copy starts a log of its own
        extra_meta = [k for k, _ in self._records("meta") if k not in (META_KEY, WAL_KEY)]
        if unknown or extra_meta:
            what = (
                f"the databases {unknown}"
                if unknown
                else f"{len(extra_meta)} records in meta besides its own"
            )
            raise CheckpointCorruptError(
                f"the store at {self.source.path!r} holds {what}, which this version does not know and a "
                "rewrite would not copy; refused before the swap: the store is unchanged"
            )

    def _refuse_damage(self) -> None:
        if not self.damage_count or self.drop_damaged:
            return
        shown = "; ".join(self.damaged)
        more = (
            f"; and {self.damage_count - len(self.damaged)} more"
            if self.damage_count > len(self.damaged)
            else ""
        )
        tail = (
            f"; the store at {self.source.path!r} is unchanged (under its old keys) and the copy was "
            "removed. "
        )
        if not self.other_damage:
            raise EncryptionKeyError(
                f"the rewrite was refused before the swap: {self.damage_count} record(s) are sealed under "
                f"key(s) {sorted(self.missing_keys)} that neither keyring holds ({shown}{more}){tail}"
                "Give the old keyring those keys too"
            )
        raise CheckpointCorruptError(
            f"the rewrite was refused before the swap: {self.damage_count} record(s) do not open "
            f"({shown}{more}){tail}Restore them from a copy, or rewrite with drop_damaged=True "
            "(victor-actors rekey --drop-damaged) to leave them out"
        )

    def _check_counts(self) -> None:
        """Each database of the copy holds what was written to it, and no less than the source did."""

        def entries(store: Store) -> dict[str, int]:
            out = {}
            with store.env.begin() as txn:
                for db in (*COPIED, "children"):
                    handle = store.dbs.get(db)
                    out[db] = 0 if handle is None else int(txn.stat(handle)["entries"])
            return out

        self.target.flush()
        before, after = entries(self.source), entries(self.target)
        short = []
        for db in (*COPIED, "children"):
            if after[db] != self.written[db]:
                short.append(f"{db}: {self.written[db]} records written, {after[db]} held")
            elif after[db] < before[db] - self.dropped[db]:
                short.append(f"{db}: the source holds {before[db]}, the copy {after[db]}")
        if after["children"] != after["scopes"]:
            short.append(f"children: {after['children']} index entries for {after['scopes']} scopes")
        if short:
            raise CheckpointCorruptError(
                f"the copy of the store at {self.source.path!r} does not hold every record of it "
                f"({'; '.join(short)}); refused before the swap: the store is unchanged"
            )
