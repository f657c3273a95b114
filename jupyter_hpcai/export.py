"""From notebook to batch job: the chosen ``%%horovod_run`` / ``%%torchrun`` cells of a notebook, and the setup
cells whose values they ``--push``, as an sbatch script and a Python script that do what the notebook did.

- The same environment: the build the notebook's kernelspec names (its root, its build id: the exact build,
  with its lock), activated as the hpcai-env provisioner starts a kernel (``envs/run.py``).
- The same launcher and layout: ``srun --mpi=pmix`` with one rank per GPU, block distribution, a failing rank
  ending the step; the same pinning, network and framework init as an engine (``ranks/batch.py``).
- The same output: every line under ``[rank N host]``, rank 0's value as the cell's ``Out``.

``job_script()`` and ``python_script()`` are printable before anything is written or submitted.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engines.launch import Layout
from .errors import HPCAIError
from .magic_args import HelpShown, parse, run_parser
from .network import NODE_ADDRS
from .ranks.batch import MASTER_ADDR_VAR, MASTER_PORT_VAR
from .ranks.frameworks import FRAMEWORKS
from .scheduler import chosen
from .scheduler.allocation import Allocation
from .scheduler.durations import parse_duration
from .scheduler.jobscript import JobScript, Submitted, rank_launch, ranks_per_node

scheduler = chosen()

RANK_MAGICS = {f"%%{framework.magic}": name for name, framework in FRAMEWORKS.items()}  # the cell magic -> framework
ALL = "all"


@dataclass(frozen=True)
class Cell:
    """A notebook cell as the job runs it: a setup cell (the notebook's kernel ran it) or a rank cell."""

    index: int  # 1-based position in the notebook
    code: str  # the body, without a rank cell's magic line, or a setup cell's line magics
    framework: str | None = None  # a rank cell's
    push: tuple[str, ...] = ()
    output: str = "all"
    dropped: tuple[str, ...] = ()  # lines left out (magics that have no meaning in a batch job)


@dataclass(frozen=True)
class EnvRef:
    """The exact build of an env a job runs in."""

    name: str
    root: Path
    build: str

    @classmethod
    def of_kernel(cls, kernel_name: str) -> EnvRef:
        """The env a notebook's hpcai kernelspec starts its kernel in (as the provisioner finds it), current build."""
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

        from .envs import EnvStore

        try:
            spec = KernelSpecManager().get_kernel_spec(kernel_name)
        except NoSuchKernel:
            raise HPCAIError(f"the notebook's kernel '{kernel_name}' is not installed here",
                             "name the env with --env, or install its kernelspec: hpcai kernel install ENV") from None
        config = (spec.metadata.get("kernel_provisioner") or {}).get("config") or {}
        if not config.get("env"):
            raise HPCAIError(f"the notebook's kernel '{kernel_name}' is not an hpcai env's",
                             "name the env the job runs in: --env ENV")
        store = EnvStore.at(Path(config["env_root"])) if config.get("env_root") else EnvStore()
        return cls.of_env(store.find(config["env"]))

    @classmethod
    def named(cls, name: str) -> EnvRef:
        from .envs import EnvStore

        return cls.of_env(EnvStore().find(name))

    @classmethod
    def of_env(cls, env_dir: Any) -> EnvRef:
        build = env_dir.current()
        assert build is not None  # find() returns envs with a current build
        return cls(env_dir.name, env_dir.root.path, build.id)


@dataclass
class JobSpec:
    """What to export: the notebook, its cells, the env and the job's layout."""

    notebook: Path
    cells: list[Cell]
    env: EnvRef
    nodes: int = 1
    gpus_per_node: int = 1
    time: str = "01:00:00"
    partition: str = ""
    account: str = ""
    chosen: str = ALL  # the --cells tag
    exported: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))

    def __post_init__(self) -> None:
        for label, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node)):
            if value < 1:
                raise HPCAIError(f"{label} must be at least 1, not {value}")
        try:
            seconds = parse_duration(self.time)
        except ValueError:
            seconds = None
        if not seconds:
            raise HPCAIError(f"--time {self.time!r} is not a walltime", "use HH:MM:SS, MM:SS or D-HH:MM:SS")
        for label, value in (("--partition", self.partition), ("--account", self.account)):
            if value and not value.replace("-", "").replace("_", "").replace(".", "").isalnum():
                raise HPCAIError(f"{label} {value!r} is not a Slurm name", "letters, digits, '-', '_' and '.' only")
        _one_line("the notebook's name", self.notebook.name,
                  "rename the notebook: no newline, tab or other control character")
        _one_line("--cells", self.chosen, "tag the cells with a name of printable characters")
        _one_line("--time", self.time, "use HH:MM:SS, MM:SS or D-HH:MM:SS")
        _one_line("the env", f"{self.env.name} {self.env.build} {self.env.root}",
                  "export in an env whose name and folder have printable characters only")

    @property
    def framework(self) -> str:
        used = {c.framework for c in self.cells if c.framework}
        if len(used) != 1:
            raise HPCAIError(f"the chosen cells use {' and '.join(sorted(used))}: one job runs one framework",
                             "tag the cells of one framework and export with --cells TAG")
        return used.pop()

    @property
    def magic(self) -> str:
        return f"%%{FRAMEWORKS[self.framework].magic}"

    @property
    def stem(self) -> str:
        return self.notebook.stem.replace(" ", "_")

    def paths(self, folder: Path | None = None) -> tuple[Path, Path]:
        """Where the sbatch script and the Python script go (beside the notebook by default)."""
        folder = folder or self.notebook.parent
        return folder / f"{self.stem}.sbatch", folder / f"{self.stem}_job.py"


