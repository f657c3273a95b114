"""Slurm as data: the scheduler's commands run and their output parsed."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import HPCAIError
from .proc import run

# Long node states that mean the node answers and can run (or is running) jobs.
_USABLE_STATES = {"idle", "mixed", "allocated", "completing"}


@dataclass(frozen=True)
class Node:
    """One node as sinfo reports it."""

    name: str
    state: str  # long form, e.g. "idle", "mixed", "down*"
    partitions: tuple[str, ...]
    cpus: int
    gpus: int

    @property
    def usable(self) -> bool:
        """True when the node responds and accepts work."""
        return self.state in _USABLE_STATES


def gres_gpus(gres: str) -> int:
    """The GPU count in a gres string such as ``gpu:4``, ``gpu:a100:2(S:0-1)``, ``gres:gpu:2`` or ``gres/gpu:2`` (a
    job's TresPerNode, by Slurm version) or ``(null)``."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", re.sub(r"^gres[:/]", "", item.strip()))
        if m:
            total += int(m.group(1))
    return total


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist such as ``n[1-3,7],gpu[01-02]`` into node names."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
        if not m:
            names.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{i:0{width}d}{suffix}")
    return names


def nodes(env: Mapping[str, str] | None = None) -> list[Node]:
    """Every node of the cluster, one entry per node with all its partitions."""
    out = run(["sinfo", "--noheader", "--Node", "--format=%N|%T|%P|%c|%G"], env=env, timeout=30).stdout
    merged: dict[str, Node] = {}
    for line in out.splitlines():
        name, state, partition, cpus, gres = line.strip().split("|")
        partition = partition.rstrip("*")
        if name in merged:
            old = merged[name]
            merged[name] = Node(name, old.state, (*old.partitions, partition), old.cpus, old.gpus)
        else:
            merged[name] = Node(name, state.lower(), (partition,), int(cpus), gres_gpus(gres))
    return list(merged.values())


TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
     "REVOKED", "SPECIAL_EXIT"}
)


def sbatch(args: list[str], env: Mapping[str, str] | None = None, timeout: float = 30, script: str | None = None) -> int:
    """Submit a job (``args`` are sbatch's options, then a script path, or ``script`` on stdin); return its id."""
    out = run(["sbatch", "--parsable", *args], env=env, timeout=timeout, input=script).stdout.strip()
    return int(out.split(";")[0])


# A job's record from squeue's fixed fields, under scontrol's names. None of them is text the job's owner can
# write (Comment, JobName, WorkDir are never asked for). The two a user may set freely come last: Account (free
# text where the site keeps no accounting) and StdOut (a path): a '|' in either moves only what follows it, which
# the hub decides nothing on (StdOut is read as the user); no value can add a field or move another before them.
JOB_FIELDS = (("JobId", "JobID"), ("JobState", "State"), ("UserName", "UserName"), ("Partition", "Partition"),
              ("TimeLimit", "TimeLimit"), ("StartTime", "StartTime"), ("EndTime", "EndTime"), ("NodeList", "NodeList"),
              ("BatchHost", "BatchHost"), ("ExitCode", "exit_code"), ("SubmitTime", "SubmitTime"),
              ("NumNodes", "NumNodes"), ("TresPerNode", "tres-per-node"), ("Dependency", "Dependency"),
              ("Reason", "Reason"), ("Account", "Account"), ("StdOut", "STDOUT"))
_NONE = ("N/A", "n/a", "(null)", "Unknown", "NONE")


def parse_job_line(line: str) -> dict[str, str]:
    """One line of ``squeue --Format`` with JOB_FIELDS, each ending in ``|`` (StdOut last, taken whole)."""
    values = line.removesuffix("|").split("|", len(JOB_FIELDS) - 1)
    if len(values) != len(JOB_FIELDS):
        raise HPCAIError(f"squeue printed a line that is not a job record: {line[:200]!r}", "check the Slurm client")
    info = {key: "" if value.strip() in _NONE else value.strip() for (key, _), value in zip(JOB_FIELDS, values)}
    info["StdOut"] = info["StdOut"].replace("%j", info["JobId"]).replace("%u", info["UserName"])
    if (limit := parse_duration(info["TimeLimit"])) is not None:  # as scontrol writes it: 01:00:00, 1-00:00:00
        info["TimeLimit"] = format_duration(limit)
    if info["ExitCode"].isdigit():  # squeue's is the raw wait status: as scontrol's "exit:signal"
        status = int(info["ExitCode"])
        info["ExitCode"] = f"{status >> 8}:{status & 0x7F}"
    return info


