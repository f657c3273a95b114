"""A start's options checked against the user's associations (runs in the hub): an account they belong to (their
default when they name none), a partition and a QOS it allows, within the QOS's limits and the project's GPU hours
left. Where the site keeps no accounting there are no associations, and nothing here applies."""

from __future__ import annotations

from ..scheduler.durations import format_duration
from ..scheduler.interface import Account, Associations, Qos


def filled(values: dict[str, object], found: Associations | None, site_qos: str) -> dict[str, object]:
    """``values`` with the account and QOS the job will run under written in: the user's default account and its
    default QOS where they chose none (the site's QOS, where the site sets one, is written by the site); the account
    in lower case, as Slurm keeps it."""
    if found is None or found.default is None:
        return values
    name = str(values.get("account") or found.default.name).lower()  # Slurm keeps account names in lower case
    account = found.account(name)
    values = {**values, "account": name}
    if not values.get("qos") and not site_qos and account and account.default_qos:
        values["qos"] = account.default_qos
    return values


def problems(account: str, qos: str, partition: str, nodes: int, gpus_per_node: int, seconds: int,
             found: Associations, site_qos: str) -> dict[str, str]:
    """Field -> what is wrong, for a job of these values under ``found``."""
    if not found.accounts:
        return {"account": f"{found.user} has no association in the site's accounting, so no job of theirs can run: "
                           "ask the site's admins for one"}
    chosen = found.account(account)
    if chosen is None:
        yours = ", ".join(a.name for a in found.accounts)
        return {"account": f"you have no association with account '{account}' (yours: {yours})"}
    errors = {}
    if chosen.partitions and partition not in chosen.partitions:
        errors["partition"] = f"account {account} may run on {', '.join(chosen.partitions)} only"
    if site_qos and qos and qos != site_qos:
        errors["qos"] = f"the site runs every server under QOS {site_qos}"
    qos = site_qos or qos
    if qos and chosen.qos and qos not in chosen.qos:
        errors["qos"] = f"account {account} may use QOS {', '.join(chosen.qos)}, not '{qos}'"
    limit = found.qos.get(qos)
    gpus = nodes * gpus_per_node
    if limit and "qos" not in errors:
        if limit.max_time and seconds > limit.max_time:
            errors["walltime"] = f"longer than {format_duration(limit.max_time)}, the limit of QOS {qos}"
        if limit.max_gpus_per_user is not None and gpus > limit.max_gpus_per_user:
            errors["gpus_per_node"] = f"{gpus} GPUs in all is more than the {limit.max_gpus_per_user} QOS {qos} " \
                                      "allows a user"
    left = chosen.gpu_hours_left
    if left is not None and gpus and gpus * seconds / 3600 > left:
        errors["account"] = (f"this job may use {gpus * seconds / 3600:.1f} GPU hours; project {account} has "
                             f"{left:.1f} left")
    return errors


def describe_account(account: Account) -> str:
    """One line for the form: where an account runs, under which QOS, and its GPU hours left."""
    parts = [f"partitions: {', '.join(account.partitions) or 'all'}",
             f"QOS: {', '.join(account.qos) or 'the default'}"]
    if account.gpu_hours_left is not None:
        parts.append(f"GPU hours left: {account.gpu_hours_left:.1f} of {(account.gpu_minutes or 0) / 60:.0f}")
    return "; ".join(parts)


def describe_qos(qos: Qos) -> str:
    """One line for the form: a QOS's limits."""
    parts = [f"max time {format_duration(qos.max_time)}" if qos.max_time else "no time limit of its own"]
    if qos.max_gpus_per_user is not None:
        parts.append(f"at most {qos.max_gpus_per_user} GPUs per user")
    if qos.max_jobs_per_user is not None:
        parts.append(f"at most {qos.max_jobs_per_user} jobs per user")
    return ", ".join(parts)