def _one_line(label: str, value: str, hint: str) -> None:
    """Refuse a value for the job script's header with a control character in it (a newline would start a
    line, a command, of its own)."""
    if not all(c.isprintable() for c in value):
        raise HPCAIError(f"{label} {value!r} has a control character (or another unprintable one) in it, which the "
                         "job script's header cannot hold", hint)


def read_cells(notebook: Path, chosen: str = ALL) -> list[Cell]:
    """The notebook's code cells tagged ``chosen`` (every one for "all"), as the job runs them."""
    try:
        data = json.loads(notebook.read_text())
        cells = data["cells"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HPCAIError(f"cannot read notebook {notebook}: {err}", "give the path of an .ipynb file") from None
    found = []
    for index, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        if chosen != ALL and chosen not in (cell.get("metadata") or {}).get("tags", []):
            continue
        source = cell.get("source", "")
        found.append(_cell(index, "".join(source) if isinstance(source, list) else source))
    if not any(c.framework for c in found):
        where = "in the notebook" if chosen == ALL else f"tagged '{chosen}'"
        raise HPCAIError(f"no %%horovod_run or %%torchrun cell {where} ({notebook})",
                         "tag the setup and training cells (JupyterLab: the cell's property inspector) and pass "
                         "--cells TAG, or --cells all")
    return [c for c in found if c.code.strip() or c.framework]


def _cell(index: int, source: str) -> Cell:
    first, _, body = source.partition("\n")
    magic = first.split(maxsplit=1)[0] if first.strip() else ""
    if magic in RANK_MAGICS:
        try:
            args = parse(run_parser(magic), first[len(magic):])
        except HelpShown:
            raise HPCAIError(f"cell {index} asks for {magic}'s --help, which a batch job cannot run",
                             "take --help out of the cell's first line") from None
        push = tuple(n.strip() for n in args.push.split(",") if n.strip())
        return Cell(index, body, RANK_MAGICS[magic], push, "all" if args.output in ("collapse", "auto") else args.output)
    if magic.startswith("%%"):
        raise HPCAIError(f"cell {index} is a {magic} cell, which a batch job cannot run",
                         "leave it out of the tag, or write it as Python")
    kept, dropped = [], []
    for line in source.splitlines():
        (dropped if line.lstrip().startswith(("%", "!")) else kept).append(line)
    return Cell(index, "\n".join(kept), dropped=tuple(dropped))


def job_script(spec: JobSpec, python_script: Path, python: str | None = None) -> str:
    """The sbatch script: the layout, the env's exact build, one rank per GPU started by srun."""
    if any(c.isspace() or not c.isprintable() for c in str(python_script.parent)):
        raise HPCAIError(f"{str(python_script.parent)!r} has a space or a control character in it, which the "
                         "job's #SBATCH lines cannot hold",
                         "write the scripts elsewhere: --out-dir DIR (or %hpc export --out-dir DIR)")
    lines = [f"# Exported by hpcai from {spec.notebook.name} (cells: {spec.chosen}) on {spec.exported}: its "
             f"{spec.magic} cells as a batch job.",
             f"# Env {spec.env.name}, build {spec.env.build} in {spec.env.root} (its lock: "
             f"{spec.env.root}/{spec.env.name}/builds/{spec.env.build}), activated as the notebook's kernel is.",
             "set -euo pipefail", f"{scheduler.WHOLE_ENVIRONMENT}  # the ranks get this shell's whole environment"]
    # every node's Slurm address, for each rank to find its interface (network.py), as the kernel gives engines
    lines += scheduler.export_node_addresses(NODE_ADDRS)
    rendezvous = FRAMEWORKS[spec.framework].params is not None
    if rendezvous:  # torch's store: the first node, a port from the job id
        lines += ['first=${addrs[0]}', f"export {MASTER_ADDR_VAR}=${{first#*=}}",
                  f"export {MASTER_PORT_VAR}=$((20000 + {scheduler.JOB_ID_IN_SHELL} % 20000))"]
    run = rank_launch(spec.nodes, spec.gpus_per_node, [
        python or sys.executable, "-m", "jupyter_hpcai.envs.run", "--root", str(spec.env.root), "--build",
        spec.env.build, spec.env.name, "--", str(python_script)])
    # that port is known before the job starts and its store takes no key: a job of several nodes has them to its
    # user alone, so that no other user's job there takes the port first, or serves as the store (as a notebook's)
    exclusive = ("--exclusive=user",) if rendezvous and spec.nodes > 1 else ()
    return JobScript(name=spec.stem, nodes=spec.nodes, tasks_per_node=ranks_per_node(spec.gpus_per_node),
                     gpus_per_node=spec.gpus_per_node, time=spec.time, partition=spec.partition, extra=exclusive,
                     account=spec.account, output=f"{python_script.parent}/{spec.stem}-%j.out",
                     body="\n".join([*lines, run, ""])).render()


def python_script(spec: JobSpec) -> str:
    """The Python script every rank runs: the cells in order, each as the notebook ran it."""
    magic = spec.magic
    out = [f'"""Exported by hpcai from {spec.notebook.name} (cells: {spec.chosen}) on {spec.exported}: what its',
           f"{magic} cells did, on every rank of a batch job (the .sbatch beside it starts one rank per GPU).",
           'Setup cells ran in the notebook\'s kernel: rank 0 runs them, and what a cell --pushes reaches every rank."""',
           "from jupyter_hpcai.ranks.batch import Job", "", f"job = Job({spec.framework!r})"]
    for cell in spec.cells:
        out.append("")
        if cell.framework is None:
            out.append(f"# cell {cell.index}: setup (the notebook's kernel ran it; here rank 0)")
            out += [f"# left out: {line}" for line in cell.dropped]
            if cell.code.strip():
                out.append(f"job.setup({_literal(cell.code)}, cell={cell.index})")
        else:
            options = f", push={cell.push!r}" if cell.push else ""
            options += f", output={cell.output!r}" if cell.output != "all" else ""
            out.append(f"# cell {cell.index}: {magic}" + (f" --push {','.join(cell.push)}" if cell.push else ""))
            out.append(f"job.cell({_literal(cell.code)}, cell={cell.index}{options})")
    return "\n".join(out) + "\n"


def _literal(code: str) -> str:
    """``code`` as a readable raw triple-quoted string where that is exact, else as repr."""
    if "'''" not in code and not code.endswith("\\") and "\r" not in code:
        return f"r'''{code}'''"
    return repr(code)


def write(spec: JobSpec, folder: Path | None = None) -> tuple[Path, Path]:
    """Write both scripts (the sbatch script executable); their paths."""
    sbatch, script = spec.paths(folder)
    _replace(script, python_script(spec))
    _replace(sbatch, job_script(spec, script), 0o755)
    return sbatch, script


def _replace(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``path`` whole through a new file beside it, then os.replace: a link at ``path`` is replaced, never
    followed. The file's mode: ``mode``, else what the umask leaves of 0666."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            if mode is not None:
                os.fchmod(out.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def spec_for(notebook: Path, chosen: str = ALL, env: str | None = None, **layout: Any) -> JobSpec:
    """The export of ``notebook``'s cells tagged ``chosen``, in ``env`` (default: the env its kernelspec names)."""
    notebook = notebook.absolute()
    cells = read_cells(notebook, chosen)
    if env is None:
        kernel = (json.loads(notebook.read_text()).get("metadata") or {}).get("kernelspec", {}).get("name", "")
        if not kernel:
            raise HPCAIError(f"{notebook.name} names no kernel", "name the env the job runs in: --env ENV")
        ref = EnvRef.of_kernel(kernel)
    else:
        ref = EnvRef.named(env)
    return JobSpec(notebook, cells, ref, chosen=chosen, **{k: v for k, v in layout.items() if v is not None})


def job_layout(allocation: Allocation | None, layout: Layout | None) -> dict[str, Any]:
    """An export's layout from the notebook's own job: its engines' layout (else the allocation's), partition,
    account and walltime; None for what it does not say."""
    info = (scheduler.job_info(allocation.job_id) or {}) if allocation else {}
    nodes = layout.nodes if layout else (len(allocation.nodes) if allocation else None)
    per_node = layout.per_node if layout else ((allocation.gpus_per_node or None) if allocation else None)
    return {"nodes": nodes, "gpus_per_node": per_node,
            "time": info.get("TimeLimit") if info.get("TimeLimit", "UNLIMITED") != "UNLIMITED" else None,
            "partition": info.get("Partition"), "account": info.get("Account") or None}


def submit(spec: JobSpec, sbatch: Path, folder: Path | None = None) -> Submitted:
    """sbatch the written script; the job, its output where the script's --output says."""
    job_id = scheduler.submit([str(sbatch)])
    return Submitted(job_id, spec.paths(folder)[1].parent / f"{spec.stem}-{job_id}.out")
