"""A scope on its shard, seen from a driver: :class:`RayScopeHandle`, the client's handle routed by shard.

It is :class:`~victor_actors.remote.RemoteScopeHandle` (the local handle's
API: reads, writes with ``expected_version``, ``modify``, ``transact``,
``subscribe``, each blocking call with its asyncio twin) with three Ray
differences:

- every request goes to the scope's shard, naming the scope by its address
  (the shard creates it, with its parents, on first touch);
- a batch that also writes the global scope from a scope off its home
  commits across shards (:mod:`._crossshard`), and a write inside
  ``manager.run`` is tracked by the driver's run (:mod:`._run`);
- a snapshot reads the global scope through its shard's mirror, asking for
  at least the newest version this driver has seen (read your writes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from victor_actors._errors import ScopeAccessError
from victor_actors._handle import BatchLike, _transitions
from victor_actors._model import GLOBAL_REF
from victor_actors._snapshot import ContextSnapshot
from victor_actors._state import StateChanged
from victor_actors._twins import Step, StepGen
from victor_actors.ray import _wire as w
from victor_actors.ray._placement import HOME, Address, lineage_of, ref_of, shard_for
from victor_actors.ray._run import CURRENT_RAY_RUN
from victor_actors.remote._client import Subscription
from victor_actors.remote._handle import RemoteScopeHandle

__all__ = ["RayScopeHandle"]


class RayScopeHandle(RemoteScopeHandle):
    """A handle on one scope on its shard (see the module's documentation). Cheap, thread-safe."""

    __slots__ = ("address", "shard")

    _manager: Any  # the RayStateManager

    def __init__(self, manager: Any, address: Address) -> None:
        super().__init__(manager, ref_of(address), lineage_of(address))
        self.address = address
        self.shard = shard_for(address, manager.shards)

    def __repr__(self) -> str:
        return f"<RayScopeHandle {self.ref} on shard {self.shard}>"

    async def asnapshot(self, *, timeout: float | None = None) -> ContextSnapshot:
        """This scope's snapshot with its ancestors (global read through the shard's mirror)."""
        m = self._manager
        op = {"k": "snapshot", "a": self.address, "g": m._global_seen if self.shard != HOME else -1}
        snap = w.snapshot_from(await m._ask(self.shard, op, timeout))
        m._saw(snap.versions().get(GLOBAL_REF))
        return snap

    async def aapply(
        self, batch: BatchLike, *, expected_version: Any = None, timeout: float | None = None
    ) -> StateChanged:
        """Apply a batch all or nothing, across shards when it writes the global scope from elsewhere.

        Raises: as ``ScopeHandle.apply``, and ``ShardUnavailableError`` when a
        shard could not be reached (it says whether the batch may have been applied).
        """
        steps = _transitions(batch)
        record: StateChanged = await self._manager._apply(
            self, steps, self._expected(expected_version), timeout
        )
        return record

    def subscribe(self, callback: Callable[[StateChanged], object]) -> Subscription:
        """Call ``callback(event)`` on this driver after every later commit of this scope, in order.

        Events come from the shard's log by version, so a shard restart loses
        none and doubles none: delivery resumes after the last version
        delivered. Every driver that subscribes gets every event. Callbacks
        run on the driver's delivery thread.
        """
        if not callable(callback):
            raise TypeError("subscribe takes a callable")
        sub: Subscription = self._manager._subscribe(self.ref, self.shard, self.version, callback)
        return sub

    def _transact(
        self, fn: Callable[[ContextSnapshot], Any], lock: Iterable[Any] | None, timeout: float | None
    ) -> StepGen[StateChanged]:
        """As the client's, on this scope's shard. Off home the global scope cannot be locked there
        (it lives on home): locking it, or a batch writing it, is refused; ``modify`` commits across."""
        if not callable(fn):
            raise TypeError("transact takes a callable: fn(snapshot) -> batch")
        names = self._lock_names(lock)
        if self.shard != HOME:
            if names is not None and str(GLOBAL_REF) in names:
                raise ScopeAccessError(
                    f"transact on {self.ref} (shard {self.shard}) cannot lock the global scope, which "
                    f"lives on shard {HOME}: use modify, whose batch commits across shards"
                )
            if names is None:
                names = tuple(str(r) for r in (self.ref, *self.lineage) if r != GLOBAL_REF)
        m = self._manager
        op = {"a": self.address, "l": names}
        opened = yield Step(m._blocking_on, m._atx_on, self.shard, "tx_open", op, timeout)
        txid, raw = opened
        try:
            snapshot = w.snapshot_from(raw)
            steps = _transitions((yield Step(fn, None, snapshot)))
        except BaseException:
            yield Step(m._blocking_on, m._atx_on, self.shard, "tx_abort", {"id": txid}, timeout)
            raise
        commit = {"id": txid, "t": w.transitions_to(steps)}
        out = yield Step(m._blocking_on, m._atx_on, self.shard, "tx_commit", commit, timeout)
        record = w.record_from(out, steps)
        m._saw_record(record)
        run = CURRENT_RAY_RUN.get()
        if run is not None:
            run._record(self, record)
        return record
