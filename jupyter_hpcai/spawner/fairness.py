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
from .refusal import refused

OWNER_WAITS = ("JobHeldUser", "BeginTime")  # a waiting job's reasons that are its owner's doing (held_start_timeout)


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


class StartShare:
    """A mixin of HPCSlurmSpawner: a start within its user's share (``_check_share``), and a start its owner holds
    cancelled after held_start_timeout (``_cancel_a_long_hold``)."""

    _admitted = False  # this start passed the user's share (_check_share): it counts against their next ones
    _held_for = 0.0  # seconds this start's job has waited for its owner (_held), up to the last look
    _held_seen: float | None = None  # time.monotonic() of the last look, where it was waiting for its owner then
    _reason = ""  # the scheduler's reason for the job's state, at the last query

    def _check_share(self) -> None:
        """Refuse (429) a start over its user's share: more than hub_api_per_minute starts a minute (every start asked
        for counts: JupyterHub has written the server's records before it calls start), or max_pending_starts of
        theirs admitted by this check already (starts asked for at once are not refused for each other). No await
        between the count and the mark: starts at once are counted one after another."""
        self._admitted = False
        try:
            SHARES.take(self.user.name, "start", self.hub_api_per_minute)
        except TooMany as err:
            raise refused(429, err) from None
        starting = sorted(s.name or "the default" for s in self.user.spawners.values()
                          if s is not self and s.pending == "spawn" and getattr(s, "_admitted", False))
        if self.max_pending_starts and len(starting) >= self.max_pending_starts:
            raise refused(429, HPCAIError(
                f"{len(starting)} servers of {self.user.name}'s are starting already ({', '.join(starting)}), the "
                f"most this hub starts at once for one user", "wait until one has started, or stop one on the "
                "hub's home page"))
        self._admitted = True

    def _held(self) -> float:
        """Seconds this start's job has waited, in all, for its owner: held (scontrol hold: JobHeldUser) or put off
        (a BeginTime the hub never sets), however often released and held again."""
        now = time.monotonic()
        if self._held_seen is not None:
            self._held_for += now - self._held_seen
        self._held_seen = now if self._reason in OWNER_WAITS else None
        return self._held_for

    async def _cancel_a_long_hold(self) -> None:
        """Cancel this start's job, and fail the start saying why, once its owner has held it (scontrol hold, or a
        later BeginTime) for held_start_timeout seconds in all: while it waits it counts against the hub's limit of
        starts at once."""
        held = self._held()
        if not self.held_start_timeout or held < self.held_start_timeout:
            return
        await self._cancel_quietly()
        raise refused(409, HPCAIError(
            f"job {self.job_id} was held by {self.user.name} (scontrol hold) for {held:.0f} s, so the hub cancelled "
            "it: a start that waits counts against the hub's limit of starts at once, for everyone",
            "start again when the job may run; release a held start sooner (scontrol release JOBID)"))
