"""What one user may have the hub do at once, and per minute (runs in the hub): no user's requests starve the hub, or
Slurm, for the others. Each of our endpoints, and each start, takes a token from the user's bucket for that kind of
request (``HPCSlurmSpawner.hub_api_per_minute``); some kinds also run one at a time per user. A refusal is an
HPCAIError with HTTP 429 and the seconds to wait, which the handlers send as ``Retry-After``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import HPCAIError


class TooMany(HPCAIError):
    """A request over its user's share: HTTP 429, and when to ask again."""

    status = 429

    def __init__(self, message: str, hint: str, retry_after: float) -> None:
        super().__init__(message, hint)
        self.retry_after = max(1, round(retry_after))


@dataclass
class _Bucket:
    tokens: float
    at: float  # time.monotonic() of the last refill


class Shares:
    """Each user's token buckets (one per kind of request) and the kinds they have in flight."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._busy: set[tuple[str, str]] = set()

    def take(self, user: str, kind: str, per_minute: int) -> None:
        """One ``kind`` request of ``user``'s, or TooMany: at most ``per_minute`` a minute, in bursts of as many."""
        if per_minute <= 0:
            return
        now = time.monotonic()
        bucket = self._buckets.setdefault((user, kind), _Bucket(per_minute, now))
        bucket.tokens = min(per_minute, bucket.tokens + (now - bucket.at) * per_minute / 60)
        bucket.at = now
        if bucket.tokens < 1:
            wait = (1 - bucket.tokens) * 60 / per_minute
            raise TooMany(f"too many {kind} requests from {user}: the hub takes {per_minute} a minute from each user",
                          f"ask again in {max(1, round(wait))} s", wait)
        bucket.tokens -= 1

    @contextmanager
    def one_at_a_time(self, user: str, kind: str) -> Iterator[None]:
        """Held while ``user``'s ``kind`` request runs; another meanwhile is TooMany (nothing waits in the hub)."""
        if (user, kind) in self._busy:
            raise TooMany(f"another {kind} request of {user}'s is still running", "wait for its answer, then ask again",
                          1)
        self._busy.add((user, kind))
        try:
            yield
        finally:
            self._busy.discard((user, kind))


SHARES = Shares()  # the hub's one