def job_info(job_id: int | str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """Slurm's record of a job (JOB_FIELDS), or None once Slurm has forgotten it."""
    return jobs_info([job_id], env).get(str(int(job_id)))


def jobs_info(job_ids: Sequence[int | str], env: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """Slurm's records of the jobs it still knows of ``job_ids`` (JOB_FIELDS), by job id, from one squeue."""
    if not job_ids:
        return {}
    fmt = ",".join(f"{field}:|" for _, field in JOB_FIELDS)  # with a suffix and no width: never cut to 20
    argv = ["squeue", "--noheader", "--states=all", f"--jobs={','.join(str(int(j)) for j in job_ids)}",
            f"--Format={fmt}"]
    done = run(argv, env=env, check=False, timeout=30)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # none of them is known any more
            return {}
        run(argv, env=env, timeout=30)  # raises with the message
    records = (parse_job_line(line.rstrip("\n")) for line in done.stdout.splitlines() if line.strip())
    return {record["JobId"]: record for record in records}


def node_address(name: str, env: Mapping[str, str] | None = None) -> str:
    """The address Slurm reaches a node at (NodeAddr), which its other nodes can reach too."""
    return node_addresses([name], env)[name]


def node_addresses(names: list[str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each node's NodeAddr, in one sinfo call (a node without one: its name)."""
    out = run(["sinfo", "--noheader", "--Node", f"--nodes={','.join(names)}", "--format=%N|%o"], env=env,
              timeout=30).stdout
    found = dict(line.strip().split("|", 1) for line in out.splitlines() if "|" in line)
    return {name: found.get(name) or name for name in names}


@dataclass(frozen=True)
class Partition:
    """A partition with what it can run now and at most."""

    name: str
    nodes: int
    idle_nodes: int
    gpus_per_node: int
    idle_gpus: int
    max_time: int | None  # seconds; None for no limit
    default: bool = False


def shared_between_users(partition: str, env: Mapping[str, str] | None = None) -> str | None:
    """How ``partition`` lets jobs of several users share a node (its settings, in Slurm's words), or None where
    each node runs one user's jobs at a time (ExclusiveUser=YES, or OverSubscribe=EXCLUSIVE)."""
    out = run(["scontrol", "show", "partition", partition, "--oneliner"], env=env, timeout=30).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)  # the admin's settings: no user writes here
    user, over = fields.get("ExclusiveUser", "NO"), fields.get("OverSubscribe", "NO")
    return None if user == "YES" or over.startswith("EXCLUSIVE") else f"ExclusiveUser={user}, OverSubscribe={over}"


def parse_duration(text: str) -> int | None:
    """Slurm's time format (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in seconds; None for UNLIMITED."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def _gpu_used(gres_used: str) -> int:
    return gres_gpus(re.sub(r"\(IDX:[^)]*\)", "", gres_used))


def partitions(env: Mapping[str, str] | None = None) -> list[Partition]:
    """Every partition, from one sinfo call (per node: state, GPUs and GPUs in use)."""
    out = run(["sinfo", "--noheader", "--Node", "--Format=NodeList:|,Partition:|,StateLong:|,Gres:|,GresUsed:|,Time:|"],
              env=env, timeout=30).stdout
    rows: dict[str, list[tuple[str, str, int, int, str]]] = {}
    for line in out.splitlines():
        node, part, state, gres, used, limit, *_ = (f.strip() for f in line.split("|"))
        rows.setdefault(part, []).append((node, state.lower(), gres_gpus(gres), _gpu_used(used), limit))
    result = []
    for part, nodes in rows.items():
        result.append(Partition(
            name=part.rstrip("*"), nodes=len(nodes), idle_nodes=sum(1 for n in nodes if n[1] == "idle"),
            gpus_per_node=max(n[2] for n in nodes),
            idle_gpus=sum(n[2] - n[3] for n in nodes if n[1] in ("idle", "mixed")),
            max_time=parse_duration(nodes[0][4]), default=part.endswith("*"),
        ))
    return result


def later(when: str, seconds: int) -> str:
    """Slurm's time ``when`` (``YYYY-MM-DDTHH:MM:SS``) ``seconds`` later, written as Slurm writes it; "" for none."""
    try:
        moved = time.mktime(time.strptime(when, "%Y-%m-%dT%H:%M:%S")) + seconds
    except ValueError:
        return ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(moved))


def format_duration(seconds: int) -> str:
    """Seconds as Slurm's ``D-HH:MM:SS`` (or ``HH:MM:SS`` under a day)."""
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


FORGOTTEN_AFTER = 5.0  # seconds a job must stay out of squeue's answers before it counts as forgotten: a loaded
# slurmctld once answered a running job's squeue with no job at all


def follow_output(job_id: int | str, log: Path, on_line: Callable[[str], None], poll: float = 0.5) -> int:
    """Pass each new line of a job's output file to ``on_line`` until the job ends; its exit status
    (1 for a job cancelled or timed out without one). A job Slurm has forgotten (FORGOTTEN_AFTER) before it was seen
    to end has no known outcome: that raises, it never counts as success."""
    offset, partial, missing_since = 0, "", None
    while True:
        info = job_info(job_id)
        if info is None:
            missing_since = missing_since or time.monotonic()
            if time.monotonic() - missing_since < FORGOTTEN_AFTER:  # not yet: ask again
                time.sleep(poll)
                continue
        else:
            missing_since = None
        if log.exists():
            with open(log, errors="replace") as out:
                out.seek(offset)
                chunk = out.read()
                offset = out.tell()
            *lines, partial = (partial + chunk).split("\n")
            for line in lines:
                on_line(line)
        if info is None:
            if partial:
                on_line(partial)
            raise HPCAIError(f"Slurm no longer knows job {job_id}, so its outcome is unknown (it ended and was purged, "
                             "or was never there)", f"read its output to see how it ended: {log}")
        if info.get("JobState") in TERMINAL_STATES:
            if partial:
                on_line(partial)
            code = int(info.get("ExitCode", "1:0").split(":")[0])
            return code or (1 if info["JobState"] != "COMPLETED" else 0)
        time.sleep(poll)


TEST_ONLY = re.compile(r"Job \d+ to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")


def expected_start(answer: str) -> float | None:
    """When ``sbatch --test-only`` says a job would start (epoch seconds), or None when it did not say."""
    found = TEST_ONLY.search(answer)
    return time.mktime(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S")) if found else None
