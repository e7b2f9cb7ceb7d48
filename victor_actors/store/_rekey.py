"""Rewrite a whole store under other keys: key rotation, and encrypting a plaintext store.

Every record is read with the old keys (or none), decoded, and written again
into a fresh environment beside the store, under the new keyring's active
key and its keyed-hash layout; then the new environment is swapped in by
renames (``_files.swap_in``). A crash at any point leaves the old store or
the new one, whole: an unfinished copy is dropped on the next open, a
finished one is swapped in. Afterwards the old keys are not needed.

It is an offline operation: the store must not be open in any other
process (a writer in this one is refused by the owner lock).
"""

from __future__ import annotations

import logging
import os
import shutil

from victor_actors._errors import CheckpointCorruptError, EncryptionKeyError
from victor_actors.store._codec import Codec
from victor_actors.store._crypto import Keyring
from victor_actors.store._files import NEXT, finish_swap, swap_in
from victor_actors.store._keys import place
from victor_actors.store._store import Store
from victor_actors.store._writer import TxnOp, WriteTxn

__all__ = ["encrypt_in_place", "is_encrypted", "rekey"]

logger = logging.getLogger("victor_actors")

_BATCH = 512  # records per write transaction of the copy


def is_encrypted(path: str | os.PathLike[str]) -> bool:
    """Whether the store at ``path`` is encrypted (readable without keys)."""
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
        StoreLockedError: the store is open for writing elsewhere.
    """
    if not isinstance(new, Keyring):
        raise EncryptionKeyError(f"rekey needs the new Keyring, not {type(new).__name__}")
    store_path = os.fspath(path)
    finish_swap(store_path)
    source = Store(store_path, encryption=old, codec=codec, map_size=map_size)
    target_dir = os.path.join(store_path, NEXT)
    shutil.rmtree(target_dir, ignore_errors=True)
    try:
        target = Store(target_dir, encryption=new, codec=codec, map_size=map_size)
        try:
            written = _copy(source, target)
        finally:
            target.close()
    except BaseException:
        source.close()
        shutil.rmtree(target_dir, ignore_errors=True)
        raise
    source.close()
    swap_in(store_path)
    return written


def encrypt_in_place(
    path: str | os.PathLike[str],
    keyring: Keyring,
    *,
    codec: Codec | None = None,
    map_size: int = 256 * 1024 * 1024,
) -> bool:
    """Encrypt a plaintext store under ``keyring``; False if it is already encrypted (nothing done).

    Crash-safe and resumable: run it again after a crash and it finishes the
    job (or finds the store encrypted).
    """
    store_path = os.fspath(path)
    finish_swap(store_path)
    if not os.path.isfile(os.path.join(store_path, "data", "data.mdb")) or is_encrypted(store_path):
        return False
    rekey(store_path, keyring, None, codec=codec, map_size=map_size)
    return True


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
