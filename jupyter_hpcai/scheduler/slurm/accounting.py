"""What Slurm's accounting (slurmdbd) knows: a user's associations with their limits and budgets, and how a job
ended. Every answer comes from fixed fields in ``-P`` (parsable) output; none of them is text a user can write.
Where the site keeps no accounting, both say None."""

from __future__ import annotations

import pwd
import re
import time
from collections.abc import Mapping

from ...errors import HPCAIError
from ...proc import run
from ..durations import parse_duration
from ..interface import TERMINAL_STATES, Account, Associations, JobEnd, Qos, SiteFacts

NO_ACCOUNTING = re.compile(r"accounting_storage/none|not running a supported accounting_storage plugin|"
                           r"Slurm accounting storage is disabled", re.I)
GPU = "gres/gpu"


def _parsable(argv: list[str], env: Mapping[str, str] | None) -> list[list[str]] | None:
    """The rows of a ``-nP`` answer, or None where the site keeps no accounting."""
    done = run(argv, env=env, check=False, timeout=30)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        if NO_ACCOUNTING.search(said):
            return None
        raise HPCAIError(f"{argv[0]} could not ask Slurm's accounting: {said[-300:]}",
                         "check that slurmdbd runs and answers (sacctmgr show cluster)")
    return [line.split("|") for line in done.stdout.splitlines() if line.strip()]


def _tres(text: str, name: str) -> str | None:
    """The value of ``name`` in a TRES list such as ``cpu=4,gres/gpu=2``."""
    return next((v for k, _, v in (i.partition("=") for i in text.split(",")) if k == name), None)


def qos_limits(names: list[str], env: Mapping[str, str] | None = None) -> dict[str, Qos]:
    """The limits of each QOS named."""
    if not names:
        return {}
    rows = _parsable(["sacctmgr", "-nP", "show", "qos", ",".join(names), "format=Name,MaxWall,MaxTRESPU,MaxJobsPU"],
                     env) or []
    found = {}
    for name, wall, per_user, jobs in (r[:4] for r in rows if len(r) >= 4):
        gpus = _tres(per_user, GPU)
        found[name] = Qos(name, parse_duration(wall) if wall else None, int(gpus) if gpus else None,
                          int(jobs) if jobs else None)
    return found


def _budgets(accounts: list[str], env: Mapping[str, str] | None) -> dict[str, tuple[int, int]]:
    """Each of ``accounts`` with a GPU budget: (limit, used) in GPU minutes, from sshare's fixed fields (the
    project's own row: its GrpTRESMins, and its usage, GrpTRESRaw, in TRES minutes)."""
    rows = _parsable(["sshare", "-nP", f"--accounts={','.join(accounts)}", "--format=Account,User,GrpTRESMins,"
                      "GrpTRESRaw"], env) or []
    budgets = {}
    for account, user, limit, used in (r[:4] for r in rows if len(r) >= 4):
        gpus, usage = _tres(limit, GPU), _tres(used, GPU)
        if not user.strip() and gpus and gpus.isdigit():  # the project's own row, not a user's within it
            budgets[account.strip()] = (int(gpus), int(float(usage or 0)))
    return budgets


def associations(user: str, env: Mapping[str, str] | None = None,
                 site: SiteFacts | None = None) -> Associations | None:
    """What ``user`` may run under: accounts (default first) with their partitions, QOS and GPU budget. The QOS
    limits and the budgets are the site's: kept in ``site`` where given, for the other users who ask."""
    rows = _parsable(["sacctmgr", "-nP", "show", "user", "where", f"name={user}", "withassoc",
                      "format=DefaultAccount,Account,Partition,QOS,DefaultQOS"], env)
    if rows is None:
        return None
    by_account: dict[str, dict[str, set[str] | str]] = {}
    default = ""
    for default_account, account, partition, qos, default_qos in (r[:5] for r in rows if len(r) >= 5):
        default = default_account
        entry = by_account.setdefault(account, {"partitions": set(), "qos": set(), "default_qos": default_qos})
        entry["partitions"].add(partition)  # type: ignore[union-attr]
        entry["qos"].update(q for q in qos.split(",") if q)  # type: ignore[union-attr]
    keep = site.get if site else (lambda _key, make: make())
    projects = sorted(by_account)
    budgets = keep(("budgets", *projects), lambda: _budgets(projects, env)) if by_account else {}
    accounts = []
    for name in sorted(by_account, key=lambda a: (a != default, a)):
        entry = by_account[name]
        partitions = entry["partitions"]
        limit, used = budgets.get(name, (None, 0))
        accounts.append(Account(name, () if "" in partitions else tuple(sorted(partitions)),  # type: ignore[arg-type]
                                tuple(sorted(entry["qos"])), str(entry["default_qos"]), limit, used))
    named = sorted({q for a in accounts for q in a.qos})
    return Associations(user, tuple(accounts), keep(("qos", *named), lambda: qos_limits(named, env)))


