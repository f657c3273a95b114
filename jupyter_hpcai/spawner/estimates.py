"""When Slurm expects each profile's job to start, for the spawn form: ``sbatch --test-only`` as the user (the
scheduler's own estimate, with the user's limits and priority), and, for a job that would wait, whether a
shorter walltime starts sooner (backfill before a reservation or a running job's end).

Cached per user for the limits' TTL and refreshed in the background: the form waits at most ``WAIT`` seconds
for a fresh answer, else shows the last one (or none).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .. import proc
from ..errors import HPCAIError
from ..scheduler import chosen
from ..scheduler.durations import format_duration, parse_duration
from .options import Profile

scheduler = chosen()

WAIT = 1.0  # seconds the form waits for estimates
NOW = 60  # a start within this many seconds is "now"
SHORTER = (3600, 1800)  # walltimes tried, longest first, when a profile's job would wait


@dataclass(frozen=True)
class Estimate:
    """Slurm's expected start of a profile's job, and a shorter walltime that starts sooner."""

    start: float | None  # epoch seconds; None: Slurm gave no estimate
    shorter: tuple[str, float] | None = None  # (walltime, its expected start)

    def words(self, now: float) -> str:
        if self.start is None:
            return "no start estimate from Slurm"
        said = "starts now" if self.start <= now + NOW else f"expected start {_when(self.start, now)}"
        if self.shorter:
            walltime, start = self.shorter
            said += f"; {walltime} {'starts now' if start <= now + NOW else 'would start ' + _when(start, now)}"
        return said


def _when(start: float, now: float) -> str:
    wait = start - now
    about = f"{round(wait / 60)} min" if wait < 90 * 60 else f"{round(wait / 3600)} h"
    return f"{time.strftime('%H:%M', time.localtime(start))} (in about {about})"


def ask(prefix: Sequence[str], profile: Profile, walltime: str, env: Mapping[str, str]) -> float | None:
    """``sbatch --test-only`` for ``profile`` with ``walltime``, as the user ``prefix`` runs commands as."""
    args = [f"--partition={profile.partition}", f"--nodes={profile.nodes}",
            f"--ntasks-per-node={max(1, profile.gpus_per_node)}", f"--time={walltime}"]
    args += [f"--gpus-per-node={profile.gpus_per_node}"] if profile.gpus_per_node else []
    args += [f"--account={profile.account}"] if profile.account else []
    try:
        done = proc.run([*prefix, *scheduler.test_only(args)], env=env, timeout=10, check=False)
    except HPCAIError:  # sbatch missing or not answering: no estimate, the form goes on
        return None
    return scheduler.expected_start(done.stderr + done.stdout)


def estimate(prefix: Sequence[str], profile: Profile, env: Mapping[str, str]) -> Estimate:
    """The profile's expected start; for one that would wait, the longest shorter walltime that starts sooner."""
    start = ask(prefix, profile, profile.walltime, env)
    if start is None or start <= time.time() + NOW:
        return Estimate(start)
    for seconds in (s for s in SHORTER if s < (parse_duration(profile.walltime) or 0)):
        walltime = format_duration(seconds)
        sooner = ask(prefix, profile, walltime, env)
        if sooner is not None and sooner < start - NOW:
            return Estimate(start, (walltime, sooner))
    return Estimate(start)


class Estimates:
    """Each user's estimates, cached for ``ttl`` seconds, refreshed in the background."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, dict[str, Estimate]]] = {}
        self._pending: dict[str, asyncio.Future[dict[str, Estimate]]] = {}

    async def of(self, user: str, prefix: Sequence[str], profiles: Sequence[Profile], env: Mapping[str, str],
                 ttl: float, wait: float = WAIT) -> dict[str, Estimate]:
        """Profile name -> estimate: fresh if Slurm answers within ``wait`` seconds, else the last ones."""
        cached = self._cache.get(user)
        if cached and time.monotonic() - cached[0] < ttl:
            return cached[1]
        if user not in self._pending:
            self._pending[user] = asyncio.ensure_future(self._compute(user, prefix, profiles, env))
        try:
            return await asyncio.wait_for(asyncio.shield(self._pending[user]), wait)
        except asyncio.TimeoutError:
            return cached[1] if cached else {}

    async def _compute(self, user: str, prefix: Sequence[str], profiles: Sequence[Profile],
                       env: Mapping[str, str]) -> dict[str, Estimate]:
        loop = asyncio.get_running_loop()
        try:  # a user's profiles one after another, in one of the pool's threads: a user holds one at most
            answers = await loop.run_in_executor(POOL, lambda: [estimate(prefix, p, env) for p in profiles])
            found = dict(zip((p.name for p in profiles), answers))
            self._cache[user] = (time.monotonic(), found)
            return found
        finally:
            self._pending.pop(user, None)


# the estimates' own threads, one per user at most: a form storm's sbatch --test-only never holds the default pool,
# where the hub's job-state query and the spawners' other blocking calls run, and no user holds all of these
POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hpcai-estimates")
