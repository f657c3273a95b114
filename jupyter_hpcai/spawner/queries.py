"""The hub's questions to the scheduler, each asked once for every HPCSlurmSpawner (runs in the hub): the
partitions' limits (one sinfo per ``limits_ttl``), each user's start estimates (estimates.py), the jobs' states (one
squeue per ``job_state_interval``, jobstate.JobStates) and the submissions (at most ``max_concurrent_submits`` at
once, one per user, jobstate.SubmitQueue). ``HPCSlurmSpawner.queries`` makes them once, from the spawner class's
settings."""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..scheduler import chosen
from ..errors import HPCAIError
from ..proc import RAN
from ..scheduler.interface import Associations, Partition
from .estimates import Estimate, Estimates
from .jobstate import JobStates, SubmitQueue
from .options import Profile

scheduler = chosen()

T = TypeVar("T")


class Cached(Generic[T]):
    """A value made at most once per ``ttl`` seconds, and once at a time: the threads that ask meanwhile wait for it
    (a storm of forms runs one sinfo, not one each)."""

    def __init__(self, make: Callable[[], T], ttl: float) -> None:
        self._make, self._ttl = make, ttl
        self._made: tuple[float, T] | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if self._made is None or time.monotonic() - self._made[0] >= self._ttl:
                self._made = (time.monotonic(), self._make())
            return self._made[1]


class SiteFacts:
    """The site's facts (QOS limits, projects' budgets) by key, each made at most once per ``ttl`` seconds for all
    the hub's users (scheduler.interface.SiteFacts): 40 users in one project ask sshare once, not 40 times."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._kept: dict[tuple[str, ...], Cached[Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, ...], make: Callable[[], T]) -> T:
        with self._lock:
            cached = self._kept.setdefault(key, Cached(make, self._ttl))
        return cached.get()


@dataclass(frozen=True)
class QuerySettings:
    """The admin's settings (HPCSlurmSpawner's traits of the same names)."""

    limits_ttl: float = 60
    start_estimates_ttl: float = 30
    job_state_interval: float = 1.0  # 0: each spawner asks Slurm on its own
    max_concurrent_submits: int = 8


class SharedQueries:
    """The scheduler as the hub's spawners ask it, each question asked once for all of them."""

    def __init__(self, settings: QuerySettings, environments: Callable[[], dict[str, str]] = dict,
                 log: logging.Logger | None = None) -> None:
        self.settings = settings
        self.log = log or logging.getLogger(__name__)
        atexit.register(self.say_calls)
        self.job_states = JobStates()
        self.submits = SubmitQueue()
        self.estimates = Estimates()
        self._partitions = Cached(scheduler.partitions, settings.limits_ttl)
        self._environments = Cached(environments, settings.limits_ttl)
        self._associations: dict[str, Cached[Associations | None]] = {}
        self._associations_lock = threading.Lock()
        self._site = SiteFacts(settings.limits_ttl)
        self._turns: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)  # user -> held while theirs submits

    def say_calls(self) -> None:
        """Log every scheduler command the hub has run, by name, as one JSON object (at the hub's exit: what the
        load test counts)."""
        self.log.info("Slurm commands this hub ran: %s",
                      json.dumps({name: RAN[name] for name in scheduler.COMMANDS if RAN[name]}))

    def partitions(self) -> list[Partition]:
        """sinfo's partitions, cached for ``limits_ttl`` seconds (one sinfo per form, not per keystroke)."""
        return self._partitions.get()

    def associations(self, user: str, log: logging.Logger | None = None) -> Associations | None:
        """``user``'s associations (their accounts, QOS and budgets), read once per ``limits_ttl`` seconds for each
        user, never per poll; None where the site keeps no accounting, or slurmdbd does not answer (then the form
        is as without accounting, and sbatch has the last word)."""
        with self._associations_lock:
            cached = self._associations.get(user)
            if cached is None:
                cached = self._associations[user] = Cached(lambda: self._read_associations(user, log),
                                                           self.settings.limits_ttl)
        return cached.get()

    def fresh_associations(self, user: str) -> Associations | None:
        """``user``'s associations as the accounting says them now (the site's QOS limits and budgets as read within
        ``limits_ttl``): None where the site keeps no accounting; HPCAIError where it does not answer."""
        return scheduler.associations(user, site=self._site)

    def _read_associations(self, user: str, log: logging.Logger | None) -> Associations | None:
        try:
            return self.fresh_associations(user)
        except HPCAIError as err:
            (log or logging.getLogger(__name__)).warning("%s's associations could not be read: %s", user, err)
            return None

    def node_address(self, node: str) -> str:
        """The address Slurm reaches ``node`` at (its NodeAddr), kept for ``limits_ttl`` seconds: 40 servers on two
        nodes ask sinfo twice, not 40 times."""
        return self._site.get(("NodeAddr", node), lambda: scheduler.node_address(node))

    def site_environments(self) -> dict[str, str]:
        """The site's environments (a scan of its roots), cached for ``limits_ttl`` seconds: every form and start
        reads them."""
        return self._environments.get()

    async def start_estimates(self, user: str, prefix: Sequence[str], profiles: Sequence[Profile],
                              env: Mapping[str, str]) -> dict[str, Estimate]:
        """Profile name -> when Slurm expects it to start (estimates.Estimates.of)."""
        return await self.estimates.of(user, prefix, profiles, env, self.settings.start_estimates_ttl)

    async def job_info(self, job_id: str, log: logging.Logger | None = None) -> dict[str, str] | None:
        """Slurm's record of ``job_id`` (None: Slurm no longer knows it): from the cycle's shared query, or its own
        scontrol when ``job_state_interval`` is 0."""
        if self.settings.job_state_interval > 0:
            return await self.job_states.info(job_id, self.settings.job_state_interval, log)
        return await asyncio.to_thread(scheduler.job_info, job_id)

    async def fresh_job_info(self, job_id: str) -> dict[str, str] | None:
        """Slurm's record of ``job_id`` as it is now, not as the cycle's query saw it (JobStates.fresh)."""
        return await self.job_states.fresh(job_id)

    @asynccontextmanager
    async def submission(self, user: str, ticket: object) -> AsyncIterator[None]:
        """Held while ``ticket`` submits: a user's starts one at a time (a user's own sbatch, stopped or stalled,
        holds one slot at most), and never more than ``max_concurrent_submits`` at once."""
        async with self._turns[user], self.submits.slot(ticket, self.settings.max_concurrent_submits):
            yield

    def place(self, ticket: object) -> int:
        """How many submissions wait before ``ticket`` (0: it is being submitted, or was)."""
        return self.submits.place(ticket)
