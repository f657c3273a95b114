"""The `hpcai` command: a thin layer over the Python API."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import joblog, kernelspec, paths
from .envs import BuildRequest, EnvDir, EnvStore, Event, load_recipe, open_env, remote
from .envs.recipe import recipe_file
from .envs.container import import_container
from .envs.container import warnings as container_warnings
from .envs.pip import INSTALLERS
from .envs.preflight import preflight
from .errors import HPCAIError
from .scheduler import chosen
from .scheduler.jobscript import Submitted
from .siteinit import HUB_CONFIG, STATE_DIR

environment = chosen().environment

if TYPE_CHECKING:  # the workshop (the dev cluster, the benchmarks) loads for its own commands only
    from .devcluster import DevCluster

console = Console(soft_wrap=True)  # long paths and messages stay on one line
if not console.is_terminal:  # a pipe or a file: tables as wide as their cells, no name cut at 80 columns
    console.width = 1_000_000


def esc(value: object) -> str:
    """Any text this project did not write (paths, names, messages, tool output), made safe to print with rich
    markup: ``[/x]``, ``[bold]`` and ``[rank 0 n1]`` print as they are, and a control character (a terminal's
    escape sequence: it could clear or rewrite what was printed) as U+FFFD. Every value put into markup goes
    through it."""
    return escape("".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in str(value)))


def _say(line: str) -> None:
    """Print a line of someone else's text as is (no rich markup: "[ok]" stays "[ok]")."""
    console.print(line, highlight=False, markup=False)


def _emit(as_json: bool, data: object, *shown: RenderableType) -> None:
    """A command's result: ``data`` as one JSON document on stdout (--json), else ``shown`` (tables, lines)."""
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for part in shown:
        console.print(part)


def _messages_to_stderr(ctx: click.Context, param: click.Parameter, as_json: bool) -> bool:
    """With --json stdout holds the JSON document alone: every message (notes, warnings, errors) goes to stderr."""
    if as_json:
        console.file = sys.stderr
    return as_json


json_option = click.option(
    "--json", "as_json", is_flag=True, callback=_messages_to_stderr,
    help="Print one JSON document on stdout (keys above) and nothing else; messages and errors go to stderr.",
)
state_dir_option = click.option(
    "--state-dir", type=click.Path(path_type=Path), default=None,
    help="Where the dev cluster keeps its files [default: $HPCAI_DEVCLUSTER_DIR or /var/lib/hpcai/devcluster].",
)


@click.group()
@click.version_option(package_name="jupyter-hpcai")
def cli() -> None:
    """jupyter-hpcai: interactive multi-node deep learning on HPC clusters."""


@cli.group()
def devcluster() -> None:
    """A real Slurm cluster with fake GPUs on this machine."""


@devcluster.command("up")
@click.option("--nodes", default=2, show_default=True, help="Number of nodes (n1..nN).")
@click.option("--gpus-per-node", default=4, show_default=True, help="Fake GPUs on each node.")
@click.option("--port", default=6817, show_default=True, help="slurmctld port; node i uses port+i.")
@click.option("--single-host", is_flag=True, help="Every node on this host's loopback (no network namespaces).")
@click.option("--network", default="10.213.0.0/24", show_default=True,
              help="Private address block: the host (login node) gets the first address, node i the (i+1)th.")
@click.option("--bridge", default="hpcai0", show_default=True, help="Name of the bridge joining the nodes.")
@click.option("--netns-prefix", default="hpcai-", show_default=True, help="Node i's namespace is PREFIXni.")
@click.option("--first-job-id", default=1, show_default=True, type=click.IntRange(1, 67_000_000),
              help="The first job's id: clusters side by side keep their job ids apart.")
@click.option("--accounting/--no-accounting", default=True, show_default=True,
              help="Run slurmdbd on a MariaDB server of the cluster's own (ports PORT+100 and +101), enforcing "
                   "associations, limits and QOS: projects climate and genomics (genomics with a GPU-hour budget), "
                   "QOS normal (4 h) and debug (30 min, 2 GPUs per user).")
@click.option("--login-only", multiple=True, metavar="FOLDER",
              help="A folder of the login node's own, empty on the nodes (separate hosts only); repeat it "
                   "[default: /usr/local and /opt].")
@click.option("--shared", multiple=True, metavar="FOLDER",
              help="A folder inside those that the nodes see all the same; repeat it [default: the site's env "
                   "roots, and the local folders pip's configuration takes packages from].")
