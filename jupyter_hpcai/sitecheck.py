"""``hpcai site check``: the admin's doctor, run on the hub host with the hub's config. Each check passes, fails
(the product will not work) or warns (a feature is weakened), with what to do: the hub's config (batchspawner's
settings; one origin per user), the Slurm client and munge, the commands the hub runs as a user (exec_prefix), the
proxy, the site's env roots as a user reads them, and one small job as that user on a GPU partition (or the one
named): that a node reaches the hub's API address, runs Spawner.cmd, offers the kernels this host has and runs a
cell in one, Yama's ptrace scope there (``%hpc stacks``), and that Slurm hands out GPUs (gres.conf with ``File=``)."""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from jupyter_client.kernelspec import KernelSpecManager

from . import paths, proc
from .envs import EnvStore
from .envs.recipe import names_the_product_bare
from .errors import HPCAIError
from .scheduler import chosen
from .siteinit import local_name
from .spawner import compat
from .spawner.as_user import command_env
from .spawner.spawner import offline_spawner

scheduler = chosen()
environment = chosen().environment

CONNECT_TIMEOUT = 5  # seconds for a node to reach the hub's API address
JOB_WAIT = 300  # seconds for the small job, its wait in the queue included
# The small job's report, one "key=value" line each: the hub's address as the node reaches it ("connected": the hub
# listens; "refused": the host answers, the hub is not running now; else why not), ptrace_scope, the GPUs it got,
# whether Spawner.cmd runs. No file of a fixed name: another user's could stand in its place.
PROBE = """said=$(timeout {timeout} bash -c '</dev/tcp/{ip}/{port}' 2>&1) && echo hub=connected || \
{{ case "$said" in *refused*) echo hub=refused;; *) echo "hub=$(printf %s "$said" | tr -d '\n')";; esac; }}
echo "ptrace_scope=$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo none)"
echo "gpus=${{CUDA_VISIBLE_DEVICES:-none}}"
said=$(PYTHONNOUSERSITE=1 {cmd} --version 2>&1 >/dev/null) && echo cmd=ok || \
echo "cmd=$(printf %s "$said" | head -c 300 | tr -d '\n')"
{python} -I -c {kernels} {site_kernels} 2>&1 | tail -n 3
"""
REPORT_BYTES = 65536  # of the job's report, read at most: the user's processes write there too
KERNEL_NAME = re.compile(r"hpcai-[A-Za-z0-9._-]{1,64}")
# Run on the node by the python beside Spawner.cmd (the servers' own): the kernels a server there offers, and the
# first of the site's (this host's, in argv) started as a notebook starts it (its provisioner, the env activated),
# one cell run.
KERNELS = """
import sys
from jupyter_client.kernelspec import KernelSpecManager
specs = sorted(KernelSpecManager().find_kernel_specs())
print("kernels=" + ",".join(specs))
ours = [k for k in specs if k in sys.argv[1:]]
if ours:
    from jupyter_client.manager import start_new_kernel
    try:
        km, kc = start_new_kernel(kernel_name=ours[0], startup_timeout=120)
        reply = kc.execute_interactive("import jupyter_hpcai", timeout=60)
        said = reply["content"]["status"] + " " + reply["content"].get("evalue", "")
        km.shutdown_kernel(now=True)
    except Exception as err:
        said = f"{type(err).__name__}: {err}"
    print(f"kernel={ours[0]} " + " ".join(said.split())[:300])
"""


@dataclass(frozen=True)
class Check:
    """One line of the report. ``severity``: what it means when it did not pass: "fail" (the product will not
    work), or "warn" (a feature is weakened)."""

    name: str
    passed: bool
    detail: str
    fix: str = ""
    severity: str = "fail"


def run(config_file: Path, user: str, partition: str | None = None) -> list[Check]:
    """Every check, in order; a check that cannot run fails with its reason. The small job runs on ``partition``
    where given."""
    return list(_checks(config_file, user, partition))


