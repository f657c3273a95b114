"""What the hub's and the server's HTTP handlers share (runs in the hub and in the server): an ``HPCAIError`` as the
JSON reply every client of ours reads, and the bounds of an extend request, checked the same on both sides."""

from __future__ import annotations

import json
from typing import Any

from tornado import web

from .errors import HPCAIError

MIN_EXTEND, MAX_EXTEND = 60, 7 * 86400  # one extend request adds at least a minute, at most a week


def refuse(handler: web.RequestHandler, err: HPCAIError, status: int = 409) -> None:
    """Finish the request with ``err`` as ``{"error", "hint"}`` (409: the request was understood and refused)."""
    handler.set_status(status)
    handler.finish(json.dumps({"error": err.message, "hint": err.hint}))


def extend_seconds(body: Any) -> int:
    """The request's ``seconds``: a whole number from a minute to a week; else 400 with what to send."""
    seconds = body.get("seconds") if isinstance(body, dict) else None
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not MIN_EXTEND <= seconds <= MAX_EXTEND:
        raise web.HTTPError(400, f'send {{"seconds": N}}, N a whole number from {MIN_EXTEND} to {MAX_EXTEND}')
    return seconds