@click.option("--slurm", "slurm", metavar="PREFIX", default=None,
              help="Run the Slurm installed in PREFIX (its sbin/ and bin/; scripts/build-slurm.sh builds 24.11 into "
                   "one) [default: $HPCAI_SLURM, else the system's]. `hpcai devcluster env` then puts its bin/ first "
                   "on PATH.")
@state_dir_option
def devcluster_up(nodes: int, gpus_per_node: int, port: int, single_host: bool, network: str, bridge: str,
                  netns_prefix: str, first_job_id: int, accounting: bool, login_only: tuple[str, ...],
                  shared: tuple[str, ...], slurm: str | None, state_dir: Path | None) -> None:
    """Start the dev cluster (harmless when it already runs) and wait until every node is idle."""
    kwargs: dict[str, Any] = {"state_dir": state_dir} if state_dir else {}
    kwargs.update({"login_only": tuple(str(Path(f).absolute()) for f in login_only)} if login_only else {})
    kwargs.update({"shared": tuple(str(Path(f).absolute()) for f in shared)} if shared else {})
    kwargs.update({"slurm": str(Path(slurm).absolute()) if slurm else ""} if slurm is not None else {})
    from .devcluster import DevCluster

    cluster = DevCluster(nodes=nodes, gpus_per_node=gpus_per_node, port=port, separate_hosts=not single_host,
                         network=network, bridge=bridge, netns_prefix=netns_prefix, first_job_id=first_job_id,
                         accounting=accounting, **kwargs)
    with console.status("starting munge, " + ("MariaDB, slurmdbd, " if accounting else "") + "slurmctld and the slurmds..."):
        cluster.up()
    if cluster.note:
        console.print(f"[yellow]note:[/] the nodes share this host's loopback: {esc(cluster.note)}")
    if cluster.cpu_note:
        console.print(f"[yellow]note:[/] the nodes' processes take this host's CPU as its own do: {esc(cluster.cpu_note)}")
    _show_status(cluster)
    where = f" --state-dir {cluster.state_dir}" if state_dir else ""
    console.print(f'\nTo use it from a shell: [bold]eval "$(hpcai devcluster env{esc(where)})"[/] (sets '
                  f"{', '.join(esc(k) for k in cluster.variables())})")


@devcluster.command("status")
@state_dir_option
@json_option
def devcluster_status(state_dir: Path | None, as_json: bool) -> None:
    """Show the daemons and the nodes.

    With --json: one object with keys state_dir, conf, running (true when every daemon runs), mode and note
    (null before the first up), login_address, slurm (its version, e.g. "22.05"; null before the first up), accounting (true when slurmdbd
    keeps its accounting), daemons (a list of {name, pid}; pid null when not running) and
    nodes (a list of {name, address, state, partitions, cpus, gpus, usable}; empty while slurmctld is down).
    """
    _show_status(_loaded(state_dir), as_json)


@devcluster.command("env")
@state_dir_option
def devcluster_env(state_dir: Path | None) -> None:
    """Print the export lines a shell needs: eval "$(hpcai devcluster env)"."""
    for key, value in _loaded(state_dir).variables().items():
        click.echo(f"export {key}={value}")


@devcluster.command("down")
@state_dir_option
def devcluster_down(state_dir: Path | None) -> None:
    """Cancel every job and stop every daemon (harmless when nothing runs)."""
    _loaded(state_dir).down()
    console.print("dev cluster stopped")


def _loaded(state_dir: Path | None) -> DevCluster:
    from .devcluster import DevCluster

    return DevCluster.load(state_dir)


def _show_status(cluster: DevCluster, as_json: bool = False) -> None:
    status = cluster.status()
    daemons = Table("daemon", "pid", title=f"dev cluster in {esc(status.state_dir)}: Slurm {esc(status.slurm)}, "
                    + ("accounting in slurmdbd" if status.accounting else "no accounting"))
    for name, pid in status.daemons.items():
        daemons.add_row(esc(name), str(pid) if pid else "[red]not running[/]")
    nodes = Table("node", "address", "state", "partitions", "cpus", "gpus",
                  title=f"{esc(status.mode)}; login node {esc(status.login_address)}")
    for n in status.nodes:
        colour = "green" if n.usable else "red"
        nodes.add_row(esc(n.name), esc(status.addresses.get(n.name, "")), f"[{colour}]{esc(n.state)}[/]",
                      esc(",".join(n.partitions)), str(n.cpus), str(n.gpus))
    data = {
        "state_dir": str(status.state_dir), "conf": str(status.conf), "running": all(status.daemons.values()),
        "mode": status.mode or None, "note": status.note or None, "login_address": status.login_address,
        "slurm": status.slurm or None, "accounting": status.accounting,
        "daemons": [{"name": name, "pid": pid} for name, pid in status.daemons.items()],
        "nodes": [{"name": n.name, "address": status.addresses.get(n.name), "state": n.state,
                   "partitions": list(n.partitions), "cpus": n.cpus, "gpus": n.gpus, "usable": n.usable}
                  for n in status.nodes],
    }
    _emit(as_json, data, daemons, *([nodes] if status.nodes else []))


