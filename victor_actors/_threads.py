"""Threads for scope actors: started once, reused by one actor after another.

pykka gives every actor a thread of its own and lets it end with the actor.
Starting a thread costs about as much as an actor round trip, and a runtime
that passivates and reactivates scopes all day starts one per activation. So
a scope actor's loop runs on a parked thread when one is free: the thread
serves exactly one actor at a time (one actor per thread, as pykka has it),
and when that actor stops it parks again, up to ``MAX_PARKED`` threads; any
more simply end.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["MAX_PARKED", "PARKED_NAME", "STACK_SIZE", "run_on_actor_thread"]

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
