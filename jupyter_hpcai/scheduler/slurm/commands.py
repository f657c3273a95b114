"""Slurm's commands: run, and their output parsed into the interface's types and records."""

from __future__ import annotations

import os
import re
import secrets
import string
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ...errors import HPCAIError
from ...proc import run
from . import versions
from .script import job_options
from ..durations import format_duration, parse_duration
from ..interface import RECORD_KEYS, TERMINAL_STATES, Node, Partition


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


def submit(args: list[str], env: Mapping[str, str] | None = None, timeout: float = 30,
           script: str | None = None) -> int:
    """Submit a job (``args`` are sbatch's options, then a script path, or ``script`` on stdin); return its id."""
    out = run(["sbatch", "--parsable", *args], env=env, timeout=timeout, input=script).stdout.strip()
    return int(out.split(";")[0])


# A job's record from squeue's fixed fields, under scontrol's names. None of them is text the job's owner can
# write (Comment, JobName, WorkDir are never asked for). The two a user may set freely come last: Account (free
# text where the site keeps no accounting) and StdOut (a path): a '|' in either moves only what follows it, which
# the hub decides nothing on (StdOut is read as the user); no value can add a field or move another before them.
JOB_FIELDS = tuple(zip(RECORD_KEYS, ("JobID", "State", "UserName", "Partition", "TimeLimit", "StartTime", "EndTime",
                                    "NodeList", "BatchHost", "exit_code", "SubmitTime", "NumNodes", "tres-per-node",
                                    "Dependency", "Reason", "qos", "Account", "STDOUT"), strict=True))
_NONE = ("N/A", "n/a", "(null)", "Unknown", "NONE")


def parse_job_line(line: str) -> dict[str, str]:
    """One record of ``squeue --Format`` with JOB_FIELDS, each ending in ``|`` (StdOut last, taken whole, line
    breaks included: ``jobs_info`` ends each record with a word of its own query)."""
    values = line.removesuffix("|").split("|", len(JOB_FIELDS) - 1)
    if len(values) != len(JOB_FIELDS):
        raise HPCAIError(f"squeue printed a line that is not a job record: {line[:200]!r}", "check the Slurm client")
    info = {key: "" if value.strip() in _NONE else value.strip() for (key, _), value in zip(JOB_FIELDS, values)}
    info["StdOut"] = versions.expand_output(info["StdOut"], info["JobId"], info["UserName"])
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
    # Each record ends with a word of this query's own, not with its line: a job's owner may put a line break in
    # its StdOut (scontrol update StdOut=), and the line after it would read as another job's record
    end = "|" + "".join(secrets.choice(string.ascii_letters) for _ in range(24))
    fields = [f"{field}:|" for _, field in JOB_FIELDS[:-1]] + [f"{JOB_FIELDS[-1][1]}:{end}"]  # no width: never cut
    argv = ["squeue", "--noheader", "--states=all", f"--jobs={','.join(str(int(j)) for j in job_ids)}",
            f"--Format={','.join(fields)}"]
    done = run(argv, env=env, check=False, timeout=30)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # none of them is known any more
            return {}
        run(argv, env=env, timeout=30)  # raises with the message
    records = (parse_job_line(chunk.removeprefix("\n")) for chunk in done.stdout.split(end) if chunk.strip())
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


def shared_between_users(partition: str, env: Mapping[str, str] | None = None) -> str | None:
    """How ``partition`` lets jobs of several users share a node (its settings, in Slurm's words), or None where
    each node runs one user's jobs at a time (ExclusiveUser=YES, or OverSubscribe=EXCLUSIVE)."""
    out = run(["scontrol", "show", "partition", partition, "--oneliner"], env=env, timeout=30).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)  # the admin's settings: no user writes here
    user, over = fields.get("ExclusiveUser", "NO"), fields.get("OverSubscribe", "NO")
    return None if user == "YES" or over.startswith("EXCLUSIVE") else f"ExclusiveUser={user}, OverSubscribe={over}"


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


# --- the commands this project runs, as argument lists (run by their callers: as the user, with their env) ---------
# every client command of Slurm's this project runs (the hub counts its calls by these names)
COMMANDS = ("sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun", "sacct", "sacctmgr", "sshare")
SUBMITTERS = ("sbatch", "scancel")  # what the hub runs as each user: submit, test a submission, cancel
PING = ("scontrol", "ping")  # whether the controller answers


def test_only(args: Sequence[str]) -> list[str]:
    """A submission's test (sbatch --test-only) with ``args``: what the scheduler would do, nothing submitted."""
    return ["sbatch", "--test-only", *args, "--wrap", "true"]


def test_script() -> list[str]:
    """The test of a job script read from stdin (sbatch --test-only): what the scheduler would do with it."""
    return ["sbatch", "--test-only"]


def cancel_argv(job: int | str, *, user: str = "", name: str = "") -> list[str]:
    """Cancel ``job``; only if it is ``user``'s and named ``name``, where given (an id given out again is spared)."""
    return ["scancel", *([f"--user={user}"] if user else []), *([f"--name={name}"] if name else []), str(job)]


def set_time_limit(job: int | str, limit: str) -> str:
    """The command (one line, for batchspawner's run_command) that sets ``job``'s time limit to ``limit``."""
    return f"scontrol update JobId={int(job)} TimeLimit={limit}"


def narrow_argv(job: int | str, nodes: Sequence[str]) -> list[str]:
    """Give a running job's other nodes back: keep ``nodes`` only (as its owner)."""
    return ["scontrol", "update", f"JobId={job}", f"NodeList={','.join(nodes)}"]


def step(*, nodes: int, tasks: int | None = None, per_node: int | None = None, nodelist: Sequence[str] = (),
         mpi: bool = False, survive: bool = False, label: bool = False, output: str | None = None,
         time: str | None = None) -> list[str]:
    """A step in the current job beside its others (its CPUs shared: the kernel's own step keeps its own), its
    tasks in block order, up to its command; outside a job, a job of its own (``time``: its limit). ``mpi``: its
    tasks are MPI ranks (PMIx: Debian's Open MPI has no PMI2); ``survive``: a task's end leaves the others running;
    ``label``: each output line says its task; ``output``: each task's output to this file ("{rank}": its rank)."""
    return ["srun", f"--mpi={'pmix' if mpi else 'none'}", "--overlap", f"--nodes={nodes}",
            *versions.cpus_per_task(os.environ),
            *([f"--ntasks={tasks}"] if tasks else []), *([f"--ntasks-per-node={per_node}"] if per_node else []),
            *([f"--nodelist={','.join(nodelist)}"] if nodelist else []), "--distribution=block",
            *(["--kill-on-bad-exit=0", "--no-kill"] if survive else []), *(["--label"] if label else []),
            *([f"--output={output.replace('{rank}', '%t')}"] if output else []), *([f"--time={time}"] if time else [])]


def job_of_its_own(fields: Mapping[str, str | int]) -> list[str]:
    """A job that runs one command and waits for it (srun outside a job), ``fields`` as ``job_options``'."""
    return ["srun", *job_options(fields, ())]


def user_jobs(user: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The ids of ``user``'s jobs in the queue (or of every job, for ``user`` "")."""
    return run(["squeue", "--noheader", *([f"--user={user}"] if user else []), "--format=%i"], env=env,
               timeout=30, check=False).stdout.split()