@cli.group()
def env() -> None:
    """Build, list, check and remove environments (conda layer first, then pip)."""


@env.command("build")
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="Env name [default: the recipe's name].")
@click.option("--site", is_flag=True, help="Build into the site's environments (the first site root), for every user.")
@click.option("--locked", is_flag=True, help="Reproduce the current build's lock exactly.")
@click.option("--lock-file", type=click.Path(dir_okay=False, path_type=Path), help="Reproduce this lock exactly.")
@click.option("--rebuild", is_flag=True, help="Rebuild both layers from the recipe, in order.")
@click.option("--on-partition", help="Build in a Slurm job on this partition [default: the recipe's build.partition].")
@click.option("--gpus", type=click.IntRange(0, 16), help="GPUs for the build job [default: the recipe's build.gpus].")
@click.option("--time", "time_limit", help="Walltime of the build job [default: the recipe's build.time].")
@click.option("--account", help="Slurm account for the build job.")
@click.option("--here", is_flag=True, help="Build on this machine even if the recipe names a build partition.")
@click.option("--installer", type=click.Choice(sorted(INSTALLERS)),
              help="What installs the pip layer [default: $HPCAI_PIP_INSTALLER, the site config, or uv].")
def env_build(recipe: Path, name: str | None, site: bool, locked: bool, lock_file: Path | None, rebuild: bool,
              on_partition: str | None, gpus: int | None, time_limit: str | None, account: str | None, here: bool,
              installer: str | None) -> None:
    """Build RECIPE (a file, or a shipped recipe's name: tf-horovod-nccl) into a new version of its env; `current`
    moves only when verify passes."""
    recipe, lock_file = recipe_file(recipe).absolute(), lock_file.absolute() if lock_file else None
    os.chdir("/")  # the build's pythons import nothing from the folder it was started in (maybe another user's)
    request = BuildRequest(recipe, name=name, site=site, locked=locked, lock_file=lock_file, rebuild=rebuild,
                           partition=on_partition, here=here, gpus=gpus, time_limit=time_limit, account=account,
                           installer=installer)
    store = EnvStore()
    partition = request.partition_for(request.recipe())
    if partition:
        _build_in_job(request, store, partition)
        return
    signal.signal(signal.SIGTERM, _interrupt)  # scancel of a build job: stop like Ctrl-C, keep the old env
    with _BuildProgress() as shown:
        result = request.builder(store, progress=shown).run()
    if result.up_to_date:
        console.print(f"env '{esc(result.env_dir.name)}' is up to date (build {esc(result.build.id)}); "
                      "--rebuild forces a new build")
        for project, source in result.followed.items():
            console.print(f"  its editable {esc(project)} now follows {esc(source)}")
        return
    console.print(f"env '{esc(result.env_dir.name)}' built: {esc(result.build.prefix)}")
    console.print(f"phases: {esc(result.summary())}")


class _BuildProgress:
    """A build's events on the terminal: a bar per running phase (packages or steps where known), a line per
    finished phase, warnings as they come."""

    def __init__(self) -> None:
        self.bars = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                             MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[latest]}"),
                             console=console, transient=True)
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _BuildProgress:
        self.bars.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.__exit__(*exc)

    def __call__(self, event: Event) -> None:
        if event.state == "log":
            self.bars.console.print(f"log: {esc(event.message)}")
        elif event.state == "started":
            self.tasks[event.phase] = self.bars.add_task(esc(event.phase), total=event.total, latest="")
        elif event.state == "done":
            if event.phase in self.tasks:
                self.bars.remove_task(self.tasks.pop(event.phase))
            self.bars.console.print(f"[green]✓[/] {esc(event.phase)} {esc(event.message)}")
        elif event.state == "warning":
            self.bars.console.print(f"[yellow]{esc(event.message)}[/]")
        elif event.phase in self.tasks:
            task = self.tasks[event.phase]
            self.bars.update(task, total=event.total, completed=event.done or 0, latest=esc(event.message[:70]),
                             refresh=event.done is not None)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _build_in_job(request: BuildRequest, store: EnvStore, partition: str) -> None:
    job = remote.submit(request, store, partition)
    console.print(f"build job {job.job_id} on partition {esc(partition)}; log: {esc(job.output)}")

    def cancelled() -> None:  # the build stops as on Ctrl-C: follow it to its end
        console.print(f"cancelling job {job.job_id}; the env keeps its current build")

    code = _follow(job, "build job", lambda line: console.print(f"  [dim]{job.job_id}|[/] {esc(line)}",
                                                                  highlight=False), cancelled, cancel_default=True)
    if code:
        raise HPCAIError(f"build job {job.job_id} failed (exit status {code})", f"see its log: {job.output}")
    console.print(f"build job {job.job_id} finished")


