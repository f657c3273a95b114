"""What the project asks of a scheduler: the members an implementation (a module, e.g. ``slurm``) provides, and the
types and words they answer in. Standard library only: a rank imports it too.

A job's record is a dict under the keys of ``RECORD_KEYS``, its state one of Slurm's words (PENDING, RUNNING,
COMPLETED...: ``TERMINAL_STATES`` are the ends), its times ``YYYY-MM-DDTHH:MM:SS`` and its time limit in
``durations``' format: an implementation for another scheduler translates its own into these, as batchspawner's
``state_ispending`` does. Values the callers read further: ``ExitCode`` is ``code:signal``; ``TresPerNode`` holds
the GPUs per node as ``gres_gpus`` reads them; ``NodeList`` is a hostlist ``expand_hostlist`` reads; ``BatchHost``
is a node name ``node_address`` takes; ``Reason`` is Slurm's word for why a job waits (spawner/progress.py's
``REASONS`` says them in words).

A member a scheduler cannot do raises ``errors.HPCAIError`` with a hint, as a missing command does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

T = TypeVar("T")

# A record's keys, in the order an implementation may read them in: the two a user may set freely (Account, where
# a site keeps no accounting, and StdOut, a path) come last, so that a separator in them moves nothing before them.
RECORD_KEYS = ("JobId", "JobState", "UserName", "Partition", "TimeLimit", "StartTime", "EndTime", "NodeList",
               "BatchHost", "ExitCode", "SubmitTime", "NumNodes", "TresPerNode", "Dependency", "Reason", "QOS",
               "Account", "StdOut")
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
     "REVOKED", "SPECIAL_EXIT"}
)
_USABLE_STATES = {"idle", "mixed", "allocated", "completing"}  # node states: it answers and can run jobs


@dataclass(frozen=True)
class Node:
    """One node of the cluster."""

    name: str
    state: str  # long form, e.g. "idle", "mixed", "down*"
    partitions: tuple[str, ...]
    cpus: int
    gpus: int

    @property
    def usable(self) -> bool:
        """True when the node responds and accepts work."""
        return self.state in _USABLE_STATES


@dataclass(frozen=True)
class Partition:
    """A partition (a queue) with what it can run now and at most."""

    name: str
    nodes: int
    idle_nodes: int
    gpus_per_node: int
    idle_gpus: int
    max_time: int | None  # seconds; None for no limit
    default: bool = False


@dataclass(frozen=True)
class Qos:
    """A quality of service: the limits it sets on each job and each user (None: none)."""

    name: str
    max_time: int | None = None  # seconds a job may run
    max_gpus_per_user: int | None = None  # over all of a user's running jobs
    max_jobs_per_user: int | None = None


@dataclass(frozen=True)
class Account:
    """One of a user's accounts (projects), as their associations with it allow."""

    name: str
    partitions: tuple[str, ...] = ()  # where the user may run with it; empty: every partition
    qos: tuple[str, ...] = ()  # the QOS allowed; empty: the site's default only
    default_qos: str = ""
    gpu_minutes: int | None = None  # the project's GPU budget (GrpTRESMins), None: none
    gpu_minutes_used: int = 0

    @property
    def gpu_hours_left(self) -> float | None:
        return None if self.gpu_minutes is None else max(0, self.gpu_minutes - self.gpu_minutes_used) / 60


@dataclass(frozen=True)
class Associations:
    """What a user may run under: their accounts (the default first) and the QOS those name."""

    user: str
    accounts: tuple[Account, ...]
    qos: Mapping[str, Qos]

    @property
    def default(self) -> Account | None:
        return self.accounts[0] if self.accounts else None

    def account(self, name: str) -> Account | None:
        return next((a for a in self.accounts if a.name == name), None)


@dataclass(frozen=True)
class JobEnd:
    """How a job ended, from the scheduler's accounting: its state, and where it matters, the step that decided it."""

    job_id: str
    state: str  # one of TERMINAL_STATES
    exit_code: str  # code:signal
    elapsed: int  # seconds
    nodes: str  # a hostlist
    requested_memory: str = ""  # e.g. "8G"; "" when unknown
    peak_memory: str = ""  # the highest resident memory of any step, e.g. "1805568K"
    failed_node: str = ""  # the node of the step that ran out of memory or failed
    cancelled_by: str = ""  # the user name of who cancelled it, for CANCELLED
    owner: str = ""


