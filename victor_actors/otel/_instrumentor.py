"""VictorActorsInstrumentor: turns victor_actors' traces and metrics on and off.

The same shape as OpenTelemetry's instrumentation libraries
(``BaseInstrumentor``): one instance per process, ``instrument()`` and
``uninstrument()``, each idempotent. It is written here rather than derived
from ``opentelemetry-instrumentation``, a beta package that would bring
``wrapt`` and the auto-instrumentation machinery for one base class: this
instrumentation patches nothing, it only fills the runtime's hook slot
(``victor_actors._trace``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from typing import Any, ClassVar

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from victor_actors import __version__, _trace
from victor_actors.otel._hooks import OtelHooks
from victor_actors.otel._metrics import Instruments

__all__ = ["VictorActorsInstrumentor"]

logger = logging.getLogger("victor_actors")

SCOPE_NAME = "victor_actors"  # the instrumentation scope of our tracer and meter


class VictorActorsInstrumentor:
    """Traces and metrics of every victor_actors manager in this process, through OpenTelemetry.

    ``VictorActorsInstrumentor()`` always returns the same instance.
    ``instrument()`` starts tracing and metrics with the given providers
    (default: the global ones, ``opentelemetry.trace`` and
    ``opentelemetry.metrics``); ``uninstrument()`` stops them, and the
    runtime is back to its uninstrumented cost. Calling either twice does
    nothing more (the second ``instrument()`` logs a warning and keeps the
    first one's providers). Requests already under way finish with the
    state they started with.
    """

    _instance: ClassVar[VictorActorsInstrumentor | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _hooks: OtelHooks | None

    def __new__(cls, *args: Any, **kwargs: Any) -> VictorActorsInstrumentor:
        with cls._lock:
            if cls._instance is None:
                instance = super().__new__(cls)
                instance._hooks = None
                cls._instance = instance
            return cls._instance

    def instrumentation_dependencies(self) -> Collection[str]:
        """The distributions this instruments (``BaseInstrumentor``'s method of the same name)."""
        return (f"victor-actors >= {__version__}",)

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        """Whether ``instrument()`` is in force."""
        return self._hooks is not None

    def instrument(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """Start tracing and metrics (see the class's documentation and docs/observability.md)."""
        with self._lock:
            if self._hooks is not None:
                logger.warning("victor_actors is already instrumented; instrument() again changes nothing")
                return
            tracer = trace.get_tracer(SCOPE_NAME, __version__, tracer_provider)
            instruments = Instruments.of(metrics.get_meter(SCOPE_NAME, __version__, meter_provider))
            instruments.active = True
            self._hooks = OtelHooks(tracer, instruments)
            _trace.install(self._hooks)

    def uninstrument(self) -> None:
        """Stop tracing and metrics: the hook slot is empty again. Idempotent."""
        with self._lock:
            hooks, self._hooks = self._hooks, None
            if hooks is None:
                return
            if _trace.hooks is hooks:
                _trace.install(None)
            hooks.instruments.active = False
