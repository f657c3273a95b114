"""The notebook server's batch script: validated options in the #SBATCH header (jobscript.JobScript), then the body
that runs the server, every value that reaches a shell line quoted."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..scheduler import chosen
from ..scheduler.jobscript import JobScript, ranks_per_node
from .options import Profile, SpawnOptions

scheduler = chosen()

# after the #SBATCH header (jobscript.JobScript)
BODY = """
set -euo pipefail
{prune}{whole_environment}
# One Jupyter server, on the first node of the job; every node and GPU stays free for the
# engines (%hpc start). The server's environment carries the whole allocation.
export HPCAI_ENV={environment}
export HPCAI_START_ENGINES={start_engines}
{bind}{prologue}
{run}"""

# The server runs in the background: bash runs a trap only between commands, and ``wait`` returns early for
# each trapped signal while the server goes on. The server's exit status comes through a file its own subshell
# writes: where the server ends while a trap runs, bash (5.2) loses it and ``wait`` says 138 or 255 (``wait``'s
# status stands only where the file holds no number, e.g. that subshell itself was killed). The job's private
# folder is where the kernels and the side panel look; at the shell's exit (the server's end, the walltime,
# scancel: Slurm's SIGTERM), the engines that outlived their kernel are stopped: their parent gone, they are no
# longer the job's to Slurm's process tracking (engines/listing.py records their pids; a pid counts only while it
# is this job's process). SIGTERM is trapped so that the exit runs as a command between others: left to bash's
# own handler, the exit ran inside it, where a command substitution can lose its child and the exit ran twice.
SUPERVISED = """export HPCAI_JOB_STATE={state}/"{job_id}"
hpcai_job_end() {{
  for record in "$HPCAI_JOB_STATE"/engines/*; do
    [ -f "$record" ] || continue
    for pid in $(cat "$record"); do
      grep -qxz "{this_job}" "/proc/$pid/environ" 2>/dev/null && kill -TERM "$pid" 2>/dev/null || true
    done
  done
  rm -rf "$HPCAI_JOB_STATE"
}}
trap hpcai_job_end EXIT
trap 'exit 143' TERM
{signal_trap}mkdir -p -m 700 {state} "$HPCAI_JOB_STATE"
{{ status=0; {cmd} || status=$?; echo "$status" > "$HPCAI_JOB_STATE/server-status" || true; exit "$status"; }} &
server=$!
{warm}while true; do
  status=0
  wait "$server" || status=$?
  kill -0 "$server" 2>/dev/null || break
done
recorded=$(cat "$HPCAI_JOB_STATE/server-status" 2>/dev/null || true)
if [[ $recorded =~ ^[0-9]+$ ]]; then status=$recorded; fi
{epilogue}exit "$status"
"""
# The profile's start_engines: the engines start beside the server, in the job's env, for the first kernel to take
# (engines/warm.py), with the python that runs the server.
WARM = """hpcai_python="$(dirname "$(readlink -f "$(command -v {server})")")/python"
if [ -x "$hpcai_python" ]; then "$hpcai_python" -m jupyter_hpcai.engines.warm & fi
"""
# The walltime guard: the trap writes the time of Slurm's signal down in the job's folder.
SIGNAL_TRAP = """# Slurm signals this shell {warning} s before the walltime (--signal=B:USR1@{warning}).
export HPCAI_WALLTIME_WARNING={warning}
trap '{{ date +%s > "$HPCAI_JOB_STATE/.walltime" && mv -f "$HPCAI_JOB_STATE/.walltime" "$HPCAI_JOB_STATE/walltime"; }} || true' USR1
"""
JOB_STATE = ".hpcai/jobs"  # under the user's home: what every node of a cluster sees"
LOG_DIR = ".hpcai/logs"  # the job log folder under the user's home, by default (HPCSlurmSpawner.job_log_dir)
# The job (as its user) deletes its older logs: a server started each day leaves a few weeks of them at most.
PRUNE = """find {logdir} -maxdepth 1 -name 'jupyterhub-*.log' -mtime +{days} -delete 2>/dev/null || true
"""

# The hub passes the server's address in JUPYTERHUB_SERVICE_URL; where it left the host out, the server listens
# on its node's address as Slurm knows it (NodeAddr), which is where the hub connects.
NODE_ADDRESS = scheduler.node_address_in_shell()
BIND_NODE_ADDRESS = f"node_addr={NODE_ADDRESS}\n" + """\
export JUPYTERHUB_SERVICE_URL="${JUPYTERHUB_SERVICE_URL%%://*}://${node_addr}:0${JUPYTERHUB_SERVICE_PREFIX}"
"""


def render(options: SpawnOptions, profile: Profile, *, user: str, homedir: str, keepvars: str, cmd: Sequence[str],
           logdir: str = "", log_days: int = 0, site_options: Sequence[str] = (), prologue: str = "", epilogue: str = "",
           bind_node_address: bool = True, walltime_warning: int = 0, after: str = "") -> str:
    """The batch script. Options were validated; quoting still guards every value that reaches a shell line.
    ``logdir``: the folder of the job's log (default: LOG_DIR in the home); ``log_days``: the job deletes its logs there older than that (0: none).
    ``site_options``: the admin's #SBATCH options for every job (a profile's extra_sbatch come after them);
    ``prologue``/``epilogue``: the admin's shell lines before the server starts and after it ends.
    ``bind_node_address``: the server listens on its node's Slurm address (else where the hub's URL says).
    ``walltime_warning``: seconds before the walltime at which Slurm signals the job (0: never); at most half
    the walltime. ``after``: a job this one starts after (its follow-up, %hpc continue), once that ends."""
    logdir = logdir or f"{homedir}/{LOG_DIR}"
    warning = min(walltime_warning, options.walltime_seconds // 2)
    run = SUPERVISED.format(state=shlex.quote(f"{homedir}/{JOB_STATE}"), cmd=shlex.join(cmd),
                            job_id=scheduler.JOB_ID_IN_SHELL, this_job=scheduler.JOB_ID_IN_ENVIRON,
                            signal_trap=SIGNAL_TRAP.format(warning=warning) if warning else "",
                            warm=WARM.format(server=shlex.quote(cmd[0])) if profile.start_engines else "",
                            epilogue=f"{epilogue}\n" if epilogue else "")
    body = BODY.format(prune=PRUNE.format(logdir=shlex.quote(logdir), days=int(log_days)) if log_days else "",
                       whole_environment=scheduler.WHOLE_ENVIRONMENT,
                       environment=shlex.quote(options.environment), start_engines=int(profile.start_engines),
                       bind=BIND_NODE_ADDRESS if bind_node_address else "", prologue=prologue, run=run)
    extra = (f"--chdir={homedir}", f"--export={keepvars}", *([f"--signal=B:USR1@{warning}"] if warning else []),
             *([f"--dependency=afterany:{int(after)}"] if after else []), *site_options,
             *(["--no-kill"] if profile.no_kill else []),
             *(["--exclusive=user"] if profile.exclusive(options.nodes) and not _exclusive(site_options, profile)
               else []), *profile.extra_sbatch)
    return JobScript(name=f"jupyterhub-{user}", output=f"{logdir}/jupyterhub-%j.log", nodes=options.nodes,
                     tasks_per_node=ranks_per_node(options.gpus_per_node), gpus_per_node=options.gpus_per_node,
                     time=options.walltime, partition=options.partition, account=options.account or None,
                     qos=options.qos or None, cpus_per_task=profile.cpus_per_gpu if options.gpus_per_node else None,
                     memory_per_gpu=profile.mem_per_gpu if options.gpus_per_node else None,
                     extra=extra, body=body).render()


def _exclusive(site_options: Sequence[str], profile: Profile) -> bool:
    """Whether the site's or the profile's own options ask for exclusive nodes already (--exclusive, whole nodes,
    is more than --exclusive=user, which would replace it: sbatch takes the last)."""
    return any(option.split("=", 1)[0] == "--exclusive" for option in (*site_options, *profile.extra_sbatch))
