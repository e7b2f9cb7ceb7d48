"""Threads for scope actors, and daemon worker threads for the services.

Scope actors' threads are started once and reused by one actor after another.

pykka gives every actor a thread of its own and lets it end with the actor.
Starting a thread costs about as much as an actor round trip, and a runtime
that passivates and reactivates scopes all day starts one per activation. So
a scope actor's loop runs on a parked thread when one is free: the thread
serves exactly one actor at a time (one actor per thread, as pykka has it),
and when that actor stops it parks again, up to ``MAX_PARKED`` threads; any
more simply end.

:class:`Workers` is a small pool of daemon threads (the tool dispatcher's):
unlike ``ThreadPoolExecutor``'s threads, they are not joined when the
interpreter exits, so work still running never holds a process's exit.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["MAX_PARKED", "PARKED_NAME", "STACK_SIZE", "Workers", "run_on_actor_thread"]

logger = logging.getLogger("victor_actors")

MAX_PARKED = 256  # parked threads kept for the next activations (each: a small stack, no Python objects)
STACK_SIZE = 512 * 1024  # scope actors need little stack; thousands of threads add up

_lock = threading.Lock()
_jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_parked = 0  # threads waiting on _jobs, minus jobs already handed to them
_numbers = itertools.count(1)
PARKED_NAME = "victor-actors-parked"  # the name of a thread while it waits for its next actor


def run_on_actor_thread(loop: Callable[[], None]) -> None:
    """Run ``loop`` (an actor's whole life) on a parked thread, or on a new one if none is free."""
    global _parked
    with _lock:
        if _parked > 0:
            _parked -= 1
            _jobs.put(loop)
            return
    # threading.stack_size is process-wide: set it only around this thread's start
    with _lock:
        previous = threading.stack_size(STACK_SIZE)
        try:
            thread = threading.Thread(
                target=_serve, args=(loop,), name=f"victor-actors-scope-{next(_numbers)}", daemon=True
            )
            thread.start()
        finally:
            threading.stack_size(previous)


def _serve(loop: Callable[[], None]) -> None:
    global _parked
    while True:
        try:
            loop()
        except BaseException:  # an actor's loop contains its own errors; this is a last resort
            logger.exception("a scope actor's loop ended with an error")
        del loop  # nothing of the finished actor stays reachable from a parked thread
        me = threading.current_thread()
        name = me.name
        with _lock:
            if _parked >= MAX_PARKED:
                return
            _parked += 1
        me.name = PARKED_NAME
        loop = _jobs.get()
        me.name = name


class Workers:
    """Up to ``size`` daemon threads taking jobs from one queue, started as jobs arrive.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, are not joined when the
    interpreter exits, so a tool that is still running never holds a
    process's exit (Ctrl-C included).
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = threading.Semaphore(0)  # released by a thread each time it is free again
        self._threads = 0

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)
        if self._idle.acquire(timeout=0):
            return  # a free thread takes it
        with self._lock:
            if self._threads >= self._size:
                return  # queued for the next thread that is free
            self._threads += 1
            name = f"{self._name}-{self._threads}"
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except BaseException:  # a job contains its own errors; this is a last resort
                logger.exception("a worker job ended with an error")
            del job
            self._idle.release()

    def close(self) -> None:
        """End the threads once the jobs queued before this have run."""
        with self._lock:
            threads, self._threads = self._threads, 0
        for _ in range(threads):
            self._jobs.put(None)