@env.command("preflight")
@click.argument("recipe", type=click.Path(dir_okay=False, path_type=Path))
@json_option
def env_preflight(recipe: Path, as_json: bool) -> None:
    """Check the compiler, CMake, MPI, CUDA/NCCL and GPUs the recipe's build needs, here.

    With --json: one object with keys facts (node, job_id, partition, gpus, compiler, cmake, mpi, mpicc, cuda;
    null where not found), warnings (a list of strings), problems (a list of {problem, fix}) and passed (true
    when there is no problem); with problems it exits 1 after printing it.
    """
    checked = preflight(load_recipe(recipe))
    table = Table("fact", "value", title="toolchain on this node")
    for key, value in checked.facts.items():
        table.add_row(esc(key), esc(value if value not in (None, []) else "-"))
    data = {"facts": checked.facts, "warnings": checked.warnings,
            "problems": [{"problem": what, "fix": fix} for what, fix in checked.problems],
            "passed": not checked.problems}
    _emit(as_json, data, table, *(f"[yellow]warning:[/] {esc(w)}" for w in checked.warnings),
          *([] if checked.problems else ["[green]preflight passed[/]"]))
    checked.raise_for_problems()


@env.command("import-container")
@click.argument("source")
@click.option("--name", required=True, help="The env's name (also its kernel's: hpcai-NAME).")
@click.option("--mode", help="udocker execution mode (default P2, or HPCAI_UDOCKER_MODE; P1 is faster but lost "
              "files in our tests).")
@click.option("--python", default="python3", show_default=True, help="The interpreter inside the image.")
@click.option("--bind", "binds", multiple=True, metavar="SRC[:DST]",
              help="A host path the container sees (repeatable), e.g. a dataset or a shared software tree.")
def env_import_container(source: str, name: str, mode: str | None, python: str, binds: tuple[str, ...]) -> None:
    """Make env NAME from a container image: SOURCE is a tarball (docker save, or a root filesystem) or a
    registry reference (udocker pull). udocker settings: HPCAI_UDOCKER, UDOCKER_DIR and udocker's UDOCKER_* variables."""
    found = import_container(source, name, mode=mode, python=python, binds=list(binds))
    inside = found.inside
    console.print(esc(f"env '{name}' imported: container {found.container} (mode {found.settings.mode}), python "
                      f"{inside.python}, MPI {inside.mpi or 'none'}, packages: {found.describe()['packages']}"))
    for warning in container_warnings(inside):
        console.print(f"[yellow]warning:[/] {esc(warning)}")
    console.print(f"next: hpcai kernel install {esc(name)}")


@env.command("list")
@json_option
def env_list(as_json: bool) -> None:
    """List the environments of every root (yours first, then the site's) and their current builds.

    With --json: a list with one object per env, keys name, scope ("user" or "site"), root (the folder of
    envs it is in), kind ("conda", "venv" or "container"), build (the current build's id), python, packages
    (a summary) and note (shadowing, or why it cannot be opened); null where unknown or none.
    """
    store = EnvStore()
    where = ", ".join(f"{r.path} ({r.scope})" for r in store.roots)
    table = Table("name", "where", "kind", "build", "python", "packages", "note", title=f"environments in {esc(where)}")
    rows: list[dict[str, str | None]] = []
    seen: set[str] = set()
    for env_dir in store.list():
        note = "shadowed by yours" if env_dir.name in seen else None
        if not note and store.shadowed(env_dir):
            note = "shadows the site's"
        seen.add(env_dir.name)
        try:
            described = {k: None if v == "-" else v for k, v in open_env(env_dir).describe().items()}
        except HPCAIError as err:
            described, note = {}, err.message
        build = env_dir.current()
        row = {"name": env_dir.name, "scope": env_dir.scope, "root": str(env_dir.root.path),
               "kind": described.get("kind"), "build": build.id if build else None,
               "python": described.get("python"), "packages": described.get("packages"), "note": note}
        rows.append(row)
        cells = [row[k] for k in ("name", "scope", "kind", "build", "python", "packages")]
        table.add_row(*(esc("-" if c is None else c) for c in cells), esc(note or ""))
    _emit(as_json, rows, table)


