"""The store's write-ahead log (docs/adr/0033): replay, damage, another store's log, a machine restart.

Most tests compose a store on disk from two moments of a real one: its data
file copied at some point (LMDB's state then: the page cache is what a killed
process leaves) and its log copied later (every record in it was
acknowledged, so fsynced). That is exactly what a crash leaves when LMDB lags
the log; a real SIGKILL at that point, and at random points, is tested too.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from victor_actors import (
    GlobalStateManager,
    Keyring,
    LogCorruptError,
    ScopeFailedError,
    TransitionBatch,
    VictorActorsError,
)
from victor_actors.store import Store, _walrecover, encrypt_in_place
from victor_actors.store._walfile import LOG_NAME, RECORDS_START
from victor_actors.store._writer import TxnOp, WriteTxn

RING = Keyring({"a": b"\x01" * 32}, active="a")


def _put(key: bytes, value: bytes) -> TxnOp:
    def op(t: WriteTxn) -> None:
        t.put("quarantine", key, value)

    return op


def _delete(key: bytes) -> TxnOp:
    def op(t: WriteTxn) -> None:
        t.delete("quarantine", key)

    return op


class Moments:
    """A store's data file after record 0 (a checkpoint), and its log after records 1..5."""

    def __init__(self, root: Path) -> None:
        src = root / "src"
        store = Store(src)
        try:
            store.submit([_put(b"a", b"0"), _put(b"gone", b"x")], wait=True)
            store.checkpoint_log()
            self.base = (src / "data" / "data.mdb").read_bytes()
            self.starts: list[int] = []
            self.ends: list[int] = []
            self.after: dict[int, bytes] = {}  # the data file after record i
            log = store._log
            assert log is not None
            for i in range(1, 6):
                self.starts.append(log.offset)
                ops = [_put(b"k%d" % i, b"v%d" % i), _put(b"a", b"%d" % i)]
                if i == 2:
                    ops.append(_delete(b"gone"))
                store.submit(ops, wait=True)
                self.ends.append(log.offset)
                self.after[i] = (src / "data" / "data.mdb").read_bytes()
            self.log = (src / "data" / LOG_NAME).read_bytes()
        finally:
            store.close()

    def record(self, i: int) -> tuple[int, int]:
        """Where record ``i`` (1..5) lies in the log."""
        return self.starts[i - 1], self.ends[i - 1]


@pytest.fixture(scope="module")
def moments(tmp_path_factory: pytest.TempPathFactory) -> Moments:
    return Moments(tmp_path_factory.mktemp("moments"))


def _compose(path: Path, data: bytes, log: bytes | None) -> Path:
    (path / "data").mkdir(parents=True)
    (path / "data" / "data.mdb").write_bytes(data)
    if log is not None:
        (path / "data" / LOG_NAME).write_bytes(log)
    return path


def _values(path: Path, **kwargs: object) -> tuple[dict[bytes, bytes], int]:
    """The raw records of the quarantine database after a writable open, and how many it replayed."""
    store = Store(path, **kwargs)  # type: ignore[arg-type]
    try:
        out = {}
        for key in (b"a", b"gone", *(b"k%d" % i for i in range(1, 6))):
            raw = store._get("quarantine", key)
            if raw is not None:
                out[key] = raw
        return out, store.log_replayed
    finally:
        store.close()


def _expected(upto: int) -> dict[bytes, bytes]:
    out = {b"a": b"%d" % upto, **{b"k%d" % i: b"v%d" % i for i in range(1, upto + 1)}}
    if upto < 2:
        out[b"gone"] = b"x"
    return out


def _digests(path: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((path / "data" / name).read_bytes()).hexdigest()
        for name in ("data.mdb", LOG_NAME)
        if (path / "data" / name).exists()
    }


def test_the_log_ahead_of_lmdb_is_replayed(moments: Moments, tmp_path: Path) -> None:
    """LMDB at record 0, the log up to 5: every record is replayed, in order (a delete too)."""
    path = _compose(tmp_path / "s", moments.base, moments.log)
    values, replayed = _values(path)
    assert values == _expected(5)
    assert replayed == 5
    assert _values(path) == (_expected(5), 0)  # closed clean: nothing left to replay


