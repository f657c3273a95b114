"""More walltime for a running notebook job (runs in the hub): users cannot raise their own job's time limit in the
scheduler, the hub (root) can, within the site's policy, ``HPCSlurmSpawner.extend_max_walltime``. The request comes
through hub_api.py; ``JobExtension.extend`` (a mixin of the spawner) applies it, to the job as the hub submitted it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..errors import HPCAIError
from ..scheduler import chosen
from ..scheduler.durations import format_duration, later, parse_duration, seconds_until
from ..scheduler.interface import Account, Qos
from .options import SpawnOptions

scheduler = chosen()


def allowed(policy: Mapping[str, str], partition: str) -> int:
    """The longest walltime ``policy`` (partition, or ``*``, -> HH:MM:SS) lets a job on ``partition`` be extended to,
    in seconds; or the error that says why not (no question to Slurm needed)."""
    ceiling = policy.get(partition, policy.get("*"))
    if not ceiling:
        raise HPCAIError(f"this site does not extend notebook jobs on partition {partition}",
                         "save your work (%hpc checkpoint) and start a new server, or %hpc continue")
    seconds = parse_duration(str(ceiling))
    if seconds is None:
        raise HPCAIError(f"the site's extend policy for {partition} is not a walltime: {ceiling!r}",
                         "tell the hub's admin: HPCSlurmSpawner.extend_max_walltime takes HH:MM:SS per partition")
    return seconds


def new_limit(policy: Mapping[str, str], partition: str, limit: int, add: int, scheduler_max: int | None,
              qos: Qos | None = None) -> int:
    """The job's new time limit in seconds, or an error that says why not. ``policy``: partition (or ``*``)
    -> the longest walltime a notebook job may be extended to; ``scheduler_max``: the partition's own limit
    (with the admin's ``limits``), and ``qos``: the job's QOS (its MaxWall), which the policy never exceeds: the hub
    (root) could set a limit Slurm would refuse the job's owner."""
    ceiling, where = allowed(policy, partition), f"on {partition}"
    if scheduler_max:
        ceiling = min(ceiling, scheduler_max)
    if qos and qos.max_time and qos.max_time < ceiling:
        ceiling, where = qos.max_time, f"under QOS {qos.name}"
    wanted = limit + add
    if wanted > ceiling:
        room = ceiling - limit
        raise HPCAIError(f"the job's walltime would be {format_duration(wanted)}, over {format_duration(ceiling)}, the "
                         f"most this site allows {where}",
                         f"ask for at most {format_duration(room)} more" if room >= 60 else
                         "the job is at its longest: save your work (%hpc checkpoint) and %hpc continue")
    return wanted


def within_budget(account: Account | None, gpus: int, remaining: int, add: int) -> None:
    """Refuse an extension its project's GPU budget cannot pay for: the job's GPUs for the time it has left plus
    ``add`` seconds must fit in the GPU minutes the project has left (the project's other running jobs are not
    counted). Slurm checks a budget when a job starts, never when root raises its limit, and a project over its
    budget loses every running job."""
    if account is None or account.gpu_minutes is None or not gpus:
        return
    left = account.gpu_minutes - account.gpu_minutes_used
    needed = gpus * (max(0, remaining) + add) / 60
    if needed > left:
        room = int(left * 60 / gpus) - max(0, remaining)
        raise HPCAIError(f"project {account.name} has {left / 60:.1f} GPU hours left; this job's {gpus} GPU(s) would "
                         f"need {needed / 60:.1f} to run to the extended end",
                         f"ask for at most {format_duration(room)} more" if room >= 60 else
                         "save your work (%hpc checkpoint): the project's budget ends before this job")


class JobExtension:
    """A mixin of HPCSlurmSpawner: ``extend``, which the hub's extend endpoint calls."""

    async def extend(self, seconds: int) -> dict[str, Any]:
        """Add ``seconds`` to the running job's time limit within ``extend_max_walltime`` (the hub runs scontrol:
        users cannot raise their own limit); the job's new limit and end. The policy refuses first, before any
        question to Slurm; then the job's record as it is now (the cycle's query may predate the last extend)."""
        options = self._options or (await asyncio.to_thread(self._valid))[0]  # a hub restarted since its start
        allowed(self.extend_max_walltime, options.partition)
        info = await self.queries.fresh_job_info(self.job_id) or {}
        if info.get("JobState") != "RUNNING":
            raise HPCAIError(f"job {self.job_id} is not running ({info.get('JobState', 'gone')})",
                             "only a running notebook job can be extended")
        found = await asyncio.to_thread(self.queries.fresh_associations, self.user.name)  # no answer: refused
        account = found.account((options.account or info.get("Account", "")).lower()) if found else None
        # the QOS the job was submitted with: the user's, else the site's, else the account's default
        submitted_qos = options.qos or self._site_qos() or (account.default_qos if account else "")
        if changed := as_submitted(info, options, self.user.name, submitted_qos):
            # its owner changed it (scontrol update Partition=, NumNodes=, Account=, QOS= while pending, or a script
            # swapped in sbatch's stdin), or it is not this user's job: the policy was decided for the job submitted
            raise HPCAIError(f"job {self.job_id} is not the job the hub submitted for {self.user.name}: "
                             + "; ".join(changed), "only a notebook job as the hub submitted it can be extended")
        partition, old = options.partition, parse_duration(info.get("TimeLimit", "")) or 0
        limits = (await self.current_limits()).get(partition)
        # the job's own QOS, read now: an accounting that does not answer refuses the extension (HPCAIError)
        name = info.get("QOS", "")
        qos = (await asyncio.to_thread(scheduler.qos_limits, [name] if name else [])).get(name)
        wanted = new_limit(self.extend_max_walltime, partition, old, seconds, limits.max_walltime if limits else None,
                           qos)
        remaining = seconds_until(info.get("EndTime", "")) or 0
        within_budget(account, options.nodes * options.gpus_per_node, remaining, wanted - old)
        limit = format_duration(wanted)
        await self.run_command(scheduler.set_time_limit(self.job_id, limit))
        self.log.info("Extended job %s of %s by %s s to %s", self.job_id, self.user.name, seconds, limit)
        # the end moves by what the limit grew (Slurm's EndTime: the start, the limit and any time suspended)
        return {"job_id": self.job_id, "time_limit": limit,
                "end_time": later(info.get("EndTime", ""), wanted - old)}


def as_submitted(info: dict[str, str], options: SpawnOptions, user: str, qos: str = "") -> list[str]:
    """How the scheduler's record of a job differs from the job the hub submitted for ``user`` with ``options`` (its
    owner, partition, nodes, GPUs per node, account and ``qos``, the QOS it was submitted with where known); nothing
    when it is that job."""
    wanted = {"owner": user, "partition": options.partition, "nodes": str(options.nodes),
              "GPUs per node": str(options.gpus_per_node), "account": options.account or info.get("Account", ""),
              "QOS": qos or info.get("QOS", "")}
    found = {"owner": info.get("UserName", ""), "partition": info.get("Partition", ""),
             "nodes": info.get("NumNodes", ""), "GPUs per node": str(scheduler.gres_gpus(info.get("TresPerNode", ""))),
             "account": info.get("Account", ""), "QOS": info.get("QOS", "")}
    # Slurm keeps account names in lower case
    return [f"{what} {found[what] or '(none)'}, submitted {wanted[what]}" for what in wanted
            if found[what].lower() != wanted[what].lower()]
