"""victor_actors' metrics: instruments the hooks update, and gauges read from ``manager.stats()``.

Counters and histograms of things that happen (a commit's latency, a
restart, a refused request, a store transaction) are updated by the hooks
as they happen. Levels and totals the runtime already keeps (live and
passivated scopes, mailbox depth, commits, activations) are observable
instruments: their callbacks read ``stats()`` of every open manager at
collection time, so they cost nothing between collections and they count
what happened before ``instrument()`` too.

One :class:`Instruments` per meter: instrumenting again with the same meter
provider reuses it (an SDK meter refuses a second instrument of the same
name), and its callbacks report only while it is the active one.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from victor_actors._manager import GlobalStateManager, _open_managers
from victor_actors.otel import _names as n

__all__ = ["Instruments"]

logger = logging.getLogger("victor_actors")

_by_meter: weakref.WeakKeyDictionary[Meter, Instruments] = weakref.WeakKeyDictionary()
_labels: weakref.WeakKeyDictionary[GlobalStateManager, str] = weakref.WeakKeyDictionary()
_numbers = itertools.count(1)

# store commits per LMDB transaction: 1 (alone) up to the writer's max_batch (2048)
_BATCH_BOUNDS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
# seconds, from an in-memory apply (~60 us) to a synced commit on a slow disk
_LATENCY_BOUNDS = (
    0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


def _label(manager: GlobalStateManager) -> str:
    """A manager's number, in the order the metrics first saw it (stable for its lifetime)."""
    label = _labels.get(manager)
    if label is None:
        label = _labels.setdefault(manager, str(next(_numbers)))
    return label


def _open_stats() -> list[tuple[str, dict[str, int]]]:
    """(label, stats) of every open manager; one that closes meanwhile is left out."""
    out = []
    for manager in list(_open_managers):
        if manager.closed:
            continue
        try:
            stats = manager.stats()
        except Exception:  # closing under us: skip it this time
            logger.debug("no stats from a manager while collecting metrics", exc_info=True)
            continue
        out.append((_label(manager), stats))
    return out


class Instruments:
    """The instruments of one meter."""

    def __init__(self, meter: Meter) -> None:
        self.active = False
        self.commit_duration = meter.create_histogram(
            n.COMMIT_DURATION,
            unit="s",
            description="Latency of apply/aapply calls that committed, on the caller's side",
            explicit_bucket_boundaries_advisory=_LATENCY_BOUNDS,
        )
        self.restarts = meter.create_counter(
            n.RESTARTS, unit="{restart}", description="Scopes restarted by their supervisor"
        )
        self.rollbacks = meter.create_counter(
            n.ROLLBACKS, unit="{run}", description="Runs whose writes were rolled back"
        )
        self.refusals = meter.create_counter(
            n.REFUSALS, unit="{request}", description="Requests refused because a mailbox was full"
        )
        self.store_transactions = meter.create_counter(
            n.STORE_TRANSACTIONS, unit="{transaction}", description="LMDB write transactions committed"
        )
        self.commits_per_transaction = meter.create_histogram(
            n.COMMITS_PER_TRANSACTION,
            unit="{commit}",
            description="Store commits (jobs) sharing one LMDB write transaction (group commit)",
            explicit_bucket_boundaries_advisory=_BATCH_BOUNDS,
        )
        meter.create_observable_counter(
            n.COMMITS,
            [self._stat("commits")],
            unit="{commit}",
            description="Commits made in each open manager, every scope",
        )
        meter.create_observable_gauge(
            n.MAILBOX_DEPTH,
            [self._stat("mailbox_depth_max")],
            unit="{request}",
            description="The deepest mailbox of each open manager's live scopes",
        )
        meter.create_observable_up_down_counter(
            n.SCOPES,
            [self._scopes],
            unit="{scope}",
            description="Scopes of each open manager: live (an actor runs) or passivated (evicted)",
        )
        meter.create_observable_counter(
            n.ACTIVATIONS,
            [self._stat("activations")],
            unit="{activation}",
            description="Passivated scopes given an actor again",
        )
        meter.create_observable_counter(
            n.PASSIVATIONS,
            [self._stat("passivations")],
            unit="{passivation}",
            description="Scopes passivated (idle, or over the live-actor cap)",
        )
        meter.create_observable_counter(
            n.EVICTIONS,
            [self._stat("evictions")],
            unit="{passivation}",
            description="Scopes passivated to keep the live-actor cap",
        )

    @classmethod
    def of(cls, meter: Meter) -> Instruments:
        """The instruments of ``meter``, created on first use."""
        try:
            found = _by_meter.get(meter)
        except TypeError:  # a meter that takes no weak reference: make new ones each time
            return cls(meter)
        if found is None:
            found = _by_meter[meter] = cls(meter)
        return found

    def _stat(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if not self.active:
                return []
            return [Observation(stats[key], {n.MANAGER: label}) for label, stats in _open_stats()]

        return observe

    def _scopes(self, _options: CallbackOptions) -> Iterable[Observation]:
        if not self.active:
            return []
        out = []
        for label, stats in _open_stats():
            out.append(Observation(stats["live_actors"], {n.MANAGER: label, n.STATE: "live"}))
            out.append(Observation(stats["passivated_scopes"], {n.MANAGER: label, n.STATE: "passivated"}))
        return out


def level(ref: Any) -> str:
    """A scope's level (``conversation``): the attribute metrics carry instead of the scope's id."""
    return str(ref.scope.value)