@pytest.mark.parametrize("how", ["truncated", "zeroed"])
def test_a_torn_last_record_ends_replay_cleanly_at_every_byte(
    moments: Moments, tmp_path: Path, how: str
) -> None:
    """A crash while the last record was written (the file cut, or the rest never written) at each
    byte of it: replay stops before it, and every earlier acknowledged record is there."""
    start, end = moments.record(5)
    for cut in range(start, end):
        if how == "truncated":
            log = moments.log[:cut]
        else:
            log = moments.log[:cut] + bytes(end - cut) + moments.log[end:]
        path = _compose(tmp_path / f"s{cut}", moments.base, log)
        values, replayed = _values(path)
        assert values == _expected(4), f"cut at byte {cut - start} of the last record"
        assert replayed == 4


@pytest.mark.parametrize("where", ["magic", "length", "sequence", "body", "digest"])
def test_flipped_bytes_in_a_middle_record_are_refused_and_change_nothing(
    moments: Moments, tmp_path: Path, where: str
) -> None:
    """A bad record with good ones after it is damage, not a torn tail: a typed refusal that leaves
    both files as they were; ``drop_damaged_log`` replays what precedes it and drops the rest."""
    start, end = moments.record(2)
    at = {"magic": start, "length": start + 5, "sequence": start + 9, "body": start + 20, "digest": end - 3}[
        where
    ]
    log = bytearray(moments.log)
    log[at] ^= 0x40
    path = _compose(tmp_path / "s", moments.base, bytes(log))
    before = _digests(path)
    with pytest.raises(LogCorruptError, match="damaged") as caught:
        Store(path)
    assert "nothing was opened or changed" in str(caught.value)
    assert _digests(path) == before
    with pytest.raises(LogCorruptError):
        Store(path)  # still refused: nothing moved on
    values, replayed = _values(path, drop_damaged_log=True)
    assert values == _expected(1)
    assert replayed == 1


def test_a_log_behind_lmdb_replays_nothing_twice(moments: Moments, tmp_path: Path) -> None:
    """LMDB already holds records 1..5 (a crash after its sync, before the log started over): none is
    applied again (record 1 again would set ``a`` back to 1)."""
    path = _compose(tmp_path / "s", moments.after[5], moments.log)
    assert _values(path) == (_expected(5), 0)
    path = _compose(tmp_path / "t", moments.after[3], moments.log)
    assert _values(path) == (_expected(5), 2)  # only 4 and 5


def test_a_log_of_another_store_is_refused(moments: Moments, tmp_path: Path) -> None:
    """Guards the log's id: another store's log (with records) next to this data file is refused."""
    other = tmp_path / "other"
    store = Store(other)
    store.submit([_put(b"a", b"other")], wait=True)
    store.close()
    path = _compose(tmp_path / "s", (other / "data" / "data.mdb").read_bytes(), moments.log)
    before = _digests(path)
    with pytest.raises(LogCorruptError, match="another store"):
        Store(path)
    assert _digests(path) == before


def test_a_data_file_older_than_the_log_is_refused(moments: Moments, tmp_path: Path) -> None:
    """The log starts after a checkpoint the data file never reached: what lies between is nowhere."""
    src = tmp_path / "src"
    store = Store(src)
    old = (src / "data" / "data.mdb").read_bytes()
    store.submit([_put(b"a", b"1")], wait=True)
    store.checkpoint_log()
    store.submit([_put(b"a", b"2")], wait=True)
    log = (src / "data" / LOG_NAME).read_bytes()
    store.close()
    path = _compose(tmp_path / "s", old, log)
    before = _digests(path)
    with pytest.raises(LogCorruptError, match="older than the log"):
        Store(path)
    assert _digests(path) == before


def test_a_read_only_open_serves_lmdb_and_reports_the_tail(moments: Moments, tmp_path: Path) -> None:
    """Read-only opens never replay: they serve the data file and say how many records it lacks."""
    path = _compose(tmp_path / "s", moments.base, moments.log)
    before = _digests(path)
    store = Store(path, read_only=True)
    try:
        assert store.log_tail == 5
        assert store._get("quarantine", b"a") == b"0"
    finally:
        store.close()
    assert _digests(path) == before


