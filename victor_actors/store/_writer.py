"""The group-commit writer: many jobs, one synced LMDB write transaction.

Group commit with a leader instead of a dedicated writer thread: whoever
needs a durable commit and finds no commit in progress becomes the leader and
writes every queued job in one LMDB transaction on its own thread; the others
wait for it, then one of them leads the next round. A lone writer pays no
thread hand-off; concurrent writers share transactions. Jobs nobody waits
for (``async`` durability) are led by a flusher thread within
``flush_interval`` seconds. A job's waiter is released only once the
transaction holding it is durable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lmdb

from victor_actors import _trace
from victor_actors._errors import ScopeFailedError, VictorActorsError
from victor_actors.store._seek import prefix_items
from victor_actors.store._wal import WAL_KEY, WriteAheadLog
from victor_actors.store._walfile import encode_ops

__all__ = ["MAX_MAP_SIZE", "GroupCommitWriter", "ResizeGate", "TxnOp", "WriteTxn"]

logger = logging.getLogger("victor_actors")

MAX_MAP_SIZE = 1 << 40  # the map doubles on demand up to 1 TiB (address space, not disk)


class ResizeGate:
    """Readers share it; growing the map takes it alone.

    LMDB forbids ``set_mapsize`` while any read transaction of the process is
    open, in any thread: every read transaction of the store runs inside
    :meth:`reading`, and the writer grows the map inside :meth:`exclusive`,
    which waits for open readers to finish and holds new ones back.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._resizing = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._resizing:
                self._cond.wait()
            self._resizing = True
            while self._readers:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._resizing = False
                self._cond.notify_all()


class WriteTxn:
    """The write transaction a job's operations run in (on the leader's thread).

    ``bytes_put`` counts the bytes of the values it put (what the store hands to LMDB).
    With a ``journal`` (the write-ahead log is on), every put and delete is
    also recorded there, in order: the group's log record.
    """

    __slots__ = ("bytes_put", "dbs", "journal", "txn")

    def __init__(
        self, txn: Any, dbs: dict[str, Any], journal: list[tuple[str, bytes, bytes | None]] | None = None
    ) -> None:
        self.txn = txn
        self.dbs = dbs
        self.bytes_put = 0
        self.journal = journal

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self.bytes_put += len(value)
        self.txn.put(key, value, db=self.dbs[db])
        if self.journal is not None:
            self.journal.append((db, bytes(key), bytes(value)))

    def first_key_from(self, db: str, start: bytes) -> bytes | None:
        """The least key of ``db`` at or after ``start`` (None: there is none)."""
        with self.txn.cursor(db=self.dbs[db]) as cur:
            return bytes(cur.key()) if cur.set_range(start) else None

    def delete(self, db: str, key: bytes) -> None:
        self.txn.delete(key, db=self.dbs[db])
        if self.journal is not None:
            self.journal.append((db, bytes(key), None))

    def get(self, db: str, key: bytes) -> bytes | None:
        value = self.txn.get(key, db=self.dbs[db])
        return None if value is None else bytes(value)

    def keys_in(self, db: str, prefix: bytes) -> list[bytes]:
        """Every key under ``prefix`` of ``db``, sorted, each once (read as ``_seek.prefix_items`` reads)."""
        with self.txn.cursor(db=self.dbs[db]) as cur:
            items = prefix_items(cur, prefix, values=False)
        return sorted({key for key, _ in items})


TxnOp = Callable[[WriteTxn], None]


class _Uncertain(VictorActorsError):
    """A commit whose log record may or may not have reached the disk (its write or sync failed)."""


class _Job:
    __slots__ = ("done", "error", "ops", "queued", "size", "wake")

    def __init__(self, ops: list[TxnOp]) -> None:
        self.ops = ops
        self.done = False
        self.error: BaseException | None = None
        self.queued = time.monotonic()
        self.size = 0  # jobs in the transaction that committed it
        # held while its waiter sleeps, queued behind others (None: nobody waits, or it leads alone);
        # released once, when the job is done or its waiter is to lead
        self.wake: threading.Lock | None = None