def _checks(config_file: Path, user: str, partition: str | None) -> Iterator[Check]:
    try:  # the hub's config, loaded once: the spawner it makes for the user carries it whole
        spawner = offline_spawner(config_file, user)
        config = spawner.config
        compat.check(config)
    except (HPCAIError, OSError, SyntaxError) as err:
        yield Check("hub config", False, f"{config_file}: {err}", "fix the hub's config first")
        return
    yield Check("hub config", True, f"{config_file} loads; batchspawner's settings are all used")
    yield _one_origin(config)
    as_user = shlex.split(spawner.exec_prefix.format(username=user))
    yield _probe("Slurm client and munge", lambda: proc.run(list(scheduler.PING), timeout=30).stdout.strip(),
                 lambda out: "UP" in out,
                 f"start slurmctld and munged on this host, or set {environment.CONFIG} to the cluster's slurm.conf")
    # as the hub runs them: a failed job's log is read through timeout, so tail needs no sudo rule of its own
    for program in (*([p] for p in (*scheduler.SUBMITTERS, "install")), ["timeout", "5", "tail"]):
        yield _probe(f"exec_prefix runs {' '.join(program)} as {user}",
                     lambda program=program: proc.run([*as_user, *program, "--version"], timeout=30).stdout.split("\n")[0],
                     bool, f"let the hub run `{shlex.join(as_user)} {program[0]}` (sudoers), or fix "
                           "HPCSlurmSpawner.exec_prefix")
    yield _proxy(config)
    yield from _shared_nodes(spawner)
    for root in paths.site_env_roots():
        yield _probe(f"env root {root} readable by {user}",
                     lambda root=root: proc.run([*as_user, "test", "-r", str(root), "-a", "-x", str(root)],
                                                timeout=30, check=False).returncode == 0,
                     bool, f"chmod o+rx {root} and every folder above it (servers and ranks run as the users)")
    yield _products_from_the_site()
    yield from _job_checks(config, spawner, as_user, partition)


def _products_from_the_site() -> Check:
    """Each site env's jupyter-hpcai, as its lock says it was installed: from the site's wheel, a URL or a checkout,
    never by bare name from a package index (where anyone may publish that name)."""
    bare = {}
    for env_dir in EnvStore().list("site"):
        try:
            build = env_dir.current()
            manifest = build.manifest() if build else None
            lock = build.lock() if build and manifest and manifest.kind == "conda" else None
        except (OSError, ValueError, RecursionError, RuntimeError) as err:  # said; the check goes on
            bare[env_dir.name] = f"its build cannot be read ({type(err).__name__})"
            continue
        if manifest and manifest.kind == "conda" and lock is None:
            bare[env_dir.name] = "its lock cannot be read"
            continue
        lines = [ln for ln in (lock.pip if lock else []) if names_the_product_bare(ln)]
        bare.update({env_dir.name: f"{lines[0]}, from a package index"} if lines else {})
    return Check("site envs install jupyter-hpcai from the site's own copy", not bare,
                 "; ".join(f"{name}: {said}" for name, said in sorted(bare.items())) or
                 "none from a package index",
                 "rebuild each from a recipe that names ${HPCAI_PRODUCT} (the shipped ones do): "
                 "hpcai env build RECIPE --site --rebuild, with [envs] product in the site config")


def _probe(name: str, probe: Callable[[], Any], good: Callable[[Any], bool], fix: str) -> Check:
    """A check from one probe: it passes when ``good`` of what the probe returned (an HPCAIError fails it)."""
    try:
        found = probe()
    except HPCAIError as err:
        return Check(name, False, err.message, fix)
    return Check(name, good(found), str(found) if not isinstance(found, bool) else ("yes" if found else "no"), fix)


def _one_origin(config: Any) -> Check:
    """Each user's server on an origin of its own (subdomain_host), the hub's cookies out of their reach."""
    hub = config.JupyterHub
    host, prefixed = str(hub.get("subdomain_host", "")), bool(hub.get("cookie_host_prefix_enabled", False))
    detail = (f"the hub at {host}, each user's server at <user>.{host.split('://')[-1]}" if host else
              "every user's server on the hub's own origin: a page one user serves runs as the hub's for whoever "
              "opens it, and can take their account")
    if host and not prefixed:
        detail += "; but the hub's cookies lack the __Host- prefix, so a user's origin can set them"
    plain = host.startswith("http://") and not local_name(urlsplit(host).hostname or "")
    if plain:
        detail += "; but over plain http, where browsers keep no __Host- (Secure) cookie: nobody could log in"
    return Check("one origin per user", bool(host) and prefixed and not plain, detail,
                 "c.JupyterHub.subdomain_host = 'https://hub.example.org' (DNS for hub.example.org and "
                 "*.hub.example.org, a certificate for both) and c.JupyterHub.cookie_host_prefix_enabled = True")


