"""OpenTelemetry traces and metrics for victor_actors (the ``otel`` extra).

    from victor_actors.otel import VictorActorsInstrumentor

    VictorActorsInstrumentor().instrument()    # tracer_provider=..., meter_provider=...
    ...
    VictorActorsInstrumentor().uninstrument()

Nothing of this package, nor OpenTelemetry itself, is imported by the rest
of victor_actors: until ``instrument()`` the runtime pays one check of an
empty slot per request. See docs/observability.md for the spans, their
attributes, the metrics and the cost.
"""

from __future__ import annotations

try:
    import opentelemetry.metrics
    import opentelemetry.trace  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "victor_actors.otel needs the OpenTelemetry API: pip install 'victor-actors[otel]'"
    ) from exc

from victor_actors.otel import _names as names
from victor_actors.otel._instrumentor import VictorActorsInstrumentor

__all__ = ["VictorActorsInstrumentor", "names"]