@env.command("check")
@click.argument("name")
@json_option
def env_check(name: str, as_json: bool) -> None:
    """Run the env again (its verify steps, or its container) and warn where this node differs from its build's.

    With --json: one object with keys name, scope ("user" or "site"), root (the folder of envs it is in), build
    (the current build's id), passed (the steps that passed), warnings and shadows (the folders of the envs of
    the same name it hides), each a list of strings; a failed step exits 1 with the error on stderr.
    """
    store = EnvStore()
    target = store.get(name)
    checked = target.check()
    hidden = store.shadowed(target.env_dir)
    data = {"name": name, "scope": target.env_dir.scope, "root": str(target.env_dir.root.path), "build": target.build.id,
            "passed": checked.passed, "warnings": checked.warnings, "shadows": [str(h.root.path) for h in hidden]}
    _emit(as_json, data, *(f"[green]✓[/] {esc(step)}" for step in checked.passed),
          *(f"[yellow]warning:[/] {esc(w)}" for w in checked.warnings), *_shadowing(target.env_dir, hidden),
          f"env '{esc(name)}' ({esc(target.env_dir.scope)}, {esc(target.env_dir.root.path)}) is OK")


def _shadowing(env_dir: EnvDir, hidden: list[EnvDir]) -> list[str]:
    """A note for each env of the same name that ``env_dir`` hides."""
    return [f"[yellow]note:[/] your env '{esc(env_dir.name)}' shadows the {esc(h.scope)} env of the same name in "
            f"{esc(h.root.path)}" for h in hidden]


@env.command("remove")
@click.argument("name")
def env_remove(name: str) -> None:
    """Remove an env of yours and all its builds (a container env's udocker containers too)."""
    target = EnvStore().get(name)
    target.remove()
    console.print(f"env '{esc(name)}' removed from {esc(target.env_dir.root.path)}")


@cli.group()
def kernel() -> None:
    """Jupyter kernels for built environments."""


@kernel.command("install")
@click.argument("name")
@click.option("--display-name", help="Name shown in JupyterLab's launcher.")
@click.option("--user", is_flag=True, help="Install for the current user only [default for your own envs].")
@click.option("--prefix", help="Install under this prefix [default for a site env: this hpcai's own, the hub's "
                               "venv, where the servers on the nodes look].")
def kernel_install(name: str, display_name: str | None, user: bool, prefix: str | None) -> None:
    """Write a kernelspec that starts the env's kernel through the hpcai-env provisioner: for every server of this
    install (under its prefix) for a site env, for you alone for yours."""
    store = EnvStore()
    target = store.get(name)
    for note in _shadowing(target.env_dir, store.shadowed(target.env_dir)):
        console.print(note)
    path = kernelspec.install(target, display_name=display_name, user=user or None, prefix=prefix)
    console.print(f"kernel installed: {esc(path)}")


@cli.group()
def spawner() -> None:
    """The hub's Slurm spawner."""


@spawner.command("preview")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=HUB_CONFIG, show_default=True, help="The hub's config file.")
@click.option("--profile", help="Profile name [default: the first].")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="A user option, e.g. nodes=2.")
@click.option("--user", required=True, help="The user the job would run as: the hub's checks are theirs (their unix "
              "account and, where the site keeps accounting, their associations).")
def spawner_preview(config_file: Path, profile: str | None, options: tuple[str, ...], user: str) -> None:
    """Print the batch script the hub would submit, after the same validation."""
    from .spawner.spawner import preview

    values = dict(o.split("=", 1) for o in options if "=" in o)
    bad = [o for o in options if "=" not in o]
    if bad:
        raise HPCAIError(f"--option needs KEY=VALUE, not {bad[0]!r}", "e.g. --option nodes=2")
    if profile:
        values["profile"] = profile
    click.echo(preview(config_file.absolute(), values, user), nl=False)


@cli.group()
def job() -> None:
    """Notebooks as batch jobs."""


@job.command("from-notebook")
@click.argument("notebook", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--cells", "chosen", default="all", show_default=True,
              help="The cells to export: those with this tag (setup cells and %%horovod_run / %%torchrun cells), or all.")
@click.option("--nodes", type=int, help="Nodes [default: 1].")
@click.option("--gpus-per-node", type=int, help="GPUs per node, one rank each [default: 1].")
@click.option("--time", "walltime", help="Walltime, HH:MM:SS [default: 01:00:00].")
@click.option("--partition", help="Partition [default: Slurm's].")
@click.option("--account", help="Account [default: Slurm's].")
@click.option("--env", "env_name", help="The env the job runs in [default: the notebook's kernel's].")
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), help="Where the scripts go [default: "
              "beside the notebook].")