def _proxy(config: Any) -> Check:
    command = list(config.ConfigurableHTTPProxy.get("command", ["configurable-http-proxy"]))
    found = shutil.which(command[0])
    return Check("configurable-http-proxy", bool(found), found or f"{command[0]} not found",
                 "npm install -g configurable-http-proxy, or set ConfigurableHTTPProxy.command")


def _shared_nodes(spawner: Any) -> Iterator[Check]:
    """Each partition a profile names or the form offers (``partitions``): whether its nodes run several users' jobs
    at once. torch's rendezvous store takes no key, so another user's job on a node of a world can join it:
    multi-node notebook jobs ask for --exclusive=user (Profile.exclusive_user), one-node jobs share as the partition
    allows, and the partition's other jobs are the site's to keep apart."""
    for partition in sorted({p["partition"] for p in spawner.profiles if p.get("partition")} | set(spawner.partitions)):
        try:
            shared = scheduler.shared_between_users(partition)
        except HPCAIError as err:
            yield Check(f"partition {partition} keeps users apart", False, err.message, "check the partition's name",
                        "warn")
            continue
        yield Check(f"partition {partition} keeps users apart", shared is None,
                    "each node runs one user's jobs at a time" if shared is None else
                    f"nodes run several users' jobs at once ({shared}): another user's job on a node of a one-node "
                    "world can reach its torch rendezvous (multi-node profiles ask for --exclusive=user)",
                    f"ExclusiveUser=YES on partition {partition} in slurm.conf (a profile's exclusive_user: True keeps "
                    "its own notebook jobs apart, not the partition's other jobs)", "warn")


def _report(stdout: str) -> dict[str, str]:
    """The job's ``key=value`` lines, each key's first (the probe's own come before anything the user's kernel may
    print), the kernel's only under a kernel's name."""
    seen: dict[str, str] = {}
    for key, _, value in (line.partition("=") for line in stdout.splitlines() if "=" in line):
        seen.setdefault(key, value)
    if not KERNEL_NAME.fullmatch(seen.get("kernel", "hpcai-x").partition(" ")[0]):
        seen.pop("kernel")
    return seen


def _site_kernels() -> dict[str, str]:
    """This host's hpcai kernels (the site's, as an admin installed them): name -> folder."""
    return {k: folder for k, folder in KernelSpecManager().find_kernel_specs().items() if KERNEL_NAME.fullmatch(k)}


def _node_runs_the_servers(seen: dict[str, str], cmd: str, here: dict[str, str]) -> Iterator[Check]:
    """What the job saw of the servers' own software: Spawner.cmd, and the kernels a server there offers against
    the product's kernels this host has (a kernelspec in a folder of this host's own reaches no server)."""
    yield Check(f"a node runs Spawner.cmd ({cmd})", seen.get("cmd") == "ok",
                "it runs" if seen.get("cmd") == "ok" else f"not there: {seen.get('cmd') or 'no answer'}",
                "install the hub's venv on storage every node sees at the same path (or the same venv at that path "
                "on each node), and set Spawner.cmd to its jupyterhub-singleuser")
    missing = sorted(set(here) - set(seen.get("kernels", "").split(",")))
    folders = sorted({str(Path(here[k]).parent) for k in missing})
    detail = (f"{len(here)} of this host's hpcai kernels, all there" if not missing else
              f"missing on the node: {', '.join(missing)} (this host has them in {', '.join(folders)})")
    detail += "" if "kernels" in seen else "; the servers' python beside Spawner.cmd did not run there"
    yield Check("the nodes' servers offer the site's kernels", not missing and "kernels" in seen, detail,
                "install each site env's kernel beside the hub's venv, where the servers look: "
                "hpcai kernel install NAME (its default for a site env), run from that venv")
    kernel, _, said = seen.get("kernel", "").partition(" ")
    if kernel:
        yield Check(f"a site env's kernel ({kernel}) runs a cell on a node", said.startswith("ok"), said,
                    f"hpcai env check {shlex.quote(kernel.removeprefix('hpcai-'))} as that user on a node says why")


