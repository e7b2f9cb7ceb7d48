"""The run id in context: set by a run, carried in request envelopes, seen by actors and subscribers."""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["RUN_ID", "current_run_id"]

RUN_ID: ContextVar[str | None] = ContextVar("victor_actors_run_id", default=None)


def current_run_id() -> str | None:
    """The id of the run this code works for, or None outside any run.

    Correct in every asyncio task and in threads started with ``run.thread()``
    or functions wrapped by ``run.bind()``; inside a scope's actor while it
    handles the run's request; and in subscribers receiving the run's events.
    """
    return RUN_ID.get()