class GroupCommitWriter:
    """Packs submitted jobs into shared write transactions of one LMDB environment."""

    def __init__(
        self,
        env: Any,
        dbs: dict[str, Any],
        *,
        gate: ResizeGate,
        path: str,
        flush_interval: float = 0.05,
        max_batch: int = 2048,
        wal: WriteAheadLog | None = None,
    ) -> None:
        self.env = env
        self.wal = wal
        self.dbs = dbs
        self.gate = gate
        self.path = path
        self.flush_interval = flush_interval
        self.max_batch = max_batch
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # the flusher sleeps on its own condition (same lock): woken only when a job nobody waits
        # for is queued, or on close, never by the lead passing between waiters
        self._flusher_cond = threading.Condition(lock)
        self._pending: list[_Job] = []
        self._async_queued = 0  # queued jobs nobody waits for (the flusher's work)
        self.flusher_wakeups = 0  # times the flusher woke from a wait (for tests and profiles)
        self._leading = False
        self._closed = False
        self._failed = False  # the log failed under a commit: no more writes (see _commit)
        self.commits = 0
        self.transactions = 0
        self.bytes_put = 0  # bytes of the values put by committed transactions
        # async-mode jobs have nobody waiting: this thread leads for them within flush_interval
        self._flusher = threading.Thread(target=self._flush_loop, name="victor-actors-flusher", daemon=True)
        self._flusher.start()

    def submit(self, ops: list[TxnOp], *, wait: bool) -> None:
        """Run ``ops`` in a write transaction; with ``wait``, return once it is durable.

        Raises:
            ScopeFailedError: the transaction failed; nothing of it was written.
        """
        if self._closed:
            raise ScopeFailedError("the store is closed; nothing was written")
        if self._failed:
            raise ScopeFailedError(
                "the store's write-ahead log failed under an earlier commit, so the store takes no more "
                "writes (reopen it: recovery settles that commit); nothing was written"
            )
        job = _Job(ops)
        alone = False
        with self._cond:
            if wait and not self._leading and not self._pending:
                self._leading = True  # nothing queued, nobody leading: a round of this job alone
                alone = True
            else:
                if wait:  # its waiter sleeps on it (see _lead)
                    job.wake = threading.Lock()
                    job.wake.acquire()
                self._pending.append(job)
                if not wait:
                    self._async_queued += 1
                    if self._async_queued == 1:
                        self._flusher_cond.notify()  # the flusher has work
                    return
                lead = not self._leading
                if lead:
                    self._leading = True
        if alone:
            self._lead_alone(job)
        else:
            if not lead:
                assert job.wake is not None
                job.wake.acquire()  # released when the job is done, or when this thread is to lead
            if not job.done:
                self._lead(job)
        if (hooks := _trace.hooks) is not None:
            hooks.group_commit(job.size)
        if isinstance(job.error, _Uncertain):
            raise ScopeFailedError(str(job.error)) from job.error
        if job.error is not None:
            raise ScopeFailedError(
                f"the store could not commit: {job.error}; nothing was written"
            ) from job.error

    def _lead(self, job: _Job | None) -> None:
        """Lead commit rounds (this thread holds ``_leading``) until ``job`` is done; None: drain all.

        Waiters sleep on their own job's lock, so a round wakes exactly the
        threads whose jobs it committed. When this thread's job is done, the
        lead passes to the first waiter still queued (its round takes the jobs
        queued before it too); with none, the lead is let go, and jobs nobody
        waits for are the flusher's.
        """
        cond = self._cond
        while True:
            with cond:
                if job is not None and job.done:
                    self._pass_lead()
                    return
                if job is None and not self._pending:
                    self._leading = False
                    cond.notify_all()
                    return
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                self._async_queued -= sum(1 for j in batch if j.wake is None)
            try:
                self._commit(batch)
            except BaseException as exc:  # _commit reports store errors to the jobs; this is worse
                self._round_failed(batch, exc)
                raise
            finally:
                for done in batch:
                    if done.wake is not None and done is not job:
                        done.wake.release()

    def _lead_alone(self, job: _Job) -> None:
        """:meth:`_lead` for a job that found nothing queued: one round of it, then the lead passes on.

        The common case of a lone writer (one caller committing at a time):
        no lock of its own to sleep on and no queue to take it from.
        Anything queued while it committed goes to the first waiter, as
        :meth:`_lead` hands over.
        """
        try:
            self._commit([job])
        except BaseException as exc:  # as in _lead: the writer's own failure, reported and raised
            self._round_failed([job], exc)
            raise
        with self._cond:
            self._pass_lead()

    def _round_failed(self, jobs: list[_Job], exc: BaseException) -> None:
        """The writer's own failure in a round (``_commit`` reports store errors to its jobs): every
        job of the round not done fails with it, and the lead is let go."""
        for failed in jobs:
            if not failed.done:
                failed.error, failed.done = exc, True
        with self._cond:
            self._leading = False
            self._cond.notify_all()

    def _pass_lead(self) -> None:
        """Under ``_cond``, this thread's job done: the lead goes to the first waiter still queued.

        Its round takes the jobs queued before it too. With no waiter the lead
        is let go: jobs nobody waits for (async) are the flusher's, within
        ``flush_interval``, and a waiter never stays to lead them.
        """
        successor = next((j for j in self._pending if j.wake is not None), None)
        if successor is None:
            self._leading = False
            self._cond.notify_all()  # a flush or the flusher waiting for the lead
        else:
            successor.wake.release()  # type: ignore[union-attr]

    def _lead_until_done(self, job: _Job | None) -> None:
        """Take the lead (waiting while another thread has it), then lead until ``job`` is done."""
        cond = self._cond
        with cond:
            while self._leading:
                if job is not None and job.done:
                    return
                cond.wait()
            if job is not None and job.done:
                return
            self._leading = True
        self._lead(job)

    def flush(self) -> None:
        """Return once everything submitted before the call is durable (at once if nothing is pending)."""
        if self._closed:
            return
        with self._cond:
            if not self._pending and not self._leading:
                return
        self.submit([], wait=True)

    def _flush_loop(self) -> None:
        """Lead for jobs nobody waits for, within ``flush_interval`` of the oldest; sleep otherwise.

        It waits on its own condition, which only a queued async job and
        ``close`` notify: sync commits never wake it.
        """
        cond = self._cond
        while True:
            with cond:
                while not self._async_queued and not self._closed:
                    self._flusher_cond.wait()
                    self.flusher_wakeups += 1
                if self._closed and not self._pending:
                    return
                oldest = next((j.queued for j in self._pending if j.wake is None), time.monotonic())
            delay = oldest + self.flush_interval - time.monotonic()
            if delay > 0 and not self._closed:
                time.sleep(delay)  # let more async commits join this transaction
            with cond:
                if not self._async_queued and not self._closed:
                    continue  # a leader committed them meanwhile
                if self._leading:
                    cond.wait(self.flush_interval)  # a leader is at work: it commits what is queued
                    self.flusher_wakeups += 1
                    continue
                self._leading = True
            self._lead(None)

    def _commit(self, jobs: list[_Job]) -> None:
        """Run ``jobs`` in one write transaction; with the log, its record is durable before it commits.

        With the write-ahead log the transaction itself is not synced: its
        puts and deletes go to the log as one record (one ``fdatasync``), then
        it commits; if the commit fails the record is taken back. A checkpoint
        follows when one is due (``_wal.py``).
        """
        error: BaseException | None = None
        wal = self.wal
        while True:
            appended = False
            try:
                with self.env.begin(write=True) as txn:
                    t = WriteTxn(txn, self.dbs, [] if wal is not None else None)
                    for job in jobs:
                        for op in job.ops:
                            op(t)
                    if wal is not None and t.journal:
                        seq = wal.applied + 1
                        txn.put(WAL_KEY, wal.key_value(seq), db=self.dbs["meta"])
                        wal.append(seq, encode_ops(t.journal))
                        appended = True
                if appended:
                    assert wal is not None
                    wal.committed(seq)
                error = None
                self.bytes_put += t.bytes_put
                break
            except lmdb.MapFullError:
                if appended:
                    self._retract()
                size = int(self.env.info()["map_size"])
                if size * 2 > MAX_MAP_SIZE:
                    error = VictorActorsError(
                        f"the LMDB map of {self.path} is at {size} bytes, and it grows to "
                        f"{MAX_MAP_SIZE} at most"
                    )
                    break
                logger.info("growing the LMDB map of %s to %d bytes", self.path, size * 2)
                if wal is not None:
                    wal.checkpoint()  # LMDB synced; its pin must go while the map grows
                    wal.unpin()
                try:
                    with self.gate.exclusive():  # no read transaction may be open while the map grows
                        self.env.set_mapsize(size * 2)
                finally:
                    if wal is not None:
                        wal.pin()
            except BaseException as exc:  # reported to every waiter; the writer goes on
                if appended:
                    self._retract()
                elif wal is not None and wal.broken:
                    self._failed = True  # a record may or may not be on disk: accept nothing more
                    exc = _Uncertain(
                        f"the store's write-ahead log could not be written ({exc}); this commit may or may "
                        "not be replayed on the next open, and the store takes no more writes"
                    )
                logger.exception("a store transaction failed")
                error = exc
                break
        if error is None and wal is not None and wal.due:
            self._checkpoint_log()
        self.transactions += 1
        self.commits += len(jobs)
        if (hooks := _trace.hooks) is not None:
            hooks.store_transaction(len(jobs))
        for job in jobs:
            job.size = len(jobs)
            job.error = error
            job.done = True  # waiters are woken by the leader's notify_all

    def _retract(self) -> None:
        """Take back the record of a transaction that did not commit; if that fails too, stop writing."""
        assert self.wal is not None
        try:
            self.wal.retract()
        except BaseException:
            self._failed = True  # the record may be replayed on the next open: accept nothing more
            logger.exception(
                "%s: a transaction failed after its log record was written, and the record could not be "
                "taken back; the store accepts no more writes (the next open may replay it)",
                self.path,
            )
            raise

    def _checkpoint_log(self) -> None:
        """Sync LMDB and start the log over (on the leader's thread, between transactions)."""
        assert self.wal is not None
        try:
            self.wal.checkpoint()
        except Exception:  # the group is durable in the log either way; its callers are not told otherwise
            if self.wal.broken:
                self._failed = True
            logger.exception(
                "%s: a checkpoint of the write-ahead log failed; %s",
                self.path,
                "the store takes no more writes" if self.wal.broken else "the log goes on",
            )

    def checkpoint_log(self) -> None:
        """Commit what is queued, then checkpoint the log now (a no-op without one)."""
        if self.wal is None or self._closed:
            return
        cond = self._cond
        with cond:
            while self._leading:
                cond.wait()
            self._leading = True
        try:
            while True:
                with cond:
                    batch = self._pending[: self.max_batch]
                    del self._pending[: self.max_batch]
                    self._async_queued -= sum(1 for j in batch if j.wake is None)
                if not batch:
                    break
                try:
                    self._commit(batch)
                finally:
                    for done in batch:
                        if done.wake is not None:
                            done.wake.release()
            self.wal.checkpoint()
        finally:
            with cond:  # the lead passes to a waiter queued meanwhile (it sleeps on its own job's lock)
                successor = next((j for j in self._pending if j.wake is not None), None)
                if successor is None or successor.wake is None:
                    self._leading = False
                    cond.notify_all()
                else:
                    successor.wake.release()

    def close(self) -> None:
        """Write what is queued and stop the flusher. Idempotent."""
        if self._closed:
            return
        self._lead_until_done(None)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._flusher_cond.notify_all()
        self._flusher.join()
        self._lead_until_done(None)  # anything that slipped in meanwhile
