"""Rewrite a whole store under other keys: key rotation, and encrypting a plaintext store.

The rewrite holds the store's owner lock from start to end (a writer beside
it is refused with ``StoreLockedError``; a read-only open reads the store as
it was and touches nothing). Every record is copied by key range into a fresh
store beside the data, under the new keyring's active key, its keyed-hash
layout and a new store id (``_rewrite.py``: anything that does not open
refuses the rewrite before the swap, and the copy is counted against the
source); then the copy is marked complete and swapped in by renames
(``OwnerLock.swap_in``). A crash at any point leaves the old store or the new
one, whole: the next lock holder drops an unfinished copy or finishes the
swap. Afterwards the old keys are not needed.
"""

from __future__ import annotations

import os
import shutil

from victor_actors._errors import EncryptionKeyError
from victor_actors.store._codec import Codec
from victor_actors.store._crypto import Keyring, Sealer
from victor_actors.store._files import COMPLETE, NEXT, PREVIOUS, OwnerLock
from victor_actors.store._rewrite import Copier
from victor_actors.store._store import Store
from victor_actors.store._walrecover import settle_log

__all__ = ["encrypt_in_place", "is_encrypted", "rekey"]


def is_encrypted(path: str | os.PathLike[str]) -> bool:
    """Whether the store at ``path`` is encrypted (not readable without keys).

    Raises:
        CheckpointCorruptError: its meta record is damaged or altered.
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
    drop_damaged: bool = False,
) -> int:
    """Rewrite every record and key of the store at ``path`` under ``new``'s active key.

    ``old`` opens the store as it is (None: it is plaintext); a record it
    does not open is tried with ``new`` (the rotation's first step seals new
    records with the new key). Returns how many records were written.

    With ``drop_damaged``, records that open with neither keyring are left
    out of the copy (each is logged as a warning) instead of refusing the
    rewrite; a scope record is then taken from the scope's index entry.

    Raises:
        EncryptionKeyError: ``old`` does not open the store, or some records
            are sealed under keys neither keyring holds; nothing was changed.
        CheckpointCorruptError: a record is damaged (or the store holds what
            a rewrite would not carry); nothing was changed.
        StoreLockedError: the store is open for writing elsewhere; nothing was changed.
        VictorActorsError: there is no store at ``path``.
    """
    _check_keyrings(new, old)
    with OwnerLock(os.fspath(path), create=False) as lock:
        return _rewrite(lock, new, old, codec, map_size, drop_damaged)


def encrypt_in_place(
    path: str | os.PathLike[str],
    keyring: Keyring,
    *,
    codec: Codec | None = None,
    map_size: int = 256 * 1024 * 1024,
    drop_damaged: bool = False,
) -> bool:
    """Encrypt a plaintext store under ``keyring``; False if it is already encrypted, or there is no
    store at ``path`` (nothing done).

    Crash-safe and resumable: run it again after a crash and it finishes the
    job (or finds the store encrypted). A store whose records do not all read
    as plaintext (its meta record lost or altered, say) is refused, as
    :func:`rekey` refuses damage.
    """
    _check_keyrings(keyring, None)
    store_path = os.fspath(path)
    if not _has_store(store_path):
        return False
    with OwnerLock(store_path, create=False) as lock:
        if is_encrypted(store_path):
            return False
        _rewrite(lock, keyring, None, codec, map_size, drop_damaged)
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


def _rewrite(
    lock: OwnerLock, new: Keyring, old: Keyring | None, codec: Codec | None, map_size: int, drop: bool
) -> int:
    """Copy the store ``lock`` holds into ``NEXT``, check the copy, and swap it in."""
    store_path = lock.store_path
    settle_log(lock.data, store_path, map_size)  # the log's tail into the data file, which is synced
    source = Store(
        store_path,
        read_only=True,
        encryption=None if old is None else old.with_keys(new),
        codec=codec,
        map_size=map_size,
    )
    target_dir = os.path.join(store_path, NEXT)
    try:
        shutil.rmtree(target_dir, ignore_errors=True)  # (taking the lock dropped an unfinished copy)
        target = Store(target_dir, encryption=new, codec=source.codec, map_size=map_size)  # its limit too
        try:
            fallback = None if old is None else Sealer(new, source.sealer.store_id)
            written = Copier(source, target, fallback, drop_damaged=drop).run()
            if not source.headed:  # a copy of a store from before format 3: see Store.give_heads
                target.give_heads(source.format)
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