class JobEnvironment(Protocol):
    """A job as a process inside it sees it: the scheduler's variables, by what they mean (a module of names)."""

    JOB_ID: str
    NODE_NAME: str
    PARTITION: str
    ACCOUNT: str
    NODES: tuple[str, ...]  # the job's nodes, as a hostlist; the first set wins
    NUM_NODES: tuple[str, ...]  # the job's node count; the first set wins
    TASKS: str
    RANK: str
    LOCAL_RANK: str
    NODE_INDEX: str
    STEP_NODES: str
    CPUS_PER_TASK: str
    CPUS_ON_NODE: str
    CONFIG: str  # where the client commands find the cluster: passed on to every job
    PREFIXES: tuple[str, ...]  # name prefixes of a job's own variables: none belongs in another job's
    STEP_PLACES: tuple[str, ...]  # what a step's task reads of its place (ranks/local.py clears them)

    def job_id(self, env: Mapping[str, str]) -> str | None: ...  # the job ``env`` is in; None outside one
    def node_name(self, env: Mapping[str, str]) -> str: ...  # this node's name as the scheduler knows it
    def first(self, env: Mapping[str, str], names: tuple[str, ...], default: str = "") -> str: ...  # first set
    def end_time(self, env: Mapping[str, str]) -> float | None: ...  # the end set at the job's start, if said
    def tasks_per_node(self, env: Mapping[str, str]) -> list[int]: ...  # ranks on each of the job's nodes
    def gpus_on_node(self, env: Mapping[str, str]) -> int | None: ...  # None: the job says nothing of GPUs
    # a kernel enters a job of its own as salloc would: its variables set in ``env``; the old values returned,
    # for ``leave`` to put back
    def enter(self, env: MutableMapping[str, str], job: str, nodelist: str, partition: str, tasks_per_node: int,
              nodes: int, account: str = "") -> dict[str, str]: ...
    def leave(self, env: MutableMapping[str, str], entered: Mapping[str, str]) -> None: ...
    def narrow(self, env: MutableMapping[str, str], nodelist: str, nodes: int, tasks: int) -> None: ...  # shrunk


class ContainerClient(Protocol):
    """The host's scheduler client inside a container: what to bind, and what the wrappers that run it there read."""

    HOST_BIN: str  # the folder of wrappers, inside the container

    def client_paths(self, environ: dict[str, str] | None = None) -> list[str]: ...  # the client's files on the host
    def host_client_binds(self) -> list[str]: ...  # udocker --volume values: the wrappers, programs and libraries
    def host_client_environ(self) -> dict[str, str]: ...  # variables the wrappers read inside


class SiteFacts(Protocol):
    """Where a caller keeps the site's facts (the same for every user) between users: ``get`` returns what ``make``
    made for ``key``, made again once it is older than the keeper's time to live."""

    def get(self, key: tuple[str, ...], make: Callable[[], T]) -> T: ...


