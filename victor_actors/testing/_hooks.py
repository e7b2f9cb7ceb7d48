"""Test-only hooks into a running manager: injected faults and an observer of every actor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from victor_actors._kernel import Kernel
from victor_actors._manager import GlobalStateManager
from victor_actors._model import ScopeRef

__all__ = ["Observer", "inject_fault", "kernel_of", "set_observer"]

# observer(kind, ref, obj): ("received", ref, message) for every request a scope's actor takes,
# ("published", ref, event) for every commit it publishes; called on the thread that runs the
# scope's step: its actor's, or the caller's for a blocking apply to an idle scope (ADR 0032).
Observer = Callable[[str, ScopeRef, Any], None]


def inject_fault(
    manager: GlobalStateManager, ref: ScopeRef | str, fault: BaseException | Callable[[], Any]
) -> None:
    """Make ``ref``'s actor fail on its next request (for tests and simulations).

    ``fault`` is an exception to raise inside the actor, or a callable to
    run there (to hang for a while, say). The request it hits fails with
    :class:`ScopeFailedError` and applies nothing; the failure is supervised
    like any crash of the scope.

    Raises:
        ScopeAccessError: no such scope.
    """
    manager._inject_fault(ref, fault)


def set_observer(manager: GlobalStateManager, observer: Observer | None) -> None:
    """Watch every scope of ``manager``: ``observer(kind, ref, obj)`` on the thread running its step.

    ``kind`` is ``"received"`` (``obj`` is the request message) or
    ``"published"`` (``obj`` is the commit's ``StateChanged``). It runs on
    the scope's actor thread, or on the caller's thread when a blocking
    apply found the scope idle and ran its step there (ADR 0032). It must
    be quick and must not block or call back into the scope. None turns it off.
    """
    manager._set_observer(observer)


def kernel_of(manager: GlobalStateManager) -> Kernel:
    """The kernel under ``manager``: its live cells, locks and observer (for the recorder)."""
    return manager._kernel
