"""The `hpcai` command: a thin layer over the Python API."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .devcluster import DevCluster
from .errors import HPCAIError

console = Console()
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
@state_dir_option
def devcluster_up(nodes: int, gpus_per_node: int, port: int, state_dir: Path | None) -> None:
    """Start the dev cluster (harmless when it already runs) and wait until every node is idle."""
    kwargs = {"state_dir": state_dir} if state_dir else {}
    cluster = DevCluster(nodes=nodes, gpus_per_node=gpus_per_node, port=port, **kwargs)
    with console.status("starting munge, slurmctld and the slurmds..."):
        cluster.up()
    _show_status(cluster)
    console.print(f"\nTo use it from a shell: [bold]export SLURM_CONF={cluster.conf}[/]")


@devcluster.command("status")
@state_dir_option
def devcluster_status(state_dir: Path | None) -> None:
    """Show the daemons and the nodes."""
    _show_status(DevCluster.load(state_dir))


@devcluster.command("env")
@state_dir_option
def devcluster_env(state_dir: Path | None) -> None:
    """Print the export lines a shell needs: eval "$(hpcai devcluster env)"."""
    for key, value in DevCluster.load(state_dir).variables().items():
        click.echo(f"export {key}={value}")


@devcluster.command("down")
@state_dir_option
def devcluster_down(state_dir: Path | None) -> None:
    """Cancel every job and stop every daemon (harmless when nothing runs)."""
    DevCluster.load(state_dir).down()
    console.print("dev cluster stopped")


def _show_status(cluster: DevCluster) -> None:
    status = cluster.status()
    daemons = Table("daemon", "pid", title=f"dev cluster in {status['state_dir']}")
    for name, pid in status["daemons"].items():  # type: ignore[union-attr]
        daemons.add_row(name, str(pid) if pid else "[red]not running[/]")
    console.print(daemons)
    if status["nodes"]:
        nodes = Table("node", "state", "partitions", "cpus", "gpus")
        for n in status["nodes"]:  # type: ignore[union-attr]
            colour = "green" if n.usable else "red"
            nodes.add_row(n.name, f"[{colour}]{n.state}[/]", ",".join(n.partitions), str(n.cpus), str(n.gpus))
        console.print(nodes)


@cli.command()
def demo() -> None:
    """The main job: bring the dev cluster up and show it."""
    cluster = DevCluster.load()
    with console.status("starting the dev cluster..."):
        cluster.up()
    _show_status(cluster)


def main() -> None:
    """Console entry point: user-facing errors print without a traceback."""
    try:
        cli(standalone_mode=False)
    except HPCAIError as err:
        console.print(f"[bold red]error:[/] {err.message}")
        if err.hint:
            console.print(f"[yellow]hint:[/] {err.hint}")
        sys.exit(1)
    except click.exceptions.Abort:
        console.print("aborted")
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