class Scheduler(Protocol):
    """One scheduler. Where a member returns an argument list, its caller runs it (as the user, with their
    environment); ``env`` is the environment a command runs with (None: this process's)."""

    NAME: str
    environment: JobEnvironment
    client: ContainerClient

    # -- the hub: submit, cancel, extend, records, partitions, the controller ------------------------------------
    COMMANDS: tuple[str, ...]  # every client command of the scheduler's the project runs (the hub counts them)
    SUBMITTERS: tuple[str, ...]  # the commands the hub runs as each user (submit, test a submission, cancel)
    PING: tuple[str, ...]  # whether the controller answers

    # submits (``args``: the options from job_options, or a script's path; ``script``: a script on stdin): its id
    def submit(self, args: list[str], env: Mapping[str, str] | None = None, timeout: float = 30,
               script: str | None = None) -> int: ...
    def test_only(self, args: Sequence[str]) -> list[str]: ...  # the test of a submission with these options
    def test_script(self) -> list[str]: ...  # the test of a script read from stdin
    def expected_start(self, answer: str) -> float | None: ...  # a test's stdout and stderr: when (epoch seconds)
    def cancel_argv(self, job: int | str, *, user: str = "", name: str = "") -> list[str]: ...  # only if user's/named
    def set_time_limit(self, job: int | str, limit: str) -> str: ...  # a command line (batchspawner's run_command)
    # a job's record (the module's docstring), or None: the scheduler no longer knows the job
    def job_info(self, job_id: int | str, env: Mapping[str, str] | None = None) -> dict[str, str] | None: ...
    def jobs_info(self, job_ids: Sequence[int | str],  # one query for many; a job not in the answer is gone
                  env: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]: ...
    def user_jobs(self, user: str, env: Mapping[str, str] | None = None) -> list[str]: ...  # their job ids
    # the job's log, line by line, until the job ends: its exit code
    def follow_output(self, job_id: int | str, log: Path, on_line: Callable[[str], None],
                      poll: float = 0.5) -> int: ...
    def nodes(self, env: Mapping[str, str] | None = None) -> list[Node]: ...
    def version(self, env: Mapping[str, str] | None = None) -> tuple[int, int]: ...  # (major, minor), read once
    # what ``user`` may run under; None where the site keeps no accounting (any account text goes). ``site`` keeps
    # what is the same for every user (QOS limits, projects' budgets): a hub asks it once for all its users
    def associations(self, user: str, env: Mapping[str, str] | None = None,
                     site: SiteFacts | None = None) -> Associations | None: ...
    # the limits of each QOS named ({} where the site keeps no accounting); raises HPCAIError when it does not answer
    def qos_limits(self, names: list[str], env: Mapping[str, str] | None = None) -> dict[str, Qos]: ...
    # how a job that left the queue ended; None where the site keeps no accounting, or it does not know the job
    def job_end(self, job_id: int | str, env: Mapping[str, str] | None = None) -> JobEnd | None: ...
    # how ``user``'s jobs of the last ``days`` days that ended ended, the latest first; [] without accounting
    def recent_ends(self, user: str, days: int = 7, env: Mapping[str, str] | None = None) -> list[JobEnd]: ...
    def partitions(self, env: Mapping[str, str] | None = None) -> list[Partition]: ...
    # why jobs of different users may share a node of ``partition`` (the site check), or None
    def shared_between_users(self, partition: str, env: Mapping[str, str] | None = None) -> str | None: ...
    def node_address(self, name: str, env: Mapping[str, str] | None = None) -> str: ...  # where others reach it
    def node_addresses(self, names: list[str], env: Mapping[str, str] | None = None) -> dict[str, str]: ...
    def expand_hostlist(self, hostlist: str) -> list[str]: ...  # a record's NodeList: the node names
    def gres_gpus(self, gres: str) -> int: ...  # a record's TresPerNode: GPUs per node

    # -- batch scripts: their header and the lines that know the job -----------------------------------------------
    JOB_ID_IN_SHELL: str  # the job's id, in its batch shell
    JOB_ID_IN_ENVIRON: str  # a /proc/PID/environ line that makes a process this job's
    WHOLE_ENVIRONMENT: str  # the line after which the job's steps get the whole environment of what starts them
    DEFAULT_OUTPUT: str  # where a job's output goes when its script does not say ("%j": its id)
    TASK_ENDED: str  # a regular expression: how a step says one of its tasks ended

    def job_options(self, fields: Mapping[str, str | int], extra: Sequence[str]) -> list[str]: ...
    def header(self, options: Sequence[str]) -> list[str]: ...
    def node_address_in_shell(self, node: str = ...) -> str: ...
    def export_node_addresses(self, variable: str) -> list[str]: ...
    def rank_launch(self, nodes: int, ranks_per_node: int, argv: Sequence[str], *, survive: bool = False,
                    output: str | None = None) -> str: ...

    # -- a kernel in a job: steps beside its own, a job of its own, nodes given back --------------------------------
    def step(self, *, nodes: int, tasks: int | None = None, per_node: int | None = None,
             nodelist: Sequence[str] = (), mpi: bool = False, survive: bool = False, label: bool = False,
             output: str | None = None, time: str | None = None) -> list[str]: ...
    def job_of_its_own(self, fields: Mapping[str, str | int]) -> list[str]: ...
    def narrow_argv(self, job: int | str, nodes: Sequence[str]) -> list[str]: ...
