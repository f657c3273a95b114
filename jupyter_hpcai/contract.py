"""What crosses a process boundary: every HPCAI_* environment variable, which processes set it, which read it;
the server's proof of identity to the hub; and the files an engine set's kernel and ranks share (the set's folder
and its rank table).

Imported by every process (the hub, the job's server, kernels, ranks inside a container image): standard library
only, nothing from this package.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

# hub: JupyterHub with the spawner (or spawner_config/demo_config.py); job: the notebook job's batch script
# (spawner/script.py) and what it starts beside the server (the warm start, engines/warm.py); server: the Jupyter
# server in that job, and its kernel provisioner; kernel: the notebook's IPython kernel, or any process that starts
# engines as it does (the warm start, a benchmark job); rank: an engine or an exported job's rank, started by
# srun/mpirun; batch: an exported job's sbatch script (export.py); cli: `hpcai`; bench: the bench/ drivers;
# admin/user: a site or a person, in the environment; tests: tests/ and the dev cluster's plugin. Where the code of
# each runs: test_architecture.py's PROCESSES, which checks the rows against the code.
Process = Literal["hub", "job", "server", "kernel", "rank", "batch", "cli", "bench", "admin", "user", "tests"]


@dataclass(frozen=True)
class Variable:
    """One HPCAI_* variable: who sets it, who reads it, what its value is (and its default)."""

    name: str
    set_by: tuple[Process, ...]
    read_by: tuple[Process, ...]
    meaning: str


_ROWS = [
    # the notebook job: its batch script exports them to the server, and so to the kernel and the ranks
    Variable("HPCAI_ENV", ("job",), ("job", "tests"),
             "the profile's env name: the job's warm start finds the kernel's env by it (engines/warm.py); the "
             "server's kernel comes from --default_kernel_name"),
    Variable("HPCAI_JOB_STATE", ("job",), ("server", "kernel", "rank", "tests"),
             "the job's private folder ~/.hpcai/jobs/<job id>: walltime mark, engine pids; removed at the job's end"),
    Variable("HPCAI_WALLTIME_WARNING", ("job",), ("server", "kernel"),
             "seconds before the walltime at which Slurm signals the job; unset (0): no signal"),
    Variable("HPCAI_START_ENGINES", ("job",), ("job", "server", "kernel"),
             "1 (the profile's start_engines): the job's script starts one engine per GPU beside the server, the "
             "provisioner loads the extension with each kernel, and the first kernel takes the engines; else 0"),
    # kernel -> rank: set per engine set by engines/startup.py's launch (mpirun passes them with -x)
    Variable("HPCAI_NODE_ADDRS", ("kernel", "batch", "bench"), ("rank",),
             "every node's Slurm address, 'node=addr,...'; a rank finds its own by its node's name (else loopback)"),
    Variable("HPCAI_WARM", ("kernel",), ("rank",),
             "the framework the ranks initialise as they boot (horovod, torch); empty: none"),
    Variable("HPCAI_CONNECTION_FILE", ("kernel",), ("rank",),
             "the controller's engine connection file, which each rank waits for before the engine starts"),
    Variable("HPCAI_CONTROLLER_TIMEOUT", ("kernel",), ("rank",),
             "seconds a rank waits for the connection file: the start's timeout (180); 60 when unset"),
    Variable("HPCAI_RANK_FOLDER", ("kernel",), ("rank",),
             "the engine set's private folder, where each rank writes telemetry-<rank>.json and answers stack "
             "requests; unset: no telemetry, no stacks from the rank's own thread"),
    Variable("HPCAI_TELEMETRY_INTERVAL", ("kernel",), ("rank",),
             "seconds between a rank's telemetry samples (%hpc start --telemetry, default 2; 0: off)"),
    Variable("HPCAI_HOROVOD_RENDEZVOUS", ("kernel",), ("rank",),
             "addr:port of the Horovod (Gloo) rendezvous the kernel holds for the world; empty: Horovod over MPI"),
    Variable("HPCAI_HOROVOD_RANKS_PER_NODE", ("kernel",), ("rank",),
             "ranks on each node of the launch, in rank order ('2,2'): each rank's Horovod slot follows from it"),
    Variable("HPCAI_HOROVODRUN_HOSTS", ("bench",), ("rank",),
             "a Gloo baseline's ranks' nodes, in rank order ('n1,n1,n2'), for each rank's Horovod slot "
             "(bench/horovodrun.py)"),
    Variable("HPCAI_CONTAINER", ("server", "rank", "cli"), ("kernel",),
             "JSON ContainerLaunch of a container env's kernel: how ranks run in the same container; unset: none"),
    # the exported batch job (export.py): its script exports them to its ranks (ranks/batch.py)
    Variable("HPCAI_MASTER_ADDR", ("batch",), ("rank",), "torch's rendezvous address: the first node's Slurm address"),
    Variable("HPCAI_MASTER_PORT", ("batch",), ("rank",), "torch's rendezvous port: 20000 + job id % 20000"),
    # on the rank itself
    Variable("HPCAI_NODE_ADDR", ("rank",), ("rank", "tests"),
             "this rank's node address (from HPCAI_NODE_ADDRS), reported in rank_info"),
    Variable("HPCAI_NODE_GPUS", ("rank",), ("tests",),
             "the node's GPUs as Slurm gave them (comma-separated), before pin kept one in CUDA_VISIBLE_DEVICES"),
    Variable("HPCAI_RANK_OFFSET", ("kernel",), ("rank",),
             "in a grown job's ranks (%hpc grow): added to the launcher's rank, past the ranks already in the world"),
    Variable("HPCAI_WORLD_RANK", ("kernel",), ("rank",),
             "the rank in the world as the kernel last re-formed it (ranks/world.py assign); read before its launcher's"),
    Variable("HPCAI_WORLD_SIZE", ("kernel",), ("rank",), "the re-formed world's size (hpc.world_size())"),
    Variable("HPCAI_WORLD_LOCAL_RANK", ("kernel",), ("rank",), "the rank among the re-formed world's ranks on its node"),
    Variable("HPCAI_WORLD_LOCAL_SIZE", ("kernel",), ("rank",), "the re-formed world's ranks on this node"),
    Variable("HPCAI_RANK", ("kernel",), ("rank",),
             "the rank, if no launcher (Slurm, Open MPI, PMI) says it (the local launcher's, ranks/local.py)"),
    Variable("HPCAI_SIZE", ("kernel",), ("rank",),
             "the ranks in all, if no launcher says it (the local launcher's)"),
    Variable("HPCAI_LOCAL_RANK", ("kernel",), ("rank",),
             "the rank on its node, if no launcher says it (default 0)"),
    Variable("HPCAI_LOCAL_SIZE", ("kernel",), ("rank",),
             "ranks on this node, if no OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS (else Slurm's tasks per node)"),
    # site and user settings
    Variable("HPCAI_CONFIG", ("admin", "tests"), ("hub", "server", "kernel", "cli"),
             "the site config TOML (default /etc/jupyter-hpcai/config.toml); the hub passes it on (env_keep)"),
    Variable("HPCAI_ENV_PATH", ("admin", "user", "tests"), ("hub", "server", "kernel", "cli"),
             "the site's env roots, colon-separated (default: the config's envs.site_roots, else /opt/hpcai/envs)"),
    Variable("HPCAI_ENV_ROOT", ("user", "tests"), ("hub", "server", "kernel", "cli"),
             "the user's own env root, where builds go (default ~/.local/share/hpcai/envs)"),
    Variable("HPCAI_PRODUCT", ("admin", "user", "cli"), ("cli",),
             "what a recipe's ${HPCAI_PRODUCT} installs (a wheel's path or URL; default: the site config's "
             "envs.product, else the wheel or checkout this install came from); a build job gets it from its CLI"),
    Variable("HPCAI_CACHE_DIR", ("user", "bench", "tests"), ("cli",),
             "download and compiled-wheel caches of env builds (default ~/.cache/hpcai)"),
    Variable("HPCAI_PIP_INSTALLER", ("admin", "user"), ("cli",),
             "what installs an env's pip layer: uv or pip (default: the config's envs.installer, else uv)"),
    Variable("HPCAI_UDOCKER", ("admin", "user", "tests"), ("cli",),
             "the udocker executable for container imports (default: udocker on PATH, or beside this python)"),
    Variable("HPCAI_UDOCKER_MODE", ("admin", "user"), ("cli",),
             "udocker's execution mode for imports (default P2; P1 lost files in this project's tests)"),
    Variable("HPCAI_CONTAINER_ENV_DENY", ("admin", "tests"), ("server", "rank", "cli"),
             "comma-separated name patterns a container never sees, added to the built-in secret patterns"),
    Variable("HPCAI_CONTAINER_SLURM_PATHS", ("admin",), ("server", "rank", "cli"),
             "host paths the Slurm client needs in a container, colon-separated (default: found beside Slurm's config)"),
    Variable("HPCAI_HOST_LIBRARY_PATH", ("server", "kernel", "rank", "cli"), ("kernel", "rank"),
             "inside a container: the host's library folders, as bound there, for the host's Slurm client (the "
             "wrappers in /.hpcai/bin run it with them); set at each container's start"),
    Variable("HPCAI_SCHEDULER", ("admin",), ("hub", "server", "kernel", "rank", "batch", "cli", "bench"),
             "the scheduler the site runs, a name of scheduler.SCHEDULERS (default slurm): the hub's, passed on to "
             "the jobs (Spawner.env_keep)"),
    Variable("HPCAI_CONTROLLER_IP", ("admin", "user", "tests"), ("kernel",),
             "where the ipyparallel controller listens (default: route to the first node, else loopback)"),
    Variable("HPCAI_REST_AFTER", ("admin", "user", "tests"), ("kernel",),
             "seconds without a cell after which idle engines rest (Horovod over Gloo: a 50 ms cycle until the next "
             "cell; default 30, 0: never); engines started with the job rest once ready, unless 0"),
    Variable("HPCAI_OWN_JOB_GRACE", ("user", "tests"), ("kernel",),
             "seconds a kernel's own job outlives its last keepalive, 4 to 3600 (default 120)"),
    Variable("HPCAI_HOROVOD_CONTROLLER", ("admin", "user"), ("kernel",),
             "gloo (default: worlds that grow, shrink and survive lost ranks) or mpi (the launch's MPI world, fixed; "
             "the default in a container env)"),
    Variable("HPCAI_TORCH_BACKEND", ("user", "tests", "bench"), ("kernel", "rank"),
             "torch.distributed's backend (default: nccl with a GPU, else gloo)"),
    Variable("HPCAI_STACKS", ("admin", "user"), ("kernel",),
             "where %hpc stacks and a timeout's report (the kernel's) and the side panel (the server's) read the ranks' "
             "stacks: auto (py-spy, and each rank's own thread where py-spy cannot attach; the default), py-spy, or "
             "self"),
    Variable("HPCAI_STRAGGLER_SHARE", ("admin", "user"), ("kernel",),
             "share of the median rate below which a rank is a straggler, in (0, 1) (default 0.67)"),
    Variable("HPCAI_CHECKPOINT_DIR", ("admin", "user"), ("rank",),
             "where hpc.Checkpoint saves, <dir>/<name> (default ~/.hpcai/checkpoints)"),
    # the dev cluster, the demo hub (spawner_config/demo_config.py), the benchmarks and the tests
    Variable("HPCAI_DEVCLUSTER_DIR", ("user", "cli", "tests"), ("cli", "hub", "tests"),
             "the dev cluster's state: configs, spool, logs (default /var/lib/hpcai/devcluster)"),
    Variable("HPCAI_SLURM", ("user", "tests"), ("cli", "tests"),
             "the Slurm the dev cluster runs: an install prefix (scripts/build-slurm.sh builds 24.11 into one); "
             "empty for the system's (Debian's 22.05)"),
    Variable("HPCAI_HUB_DIR", ("cli", "user", "tests"), ("hub", "cli"),
             "the demo hub's state: database, secrets, pid files, log (default /var/lib/hpcai/hub)"),
    Variable("HPCAI_HUB_PORT", ("cli", "user", "tests"), ("hub", "cli"), "the demo hub's public port (default 8000)"),
    Variable("HPCAI_HUB_HOST", ("cli", "tests"), ("hub",), "the demo hub's host name (default hub.localhost); each "
             "user's server is at <user>.<that name>, an origin of its own"),
    Variable("HPCAI_HUB_INTERNAL_PORT", ("cli", "tests"), ("hub",),
             "the demo hub's API port, where the servers reach it (default HPCAI_HUB_PORT + 1)"),
    Variable("HPCAI_PROXY_API_PORT", ("cli", "tests"), ("hub",),
             "the demo hub's proxy API port (default HPCAI_HUB_PORT + 2)"),
    Variable("HPCAI_HUB_API_TOKEN", ("cli", "tests"), ("hub",),
             "token of the demo hub's admin service hpcai-admin; empty: no such service"),
    Variable("HPCAI_DEMO_PASSWORD", ("cli", "tests"), ("hub",), "the demo hub's shared DummyAuthenticator password"),
    Variable("HPCAI_DEMO_USERS", ("cli", "tests"), ("hub",),
             "accounts that may log in to the demo hub, comma-separated (default hpcai-demo)"),
    Variable("HPCAI_DEMO_NOTEBOOK", ("cli",), ("hub",),
             "the notebook the demo hub opens JupyterLab on (hpcai demo: demo.ipynb; unset: /lab)"),
    Variable("HPCAI_DEMO_START_ENGINES", ("tests",), ("hub",),
             "0: the demo's 2-node profile leaves the engines to the notebook (default 1: they start with the job)"),
    Variable("HPCAI_HUB_LOG_LEVEL", ("tests",), ("hub",), "the demo hub's log level (default INFO; the tests: DEBUG)"),
    Variable("HPCAI_JOB_STATE_INTERVAL", ("tests",), ("hub",),
             "the demo hub's job_state_interval: seconds between squeue queries (default 1; 0: per spawner)"),
    Variable("HPCAI_MAX_CONCURRENT_SUBMITS", ("tests",), ("hub",),
             "the demo hub's max_concurrent_submits (default 8)"),
    Variable("HPCAI_BENCH", ("rank",), ("bench",),
             "not a variable: the prefix of rank 0's JSON result line on stdout, which bench/resnet50.py parses"),
]

VARIABLES: dict[str, Variable] = {v.name: v for v in _ROWS}
START_ENGINES = "HPCAI_START_ENGINES"
REST_AFTER = "HPCAI_REST_AFTER"


# --- the job's server and the hub ------------------------------------------------------------------------------------
# Before the hub routes a user to the port their server reported, it asks there for a proof that the answer comes from
# the server holding that spawner's token (spawner/liveness.py _wait_until_listening, server/handlers.py IdentityHandler).
IDENTITY_PATH = "hpcai/api/identity"  # under the server's base URL: GET ?nonce=<32 hex digits> -> {"proof": ...}


def token_digest(token: str) -> str:
    """SHA-256 of a server's hub token: what the hub keeps of it across its restarts (the spawner's state)."""
    return hashlib.sha256(token.encode()).hexdigest()


# Running servers keep the proof they started with: a change to it needs a new state key in spawner.get_state, so
# that a hub upgraded beside them skips them instead of ending their jobs.
def identity_proof(digest: str, nonce: str, port: int) -> str:
    """The server's answer to the hub's nonce on its listening ``port``: HMAC-SHA256 keyed with its token's digest
    (token_digest). The port is signed too: a process on another port cannot pass the hub's probe on to the server
    and its answer back."""
    return hmac.new(digest.encode(), f"hpcai-identity:{nonce}:{port}".encode(), hashlib.sha256).hexdigest()


# --- an engine set's folder: <ipyparallel profile>/hpcai-ranks/<cluster id>/, mode 700 ------------------------------
# Made and removed by the kernel that starts the set (engines/running_set.py); the profile is on every node already
# (the controller's connection file), so ranks write there wherever they run. Read by the kernel, by another kernel
# of the job that attaches (engines/listing.py), and by the server extension (the side panel).
SET_FOLDERS = "hpcai-ranks"  # in the profile: one folder per set
RANK_TABLE = "ranks.json"  # kernel -> kernel, server: the RankTable below, replaced whole
RANK_LOG = "rank-{rank}.log"  # rank -> kernel: what srun's rank wrote (the launcher's report after deaths)
TELEMETRY = "telemetry-{rank}.json"  # rank -> kernel, server: the rank's latest samples (ranks/telemetry.py)
STACKS_REQUEST = "stacks-request-{token}"  # kernel, server -> rank: each rank answers with its own stack (selfstacks.py)
STACKS_ANSWER = "stacks-{token}-{host}-{pid}.json"  # rank -> kernel, server: its main thread's frames
RENDEZVOUS_KEY = "rendezvous.key"  # kernel -> rank: the key of the launch world's rendezvous (0600; frameworks.py)


class RankRow(TypedDict):
    """One rank as its engine reported it (ranks/calls.py rank_info), in the rank table."""

    rank: int
    host: str
    gpu: str  # the GPU pinned to the rank (CUDA_VISIBLE_DEVICES), "" for none
    pid: int
    engine_id: int  # ipyparallel's id for the rank's engine
    addr: str  # the node's address, which the other nodes reach
    alive: bool
    job: str  # the Slurm job the rank runs in ("local" outside one): the set's job, or a grown one (%hpc grow)


class RankTable(TypedDict):
    """``ranks.json``: who each rank is, and what a kernel attaching to the set needs."""

    launcher: str  # a name in engines/launch.py LAUNCHERS
    container: bool  # the ranks run in the kernel's container image
    ranks: list[RankRow]  # in rank order; empty until every engine registered
    owners: list[int]  # pids of the kernels using the set (on the host that started it)
    layout: dict[str, Any]  # engines/launch.py Layout, as a dict
    warm: str | None  # the framework the ranks initialised as they booted
    telemetry_interval: float  # seconds between samples (0: off)
    grown: dict[str, list[int]]  # grown Slurm jobs (%hpc grow) by id: [nodes, ranks], joined or still waiting


# --- what a container gets of its host's environment (envs/container.py; a grown job's ranks, engines/membership.py) ---
# Variables a container never sees, whatever the site adds in HPCAI_CONTAINER_ENV_DENY: the hub's token and alike.
SECRET_VARIABLES = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*_KEY")


def without_secrets(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` less every variable whose name matches a deny pattern (shell-style, any case): SECRET_VARIABLES
    (JUPYTERHUB_API_TOKEN, JPY_API_TOKEN, anything named like a token...), always, and the site's own in the
    comma-separated ``HPCAI_CONTAINER_ENV_DENY``, which add to them. The kernel needs none of them: it connects
    through its connection file."""
    site = environ.get("HPCAI_CONTAINER_ENV_DENY", "").split(",")
    patterns = [p.strip().upper() for p in (*SECRET_VARIABLES, *site) if p.strip()]
    return {k: v for k, v in environ.items() if not any(fnmatch.fnmatchcase(k.upper(), p) for p in patterns)}