@click.option("--submit", is_flag=True, help="Submit the job and follow its output until it ends (Ctrl-C asks "
              "whether to cancel it).")
def job_from_notebook(notebook: Path, chosen: str, nodes: int | None, gpus_per_node: int | None,
                      walltime: str | None, partition: str | None, account: str | None, env_name: str | None,
                      out_dir: Path | None, submit: bool) -> None:
    """Write an sbatch script and a Python script that run the notebook's chosen cells as a batch job; print the
    sbatch script."""
    from . import export

    spec = export.spec_for(notebook, chosen, env_name, nodes=nodes, gpus_per_node=gpus_per_node, time=walltime,
                           partition=partition, account=account)
    sbatch, script = export.write(spec, out_dir)
    _say(sbatch.read_text())
    console.print(f"wrote {esc(sbatch)} and {esc(script)}")
    if not submit:
        console.print(f"submit it with: sbatch {esc(sbatch)}")
        return
    job = export.submit(spec, sbatch, out_dir)
    console.print(f"submitted job {job.job_id}; its output, {esc(job.output)}:")

    def cancelled() -> None:
        console.print(f"cancelled job {job.job_id}")
        sys.exit(130)

    code = _follow(job, "job", _say, cancelled, cancel_default=False)
    console.print(f"job {job.job_id} ended with exit status {code}")
    sys.exit(code)


def _follow(job: Submitted, what: str, say: Callable[[str], None], cancelled: Callable[[], None],
            cancel_default: bool) -> int:
    """Follow ``job``'s output until it ends, its exit status; Ctrl-C asks whether to cancel it (``cancelled``
    runs then), else following goes on."""
    while True:
        try:
            return job.follow(say)
        except KeyboardInterrupt:
            if click.confirm(f"\ncancel {what} {job.job_id}?", default=cancel_default):
                job.cancel()
                cancelled()
            else:
                console.print(f"{what} {job.job_id} goes on; following its output again")


@cli.group()
def bench() -> None:
    """Benchmarks: the stack's own verification."""


@bench.command("resnet50")
@click.option("--env", "env_name", default="tf-horovod-cpu", show_default=True, help="The env to benchmark.")
@click.option("--framework", type=click.Choice(["horovod", "torch"]), default="horovod", show_default=True,
              help="Horovod on TensorFlow (%%horovod_run), or torch.distributed DDP (%%torchrun).")