def test_without_the_log_a_tail_is_still_replayed_and_the_log_removed(
    moments: Moments, tmp_path: Path
) -> None:
    """``wal=False`` on a store with a tail: LMDB gets the tail (synced), and the log goes."""
    path = _compose(tmp_path / "s", moments.base, moments.log)
    values, replayed = _values(path, wal=False)
    assert (values, replayed) == (_expected(5), 5)
    assert not (path / "data" / LOG_NAME).exists()


def _scramble(base: bytes, current: bytes, seed: int) -> bytes:
    """A disk after a power loss: the meta pages of the newest state, every other page either as it was
    synced at the checkpoint or as written since (each page, at random)."""
    rng = random.Random(seed)
    psize = 4096
    out = bytearray(current)
    for page in range(2, len(current) // psize):
        if rng.random() < 0.5:
            old = base[page * psize : (page + 1) * psize]
            out[page * psize : (page + 1) * psize] = old.ljust(psize, b"\x00")
    return bytes(out)


def test_after_a_machine_restart_lmdb_goes_back_to_its_synced_state_and_the_log_replays(
    moments: Moments, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Power lost with LMDB unsynced since the checkpoint: its newest meta pages may have reached the
    disk and any of the pages since may not. The pinned synced state is whole whatever mix of pages the
    disk holds, so putting its meta pages back and replaying the log gives every acknowledged commit.
    Both halves are needed, and this fails without either: opened as the same boot (no meta pages put
    back) LMDB reads a torn tree (MDB_CORRUPTED); with the pin disabled, pages of the synced state were
    reused and the state put back has lost records (checked while writing this)."""
    monkeypatch.setattr(_walrecover, "boot_id", lambda: b"\x07" * 16)  # another boot than the log's
    for seed in range(8):
        disk = _scramble(moments.base, moments.after[5], seed)
        path = _compose(tmp_path / f"s{seed}", disk, moments.log)
        values, replayed = _values(path)
        assert values == _expected(5), f"seed {seed}"
        assert replayed == 5


def test_after_a_machine_restart_a_read_only_open_is_refused(
    moments: Moments, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its data file may be torn until a writer recovers it: refused, and nothing is touched."""
    monkeypatch.setattr(_walrecover, "boot_id", lambda: b"\x07" * 16)
    path = _compose(tmp_path / "s", moments.after[5], moments.log)
    before = _digests(path)
    with pytest.raises(VictorActorsError, match="machine restarted"):
        Store(path, read_only=True)
    assert _digests(path) == before


def test_after_a_machine_restart_another_stores_log_changes_nothing(
    moments: Moments, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The saved state is checked against the data file before its meta pages are written back."""
    monkeypatch.setattr(_walrecover, "boot_id", lambda: b"\x07" * 16)
    other = tmp_path / "other"
    store = Store(other)
    for i in range(20):
        store.submit([_put(b"x%d" % i, bytes(3000))], wait=True)
    store.close()
    path = _compose(tmp_path / "s", (other / "data" / "data.mdb").read_bytes(), moments.log)
    before = _digests(path)
    with pytest.raises(LogCorruptError, match="does not belong"):
        Store(path)
    assert _digests(path) == before


def test_one_fdatasync_per_group_and_lmdb_unsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the one flush: a group's durability is one ``fdatasync`` of the log (LMDB's own commit is
    opened without sync), and ``wal=False`` keeps the synced LMDB commit and writes no log."""
    calls = [0]
    real = os.fdatasync

    def counted(fd: int) -> None:
        calls[0] += 1
        real(fd)

    store = Store(tmp_path / "db")
    try:
        assert store.wal and store.env.flags()["sync"] is False
        monkeypatch.setattr(os, "fdatasync", counted)
        for i in range(100):
            store.submit([_put(b"k%d" % i, b"v")], wait=True)
        assert calls[0] == 100
    finally:
        monkeypatch.undo()
        store.close()
    off = Store(tmp_path / "off", wal=False)
    try:
        assert not off.wal and off.env.flags()["sync"] is True
        off.submit([_put(b"k", b"v")], wait=True)
        assert not (tmp_path / "off" / "data" / LOG_NAME).exists()
    finally:
        off.close()


def test_the_log_starts_over_at_checkpoints_and_its_space_is_reused(tmp_path: Path) -> None:
    """Checkpoints come on their own (every few hundred groups): the log file does not grow."""
    store = Store(tmp_path / "db")
    try:
        log = store._log
        assert log is not None
        size = os.path.getsize(tmp_path / "db" / "data" / LOG_NAME)
        for i in range(1000):
            store.submit([_put(b"k%d" % (i % 10), b"v%d" % i)], wait=True)
        assert log.checkpoints >= 3
        assert log.offset < RECORDS_START + 300 * 200
        assert os.path.getsize(tmp_path / "db" / "data" / LOG_NAME) == size
    finally:
        store.close()
    assert _values(tmp_path / "db")[1] == 0


def test_a_rewrite_replays_the_tail_before_it_copies(moments: Moments, tmp_path: Path) -> None:
    """Guards the rewrite's first step: a tail only in the log would be left behind by the copy (which
    reads the data file read-only), then deleted with the old data by the swap. Failed without
    ``settle_log``: the rewritten store held message 1 of 5."""
    src = tmp_path / "src"
    with GlobalStateManager.open(src) as m:
        conv = m.get_conversation_state("c")
        conv.apply(TransitionBatch().add_message({"i": 1}))
        assert m.store is not None
        m.store.checkpoint_log()
        base = (src / "data" / "data.mdb").read_bytes()
        for i in range(2, 6):
            conv.apply(TransitionBatch().add_message({"i": i}))
        log = (src / "data" / LOG_NAME).read_bytes()
    path = _compose(tmp_path / "s", base, log)
    assert encrypt_in_place(path, RING)
    with GlobalStateManager.open(path, encryption=RING) as m:
        assert [msg["i"] for msg in m.get_conversation_state("c", create=False).snapshot().messages] == [
            1, 2, 3, 4, 5,
        ]  # fmt: skip


_KILL_AFTER_APPEND = r"""
import os, signal, sys
from victor_actors import GlobalStateManager, TransitionBatch
from victor_actors.store import _wal

real, n, seen = _wal.WriteAheadLog.append, int(sys.argv[2]), [0]

def append(self, seq, body):
    real(self, seq, body)  # the record is durable: die before LMDB commits it
    seen[0] += 1
    if seen[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)

_wal.WriteAheadLog.append = append
with GlobalStateManager.open(sys.argv[1], durability="sync") as m:
    conv = m.get_conversation_state("c")
    i = 0
    while True:
        os.write(1, b"%d\n" % conv.apply(TransitionBatch().add_message({"i": i})).new_version)
        i += 1
"""


def _child(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)


def test_killed_after_the_log_is_synced_before_lmdb_commits(tmp_path: Path) -> None:
    """The commit in flight was never acknowledged, but it is durable: the reopened store has it."""
    path = tmp_path / "db"
    proc = _child(_KILL_AFTER_APPEND, str(path), "30")
    assert proc.stdout is not None
    acked = [int(line) for line in proc.stdout]
    assert proc.wait(30) == -signal.SIGKILL
    assert acked, "the child died before any commit was acknowledged"
    with GlobalStateManager.open(path) as m:
        assert m.store is not None and m.store.log_replayed == 1
        conv = m.get_conversation_state("c", create=False)
        assert conv.version == acked[-1] + 1
        assert [msg["i"] for msg in conv.snapshot().messages] == list(range(conv.version))


_APPLIES = r"""
import asyncio, os, sys
from victor_actors import GlobalStateManager, TransitionBatch

async def main() -> None:
    with GlobalStateManager.open(sys.argv[1], durability="sync") as m:
        convs = [m.get_conversation_state(f"c{j}") for j in range(3)]
        start = [c.version for c in convs]

        async def one(j: int) -> None:
            for i in range(start[j], 100_000):
                ev = await convs[j].aapply(TransitionBatch().add_message({"i": i}))
                os.write(1, b"%d %d\n" % (j, ev.new_version))

        await asyncio.gather(*(one(j) for j in range(3)))

asyncio.run(main())
"""


def test_sigkill_at_random_points_loses_no_acknowledged_commit(tmp_path: Path) -> None:
    """Durable applies on three scopes, killed at a random point, reopened, killed again: every version
    a caller was told of is there after each kill, whole (the log replayed where LMDB lagged)."""
    path = tmp_path / "db"
    rng = random.Random(30)
    for _round in range(4):
        proc = _child(_APPLIES, str(path))
        assert proc.stdout is not None
        acked = [0, 0, 0]
        stop = rng.randrange(20, 600)
        for n, line in enumerate(proc.stdout):
            j, version = map(int, line.split())
            acked[j] = max(acked[j], version)
            if n >= stop:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        with GlobalStateManager.open(path) as m:
            for j in range(3):
                conv = m.get_conversation_state(f"c{j}", create=False)
                assert conv.version >= acked[j]
                assert [msg["i"] for msg in conv.snapshot().messages] == list(range(conv.version))
            assert not m.recovery_reports


def test_a_failed_log_sync_stops_the_writes_and_recovery_settles_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's ``fdatasync`` fails: its caller hears the commit may or may not have been made
    durable, the store takes no more writes (never a second record over an unknown one), and the
    next open replays the record, which the page cache holds here."""
    store = Store(tmp_path / "db")
    store.submit([_put(b"a", b"1")], wait=True)
    real = os.fdatasync

    def failing(fd: int) -> None:
        monkeypatch.setattr(os, "fdatasync", real)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(ScopeFailedError, match="may or may not"):
        store.submit([_put(b"a", b"2")], wait=True)
    with pytest.raises(ScopeFailedError, match="no more writes"):
        store.submit([_put(b"a", b"3")], wait=True)
    store.close()
    reopened = Store(tmp_path / "db")
    try:
        assert reopened.log_replayed == 1
        assert reopened._get("quarantine", b"a") == b"2"
    finally:
        reopened.close()


def test_a_commit_queued_during_a_checkpoint_is_led_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``checkpoint_log`` holds the lead; a sync commit submitted meanwhile sleeps on its own job's
    lock, so the lead must pass to it afterwards. Failed before the hand-off: the commit never
    returned (the thread was still waiting after 10 s)."""
    store = Store(tmp_path / "db")
    log = store._log
    assert log is not None
    inside, release = threading.Event(), threading.Event()
    real = type(log).checkpoint

    def slow(self: object, **kwargs: bool) -> None:
        inside.set()
        assert release.wait(10)
        real(log, **kwargs)

    monkeypatch.setattr(type(log), "checkpoint", slow)
    checkpointer = threading.Thread(target=store.checkpoint_log)
    checkpointer.start()
    assert inside.wait(10)
    done = threading.Event()
    submitter = threading.Thread(target=lambda: (store.submit([_put(b"a", b"1")], wait=True), done.set()))
    submitter.start()
    while not store._writer._pending:  # type: ignore[union-attr]  # queued behind the checkpoint
        time.sleep(0.001)
    monkeypatch.setattr(type(log), "checkpoint", real)
    release.set()
    checkpointer.join(10)
    submitter.join(10)
    try:
        assert done.is_set(), "the commit queued during the checkpoint was never led"
    finally:
        store.close()


def test_a_failed_checkpoint_never_fails_a_durable_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's record was synced, then the checkpoint after it failed writing its header: the
    caller is told the commit succeeded (it is durable), and the store takes no more writes, since
    the new header may or may not be on disk. The reopened store has the commit. Failed before the
    header's failure stopped the writes: the next commit was accepted over that unknown header."""
    store = Store(tmp_path / "db")
    log = store._log
    assert log is not None
    log.checkpoint_groups = 1  # the next group is followed by a checkpoint
    real, calls = os.fdatasync, [0]

    def second_fails(fd: int) -> None:
        calls[0] += 1
        if calls[0] == 2:  # the first is the group's record, the second the checkpoint's header
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", second_fails)
    store.submit([_put(b"a", b"1")], wait=True)
    monkeypatch.setattr(os, "fdatasync", real)
    assert log.broken
    with pytest.raises(ScopeFailedError, match="no more writes"):
        store.submit([_put(b"a", b"2")], wait=True)
    store.close()
    reopened = Store(tmp_path / "db")
    try:
        assert reopened._get("quarantine", b"a") == b"1"
    finally:
        reopened.close()
