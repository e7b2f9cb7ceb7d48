"""The one error the inspector's routes answer with: an HTTP status, a code a client can act on, a message."""

from __future__ import annotations

from typing import Any

__all__ = ["InspectorError"]


class InspectorError(Exception):
    """A request the inspector refuses or cannot answer; it becomes a JSON error response.

    ``status`` is the HTTP status (always 4xx for what a request got wrong:
    a bad parameter, an unknown scope, a version no longer stored), ``code``
    a short stable name (``bad_parameter``, ``no_scope``, ...), ``message``
    says what was wrong; nothing was changed, since the inspector only reads.
    """

    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"error": {"status": self.status, "code": self.code, "message": self.message, **self.details}}