@click.option("--partition", default=None, help="Partition [default: the cluster's default].")
@click.option("--nodes", default=1, show_default=True)
@click.option("--gpus-per-node", default=1, show_default=True, help="One rank per GPU (0: CPU ranks, one per task).")
@click.option("--tasks-per-node", default=None, type=int, help="Ranks per node without GPUs [default: --gpus-per-node].")
@click.option("--ranks", default=None, help="Rank counts, e.g. 1,2,4 [default: powers of two up to the job's GPUs].")
@click.option("--time", "time_limit", default="01:00:00", show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=Path("bench-results"), show_default=True)
@click.option("--batch", default=32, show_default=True, help="Images per rank per step.")
@click.option("--steps", default=50, show_default=True)
@click.option("--warmup", default=10, show_default=True)
@click.option("--mixed-precision", is_flag=True)
@click.option("--xla", is_flag=True)
@click.option("--image-size", default=224, show_default=True, help="Square image size in pixels.")
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), help="Real-data mode.")
def bench_resnet50(env_name: str, framework: str, partition: str | None, nodes: int, gpus_per_node: int, tasks_per_node: int | None,
                   ranks: str | None, time_limit: str, results: Path, batch: int, steps: int, warmup: int,
                   mixed_precision: bool, xla: bool, image_size: int, data_dir: Path | None) -> None:
    """ResNet-50 at 1, 2, 4, ... ranks, through plain srun and %%horovod_run engines, in one Slurm job."""
    from .bench.submit import submit_resnet50

    train = ["--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup), "--image-size", str(image_size)]
    train += ["--mixed-precision"] * mixed_precision + ["--xla"] * xla
    train += ["--data-dir", str(data_dir.absolute())] if data_dir else []
    code = submit_resnet50(EnvStore().get(env_name), results.absolute(), train, partition=partition, nodes=nodes,
                           gpus_per_node=gpus_per_node, tasks_per_node=tasks_per_node or max(gpus_per_node, 1),
                           ranks=ranks, time_limit=time_limit, framework=framework,
                           on_line=_say)
    if code:
        raise HPCAIError(f"the benchmark job failed (exit status {code})", "see its output above")


@bench.command("overhead")
@click.option("--env", "env_name", default="tf-horovod-cpu", show_default=True)
@click.option("--partition", default=None)
@click.option("--nodes", default=2, show_default=True)
@click.option("--gpus-per-node", default=2, show_default=True)
@click.option("--time", "time_limit", default="00:30:00", show_default=True)
@click.option("--times", default=3, show_default=True, type=click.IntRange(min=3),
              help="Runs of each way to Horovod-ready engines (alternating).")
@click.option("--breakdown", is_flag=True, help="Also print where the time to Horovod-ready engines goes.")
@click.option("--results", type=click.Path(path_type=Path), default=Path("bench-results"), show_default=True)
def bench_overhead(env_name: str, partition: str | None, nodes: int, gpus_per_node: int, time_limit: str,
                   times: int, breakdown: bool, results: Path) -> None:
    """Each layer's cost against its baselines, in one job: kernel start, engine start (bare srun, ipyparallel's
    MPI launcher, ours), dispatch latency (%%px)."""
    from .bench.submit import submit_overhead

    code = submit_overhead(EnvStore().get(env_name), results.absolute(), partition=partition, nodes=nodes,
                           gpus_per_node=gpus_per_node, time_limit=time_limit, on_line=_say, times=times,
                           breakdown=breakdown)
    if code:
        raise HPCAIError(f"the overhead job failed (exit status {code})", "see its output above")


@cli.group()
def site() -> None:
    """The site's install, on the hub host: write its config (init), check it (check)."""


@site.command("init")
@click.option("--hub-config", type=click.Path(dir_okay=False, path_type=Path), default=HUB_CONFIG,
              show_default=True, help="Where the hub's config goes.")
@click.option("--site-config", type=click.Path(dir_okay=False, path_type=Path), default=paths.SITE_CONFIG,
              show_default=True, help="Where the site config goes (kernels and hpcai read it; HPCAI_CONFIG elsewhere).")
@click.option("--bind-url", default="http://127.0.0.1:8000", show_default=True,
              help="Where the hub listens (JupyterHub.bind_url): https, or loopback http behind a TLS proxy.")
@click.option("--public-url", default="", help="The URL users open, https://HOST (a port may follow); each user's "
              "server gets <user>.HOST (JupyterHub.subdomain_host) [default: the bind URL's host when it names one, else "
              "https:// and this host's full name].")
@click.option("--allowed-group", "allowed_groups", multiple=True,
              help="A unix group whose members may log in (repeat for more) [default: none yet: nobody].")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=STATE_DIR,
              show_default=True, help="The hub's database, cookie secret and proxy pid file (made 0700).")
@click.option("--env-root", "env_roots", multiple=True, type=click.Path(file_okay=False, path_type=Path),
              help="A folder of site environments (repeat for more) [default: the current site roots].")
@click.option("--force", is_flag=True, help="Replace existing files (each kept as FILE.YYYYmmdd-HHMMSS.bak).")
@click.option("--print", "show", is_flag=True, help="Print both files instead of writing them.")
def site_init(hub_config: Path, site_config: Path, bind_url: str, public_url: str, allowed_groups: tuple[str, ...],
              state_dir: Path, env_roots: tuple[Path, ...], force: bool, show: bool) -> None:
    """Write the hub's config and the site config for this cluster: the hub's address on the nodes' network and
    profiles from the GPU partitions (sinfo) filled in, every HPCSlurmSpawner setting listed commented with its
    help. Review the lines marked EDIT, then run: hpcai site check --config HUB_CONFIG --user SOMEONE."""
    from . import siteinit

    site = siteinit.detect(bind_url, state_dir.absolute(), [r.absolute() for r in env_roots] or paths.site_env_roots(),
                           list(allowed_groups), public_url)
    files = [(hub_config, siteinit.hub_config(site), 0o600), (site_config, siteinit.site_config(site), 0o644)]
    if show:
        for path, text, _ in files:
            click.echo(f"# ==> {path} <==\n{text}")
        return
    siteinit.state_folder(state_dir)
    for path, text, mode in files:
        backup = siteinit.write(path, text, mode, force)
        console.print(f"wrote {esc(path)}" + (f" (the old one: {esc(backup)})" if backup else ""))
    if not allowed_groups:
        console.print("[yellow]nobody may log in yet:[/] name the groups in PAMAuthenticator.allowed_groups (or "
                      "run again with --allowed-group GROUP --force)")
    console.print(f"hub address on the nodes' network: {esc(site.hub_ip)} (route to {esc(site.first_node)}); "
                  f"profiles from: {esc(', '.join(p.name for p in site.partitions))}")
    console.print(f"one origin per user: {esc(siteinit.origins(site.public_url))}")
    console.print(f"next: review the EDIT lines, then hpcai site check --config {esc(hub_config)} --user SOMEONE; "
                  f"start the hub with: jupyterhub -f {esc(hub_config)}")


