"""One source for a sync method and its asyncio twin.

Logic that is more than a call (a retry loop, a coordinator step) is written
once, as a generator that yields the blocking steps it needs as
:class:`Step` values and receives their results (or has their errors thrown
into it). :func:`drive` runs such a generator with blocking calls,
:func:`adrive` with awaits, so the sync method and its twin share every line
of the logic and differ only in how each step waits.

    def _modify(self, fn):                       # the logic, once
        snapshot = self.snapshot()
        batch = yield Step(fn, None, snapshot)   # fn may be sync or async
        return (yield Step(self.apply, self.aapply, batch))

    def modify(self, fn):  return drive(self._modify(fn))
    async def amodify(self, fn):  return await adrive(self._modify(fn))
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar, cast

from victor_actors._errors import VictorActorsError

__all__ = ["Step", "StepGen", "adrive", "drive", "resolve_sync"]

T = TypeVar("T")


class Step:
    """One blocking step: ``sync(*args, **kwargs)`` in a sync caller, ``await async_(...)`` in a twin.

    With ``async_=None`` the same callable serves both: its result is
    awaited by :func:`adrive` when it is awaitable, and run to completion
    by :func:`drive` when no event loop is running (else it is an error).
    """

    __slots__ = ("args", "async_", "kwargs", "sync")

    def __init__(
        self,
        sync: Callable[..., Any],
        async_: Callable[..., Awaitable[Any]] | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self.sync = sync
        self.async_ = async_
        self.args = args
        self.kwargs = kwargs


StepGen = Generator[Step, Any, T]


def resolve_sync(value: Any, what: str) -> Any:
    """A sync caller's view of a callable's result: run a coroutine to completion, if it may."""
    if not inspect.isawaitable(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await(value))
    if inspect.iscoroutine(value):
        value.close()  # never started: close it rather than leave it unawaited
    raise VictorActorsError(f"{what} is async and an event loop is running here: use the a-prefixed twin")


async def _await(value: Awaitable[T]) -> T:
    return await value


def _advance(gen: StepGen[T], value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Resume ``gen`` with a step's result or error: (True, its return value) or (False, the next step)."""
    try:
        return False, gen.send(value) if error is None else gen.throw(error)
    except StopIteration as stop:
        return True, stop.value


def drive(gen: StepGen[T], what: str = "a callable") -> T:
    """Run ``gen`` with blocking calls; return what it returns."""
    value: Any = None
    error: BaseException | None = None
    while True:
        done, step = _advance(gen, value, error)
        if done:
            return cast(T, step)
        value, error = None, None
        try:
            value = step.sync(*step.args, **step.kwargs)
            if step.async_ is None:
                value = resolve_sync(value, what)
        except BaseException as exc:
            error = exc


async def adrive(gen: StepGen[T]) -> T:
    """Run ``gen`` with awaits, leaving the event loop free; return what it returns."""
    value: Any = None
    error: BaseException | None = None
    while True:
        done, step = _advance(gen, value, error)
        if done:
            return cast(T, step)
        value, error = None, None
        try:
            if step.async_ is not None:
                value = await step.async_(*step.args, **step.kwargs)
            else:
                value = step.sync(*step.args, **step.kwargs)
                if inspect.isawaitable(value):
                    value = await value
        except BaseException as exc:
            error = exc