def _memory(tres: str) -> str:
    """The memory a job asked for, from its requested TRES (``cpu=1,mem=300M,node=1``): "" where it says none (a
    record slurmctld has not finished sending to slurmdbd says odd things there)."""
    memory = _tres(tres, "mem") or ""
    return memory if re.fullmatch(r"[\d.]+[KMGTP]?", memory) else ""


def _in_units(kib: float) -> str:
    """``1.7G``, ``300M``; "" for none."""
    return "" if not kib else f"{kib / 1024 ** 2:.1f}G" if kib >= 1024 ** 2 else f"{kib / 1024:.0f}M"


def _kib(memory: str) -> float:
    """sacct's memory (``1805568K``, ``8G``, ``300M``, ``4000Mn``) in KiB; 0 when empty."""
    found = re.match(r"([\d.]+)([KMGT]?)", memory)
    if not found:
        return 0
    return float(found.group(1)) * 1024 ** "KMGT".index(found.group(2) or "K")


END_FIELDS = "--format=JobID,State,ExitCode,ElapsedRaw,NodeList,ReqTRES,MaxRSS,User"


def job_end(job_id: int | str, env: Mapping[str, str] | None = None, settle: float = 5.0) -> JobEnd | None:
    """How job ``job_id`` ended: its state, and the step that ran out of memory, the peak memory, who cancelled it.
    A job that ends within a second of its start can be listed as ended before slurmdbd has its start record (no
    requested TRES yet): that record is read again for up to ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while True:
        rows = _parsable(["sacct", "-nP", "-j", str(job_id), END_FIELDS], env) or []
        end = _ended(str(job_id), rows)
        recorded = any(r[0] == str(job_id) and len(r) >= 8 and r[5] for r in rows)
        if end is None or recorded or time.monotonic() >= deadline:
            return end
        time.sleep(0.5)


def recent_ends(user: str, days: int = 7, env: Mapping[str, str] | None = None) -> list[JobEnd]:
    """How ``user``'s jobs of the last ``days`` days that have ended ended, the latest first (one sacct)."""
    rows = _parsable(["sacct", "-nP", f"--user={user}", f"--starttime=now-{int(days)}days", END_FIELDS], env) or []
    jobs = [r[0] for r in rows if r[0].isdigit()]
    ends = (_ended(job, [r for r in rows if r[0] == job or r[0].startswith(f"{job}.")]) for job in reversed(jobs))
    return [end for end in ends if end is not None]


def _ended(job_id: str, rows: list[list[str]]) -> JobEnd | None:
    """A job's end from its sacct rows (the job's, then its steps'); None while it has not ended."""
    # the newest job of that id (sacct lists every job that had it, the oldest first: ids are reused)
    job = next((r for r in reversed(rows) if r[0] == job_id and len(r) >= 8), None)
    if job is None:
        return None
    state, _, by = job[1].partition(" by ")
    if state not in TERMINAL_STATES:
        return None
    steps = [r for r in rows if len(r) >= 8 and r[0].startswith(f"{job_id}.")]
    oom = next((r for r in steps if r[1] == "OUT_OF_MEMORY"), None)
    peak = max((_kib(r[6]) for r in steps), default=0)
    return JobEnd(job_id, "OUT_OF_MEMORY" if oom else state, job[2], int(job[3] or 0), job[4], _memory(job[5]),
                  _in_units(peak), oom[4] if oom else "", _user_name(by.strip()), job[7])


def _user_name(uid: str) -> str:
    if not uid.isdigit():
        return uid
    try:
        return pwd.getpwuid(int(uid)).pw_name
    except KeyError:
        return uid
