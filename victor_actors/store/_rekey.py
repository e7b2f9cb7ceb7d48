"""Rewrite a whole store under other keys: key rotation, and encrypting a plaintext store.

The rewrite holds the store's owner lock from start to end (a writer beside
it is refused with ``StoreLockedError``; a read-only open reads the store as
it was and touches nothing). Every record is read with the old keys (or
none), decoded, and written again into a fresh store beside the data, under
the new keyring's active key and its keyed-hash layout; then the copy is
marked complete and swapped in by renames (``OwnerLock.swap_in``). A crash at
any point leaves the old store or the new one, whole: the next lock holder
drops an unfinished copy or finishes the swap. Afterwards the old keys are
not needed.
"""

from __future__ import annotations

import logging
import os
import shutil

from victor_actors._errors import CheckpointCorruptError, EncryptionKeyError
from victor_actors.store._codec import Codec
from victor_actors.store._crypto import Keyring
from victor_actors.store._files import COMPLETE, NEXT, PREVIOUS, OwnerLock
from victor_actors.store._keys import place
from victor_actors.store._store import Store
from victor_actors.store._writer import TxnOp, WriteTxn

__all__ = ["encrypt_in_place", "is_encrypted", "rekey"]

logger = logging.getLogger("victor_actors")

_BATCH = 512  # records per write transaction of the copy


def is_encrypted(path: str | os.PathLike[str]) -> bool:
    """Whether the store at ``path`` is encrypted (not readable without keys).

    Raises:
        VictorActorsError: there is no store at ``path``.
    """
    try:
        Store(path, read_only=True).close()
    except EncryptionKeyError:
        return True
    return False


def rekey(
    path: str | os.PathLike[str],
    new: Keyring,
    old: Keyring | None = None,
    *,
    codec: Codec | None = None,
    map_size: int = 256 * 1024 * 1024,
) -> int:
    """Rewrite every record and key of the store at ``path`` under ``new``'s active key.

    ``old`` opens the store as it is (None: it is plaintext). Returns how
    many records were written.

    Raises:
        EncryptionKeyError: ``old`` does not open the store, or ``new`` is not a keyring.
        StoreLockedError: the store is open for writing elsewhere; nothing was changed.
        VictorActorsError: there is no store at ``path``.
    """
    _check_keyrings(new, old)
    with OwnerLock(os.fspath(path), create=False) as lock:
        return _rewrite(lock, new, old, codec, map_size)


def encrypt_in_place(
    path: str | os.PathLike[str],
    keyring: Keyring,
    *,
    codec: Codec | None = None,
    map_size: int = 256 * 1024 * 1024,
) -> bool:
    """Encrypt a plaintext store under ``keyring``; False if it is already encrypted, or there is no
    store at ``path`` (nothing done).

    Crash-safe and resumable: run it again after a crash and it finishes the
    job (or finds the store encrypted).
    """
    _check_keyrings(keyring, None)
    store_path = os.fspath(path)
    if not _has_store(store_path):
        return False
    with OwnerLock(store_path, create=False) as lock:
        if is_encrypted(store_path):
            return False
        _rewrite(lock, keyring, None, codec, map_size)
        return True


def _check_keyrings(new: object, old: object) -> None:
    if not isinstance(new, Keyring):
        raise EncryptionKeyError(f"a rewrite needs the new Keyring, not {type(new).__name__}")
    if old is not None and not isinstance(old, Keyring):
        raise EncryptionKeyError(f"the old keys are a Keyring (or None), not {type(old).__name__}")


def _has_store(store_path: str) -> bool:
    return any(
        os.path.isfile(os.path.join(store_path, *parts, "data.mdb"))
        for parts in (("data",), (NEXT, "data"), (PREVIOUS,))
    )


def _rewrite(lock: OwnerLock, new: Keyring, old: Keyring | None, codec: Codec | None, map_size: int) -> int:
    """Copy the store ``lock`` holds into ``NEXT`` and swap it in."""
    store_path = lock.store_path
    source = Store(store_path, read_only=True, encryption=old, codec=codec, map_size=map_size)
    target_dir = os.path.join(store_path, NEXT)
    try:
        shutil.rmtree(target_dir, ignore_errors=True)  # (taking the lock dropped an unfinished copy)
        target = Store(target_dir, encryption=new, codec=codec, map_size=map_size)
        try:
            written = _copy(source, target)
        finally:
            target.close()
        source.close()
        lock.swap_in()
    except BaseException:
        source.close()
        if not os.path.exists(os.path.join(target_dir, COMPLETE)):
            shutil.rmtree(target_dir, ignore_errors=True)
        raise
    return written


def _copy(source: Store, target: Store) -> int:
    """Write every record of ``source`` into ``target`` (its own keys and seals); return how many."""
    ops: list[TxnOp] = []
    written = 0

    def flush() -> None:
        nonlocal ops
        if ops:
            target.submit(ops, wait=True)
            ops = []

    def add(op: TxnOp) -> None:
        nonlocal written
        ops.append(op)
        written += 1
        if len(ops) >= _BATCH:
            flush()

    records = source.scope_records()
    by_prefix = {}
    for record in records:
        ref = record.ref
        by_prefix[source.layout.ref_key(ref)] = ref
        add(target.op_put_scope(record))
        for version in source.log_versions(ref):
            add(target.op_put_commit(ref, source.commit_record(ref, version)))
        head = source.head(ref)
        if head is not None:
            add(target.op_put_head(ref, head))
        # oldest first, each on top of the one before: the copy shares message chunks and
        # values deltas as the source did (compared, not trusted: see Store.plan_checkpoint)
        base = None
        for info in reversed(source.checkpoints(ref)):
            if not info.readable:
                continue
            try:
                ckpt = source.checkpoint(ref, info.version)
            except CheckpointCorruptError as exc:
                logger.warning("rekey: dropping an unreadable checkpoint: %s", exc)
                continue
            op, base = target.plan_checkpoint(ref, ckpt, None, base, verify=True)
            add(op)
    # Quarantined records keep their bytes (sealed anew under the new key and place), for people.
    for key, raw in source._scan("quarantine", b""):
        db, _, original = key.partition(b"/")
        owner = by_prefix.get(source.layout.prefix_of(original)) if original else None
        if owner is None:
            logger.warning("rekey: dropping a quarantined record of an unknown scope")
            continue
        try:
            plain = source.sealer.open(raw, place(db.decode(), original), "a quarantined record")
        except CheckpointCorruptError as exc:
            logger.warning("rekey: dropping an unreadable quarantined record: %s", exc)
            continue
        suffix = original[len(source.layout.ref_key(owner)) :]
        new_original = target.layout.ref_key(owner) + suffix
        sealed = target.sealer.seal(plain, place(db.decode(), new_original))
        new_key = db + b"/" + new_original

        def put(t: WriteTxn, k: bytes = new_key, v: bytes = sealed) -> None:
            t.put("quarantine", k, v)

        add(put)
    flush()
    return written
