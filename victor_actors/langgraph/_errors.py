"""The LangGraph integration's own errors (each a ``VictorActorsError``)."""

from __future__ import annotations

from victor_actors import VictorActorsError

__all__ = ["ThreadDeletedError"]


class ThreadDeletedError(VictorActorsError):
    """A write named a checkpoint of a thread that was deleted (or expired) after it was made.

    ``delete_thread`` (and a TTL sweep) leaves a tombstone in the thread: a
    ``put`` or ``put_writes`` whose config names a checkpoint from before the
    deletion that the thread no longer holds (a late task of a cancelled
    run), or a ``put`` of a checkpoint created before it, is refused with this
    error and writes nothing. ``thread_id`` is the thread, ``checkpoint_id``
    the checkpoint the write named. A new run on the same thread id (a
    ``put`` of a fresh checkpoint with no parent) is accepted.
    """

    def __init__(self, message: str, *, thread_id: str, checkpoint_id: str) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.checkpoint_id = checkpoint_id