@site.command("check")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="The hub's config (jupyterhub_config.py).")
@click.option("--user", required=True, help="A user of the cluster to run the checks as (their jobs, their rights).")
@click.option("--partition", help="Where the small job runs (a debug partition starts it at once on a busy "
                                  "cluster) [default: the first profile's with GPUs].")
@json_option
def site_check(config_file: Path, user: str, partition: str | None, as_json: bool) -> None:
    """Check the hub host: the hub's config, the Slurm client and munge, the commands the hub runs as USER, the
    proxy, the env roots, the GPU partitions' sharing, and one small job as USER (a node reaches the hub's API,
    runs Spawner.cmd, offers this host's kernels and runs a cell in one; ptrace scope, GPUs). Exits 1 when a check
    fails; a warning (a feature weakened) does not.

    With --json: a list with one object per check, keys name, passed, detail, fix and severity (what a check that
    did not pass means: "fail" or "warn").
    """
    from . import sitecheck

    checks = sitecheck.run(config_file.absolute(), user, partition)
    said = {"fail": "[red]FAIL[/]", "warn": "[yellow]WARN[/]"}
    lines = [f"[green]PASS[/] {esc(c.name)}: {esc(c.detail)}" if c.passed else
             f"{said[c.severity]} {esc(c.name)}: {esc(c.detail)}\n     [yellow]fix:[/] {esc(c.fix)}" for c in checks]
    _emit(as_json, [asdict(c) for c in checks], *lines)
    if any(not c.passed and c.severity == "fail" for c in checks):
        sys.exit(1)


@cli.command()
@click.argument("job", required=False)
@click.option("--follow", "-f", is_flag=True, help="Go on printing what the job writes until it ends.")
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), default=joblog.DEFAULT_DIR,
              show_default=True, help="Where the hub's jobs write their logs (the site's HPCSlurmSpawner.job_log_dir).")
def logs(job: str | None, follow: bool, folder: Path) -> None:
    """Print the log of your latest notebook server job, or of JOB (its path first, on stderr; once the job has
    ended, how it ended, from Slurm's accounting, last)."""
    path = joblog.find(folder, job)
    click.echo(f"==> {path} <==", err=True)
    if follow:
        joblog.follow(path, lambda text: click.echo(text, nl=False))
    else:
        click.echo(path.read_text(errors="replace"), nl=False)
    said = joblog.ending(path)
    if said:
        click.echo(f"==> {said}", err=True)


@cli.command()
@click.option("--check", is_flag=True, help="Walk the whole path headless and print each step's result.")
@click.option("--stop", is_flag=True, help="Stop the hub, its proxy, the servers' jobs and the dev cluster.")
def demo(check: bool, stop: bool) -> None:
    """The main job: dev cluster, tf-horovod-cpu env and kernel, a hub with a demo user (--stop ends it all)."""
    from .demo import DEMO_USER, prepare, timed
    from .demo import check as walk
    from .demo import stop as stop_demo

    if stop:
        stop_demo(_say)
        return
    with timed(_say, "ready"):
        hub = prepare(_say)
    console.print(f"\n[bold]JupyterHub: {esc(hub.url)}[/]  (from your machine: ssh -L {hub.port}:127.0.0.1:{hub.port} "
                  "this-host, then open that URL: browsers resolve *.localhost to loopback)")
    console.print(f"[bold]login:[/] {DEMO_USER}   [bold]password:[/] {esc(hub.password)}   (hub log: {esc(hub.log)})")
    console.print("Pick the profile '2 nodes x 2 GPUs': JupyterLab opens demo.ipynb (a copy of examples/demo.ipynb in "
                  "your home); run its cells. Stop it all with: hpcai demo --stop")
    if check:
        with timed(_say, "the check"):
            failed = walk(hub, _say)
        if failed:
            raise HPCAIError(f"{failed} step(s) of the check failed", f"see the hub log: {hub.log}")
        console.print("[green]the whole path works[/]")


def main() -> None:
    """Console entry point: user-facing errors print without a traceback."""
    try:
        cli(standalone_mode=False)
    except HPCAIError as err:
        console.print(f"[bold red]error:[/] {esc(err.message)}")
        if err.hint:
            console.print(f"[yellow]hint:[/] {esc(err.hint)}")
        sys.exit(1)
    except click.exceptions.Abort:
        console.print("aborted")
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