def _job_checks(config: Any, spawner: Any, as_user: list[str], partition: str | None) -> Iterator[Check]:
    """One small job, as the user, on ``partition``, else the first profile's with GPUs (else the first's)."""
    hub = config.JupyterHub
    ip, port = hub.get("hub_connect_ip") or hub.get("hub_ip") or "127.0.0.1", int(hub.get("hub_port", 8081))
    profiles = list(spawner.profiles) or [{}]
    profile = next((p for p in profiles if p.get("gpus_per_node")), profiles[0])
    gpus = bool(profile.get("gpus_per_node"))
    if partition:  # the admin's: GPUs where its nodes have them
        gpus = any(p.name == partition and p.gpus_per_node for p in scheduler.partitions())
        profile = {**profile, "partition": partition, "gpus_per_node": int(gpus)}
    fields = {"name": "hpcai-site-check", "nodes": 1, "time": "00:03:00", "partition": profile.get("partition"),
              "account": profile.get("account"), "gpus_per_node": 1 if gpus else None}
    cmd = spawner.cmd[0] if spawner.cmd else "jupyterhub-singleuser"
    here = _site_kernels()  # this host's: the node's server should offer them, and one is started there
    probe = PROBE.format(timeout=CONNECT_TIMEOUT, ip=ip, port=port, cmd=shlex.quote(cmd),
                         python=shlex.quote(str(Path(cmd).with_name("python"))), kernels=shlex.quote(KERNELS),
                         site_kernels=shlex.join(sorted(here)))
    where = fields["partition"] or "the default partition"
    try:
        job = scheduler.job_of_its_own({key: value for key, value in fields.items() if value})
        # the report, its errors and the job's exit status through head, here: the user's processes write there too
        done = proc.run(["bash", "-c", f'{{ "$@" 2>&1; echo "job-exit=$?"; }} | head -c {REPORT_BYTES}', "report",
                         *as_user, *job, "bash", "-c", probe], timeout=JOB_WAIT, env=command_env())
        ended = done.stdout.rstrip("\n").rpartition("\n")[2]
        if ended != "job-exit=0":
            raise HPCAIError(f"the job failed: {' | '.join(done.stdout.splitlines()[-6:])[-600:]}"
                             if ended.startswith("job-exit=") else f"its report went past {REPORT_BYTES} bytes")
    except HPCAIError as err:
        yield Check("a small job on a node", False, err.message,
                    f"check that {spawner.user.name} can run jobs on {where}; where its nodes are busy, run the "
                    "check where jobs start at once: hpcai site check ... --partition debug")
        return
    seen = _report(done.stdout)
    yield from _node_runs_the_servers(seen, cmd, here)
    reached = seen.get("hub") in ("connected", "refused")
    yield Check(f"a node reaches the hub's API at {ip}:{port}", reached,
                {"connected": "the hub answers", "refused": "the host answers (the hub is not running now)"}.get(
                    seen.get("hub", ""), seen.get("hub", "no answer")),
                "set JupyterHub.hub_connect_ip (and hub_ip) to the login node's address on the compute nodes' network")
    scope = seen.get("ptrace_scope", "?")
    yield Check("ptrace on the nodes (%hpc stacks)", scope in ("0", "none"), f"kernel.yama.ptrace_scope = {scope}",
                "sysctl kernel.yama.ptrace_scope=0 on the nodes, or py-spy cannot read the ranks' stacks and each "
                "rank's own thread takes them instead, without C frames and not from a rank that holds Python's lock "
                "in C (never give py-spy CAP_SYS_PTRACE: every user could read every process)", "warn")
    if profile.get("gpus_per_node"):
        gpus = seen.get("gpus", "none")
        yield Check("Slurm hands out GPUs", gpus != "none", f"CUDA_VISIBLE_DEVICES={gpus}",
                    "gres.conf needs the GPUs' device files (Name=gpu File=/dev/nvidia[0-3]), and GresTypes=gpu")
