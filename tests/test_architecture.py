"""The code's shape, checked: no import circle in the package (imports inside functions count: they only hide a
circle), no import back up its layers, and the tests' conftest.py holds fixtures and pytest hooks only, its
helpers in tests/helpers/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "jupyter_hpcai"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports anywhere in its file (a package's own parents left out)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            targets.update(f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                           for alias in node.names)
    found = set()
    for target in targets:
        while target not in modules and "." in target:
            target = target.rpartition(".")[0]
        if target in modules and target != name and not name.startswith(target + "."):
            found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_the_package() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["jupyter_hpcai.export"] >= {"jupyter_hpcai.magic_args"}  # the walk sees imports: a control
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # and finds a circle


P = "jupyter_hpcai."
RANKS, KERNEL, HUB, SERVER = [P + "ranks"], [P + "engines"], [P + "spawner"], [P + "server"]
FRONT = [P + name for name in ("magics", "magic_args", "widgets", "guard", "export")]  # the kernel's user side
TOOLS = [P + name for name in ("cli", "demo", "bench", "siteinit", "sitecheck")]
# what each layer must never import: the layers above it, and processes it never runs in
NEVER = {
    P + "contract": [P.rstrip(".")],  # standard library only: a container's ranks import it too
    P + "ranks": KERNEL + FRONT + HUB + SERVER + TOOLS,  # a rank never loads the kernel's code
    P + "engines": FRONT + HUB + SERVER + TOOLS,
    P + "spawner": RANKS + KERNEL + FRONT + SERVER + TOOLS,  # the hub (root) never loads the user's side
    P + "server": FRONT + HUB + TOOLS,
}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} imports {target}" for module, targets in graph.items() for target in targets
                  for layer, never in NEVER.items() if module == layer or module.startswith(layer + ".")
                  if any(target == up or target.startswith(up + ".") for up in never))


def test_no_import_runs_back_up_the_layers() -> None:
    """contract <- ranks <- engines <- magics and the panel; the hub's spawner loads none of the kernel's or
    the ranks' code, and the ranks none of the kernel's."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "jupyter_hpcai.ranks.telemetry" in graph["jupyter_hpcai.engines.running_set"]  # a control
    assert _upward(graph) == []
    bad = {**graph, "jupyter_hpcai.ranks.boot": {"jupyter_hpcai.engines.listing"}}
    assert _upward(bad) == ["jupyter_hpcai.ranks.boot imports jupyter_hpcai.engines.listing"]  # and sees one


def test_conftest_holds_fixtures_and_hooks_only() -> None:
    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    loose = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))
             and not node.name.startswith("pytest_")
             and not any("fixture" in ast.unparse(d) for d in getattr(node, "decorator_list", []))]
    assert loose == [], f"helpers belong in tests/helpers/: {loose}"
    importers = [p.name for p in (REPO / "tests").rglob("*.py") if "from conftest import" in p.read_text()
                 and p.name != "test_architecture.py"]
    assert importers == []


def test_every_hpcai_variable_is_declared_in_the_contract() -> None:
    """Every HPCAI_* name the code (and the files it ships or runs: configs, scripts, the lab extension) uses is a
    row of contract.VARIABLES, saying who sets it and who reads it; and every row is still used."""
    from jupyter_hpcai.contract import _ROWS, VARIABLES

    assert len(VARIABLES) == len(_ROWS), "a variable is declared twice"

    places = [PACKAGE, REPO / "spawner_config", REPO / "kernels", REPO / "scripts", REPO / "labextension" / "src"]
    used: dict[str, str] = {}
    for place in places:
        for path in place.rglob("*"):
            if path.is_file() and path.suffix in {".py", ".in", ".json", ".sh", ".ts", ".tsx", ".toml"}:
                text = path.read_text(errors="replace")
                if path == PACKAGE / "contract.py":  # its own code uses some; its rows declare, they use nothing
                    rows = next(node for node in ast.parse(text).body if isinstance(node, ast.Assign)
                                and ast.unparse(node.targets[0]) == "_ROWS")
                    text = text.replace(ast.get_source_segment(text, rows) or "", "")
                for name in re.findall(r"\bHPCAI_[A-Z0-9_]+\b", text):
                    used.setdefault(name, str(path.relative_to(REPO)))
    assert "HPCAI_OWN_JOB_GRACE" in used and "HPCAI_JOB_STATE" in used  # the walk reads the code: a control
    undeclared = {name: where for name, where in used.items() if name not in VARIABLES}
    assert undeclared == {}, f"declare these in jupyter_hpcai/contract.py: {undeclared}"
    assert sorted(set(VARIABLES) - set(used)) == [], "declared but used nowhere: remove them from the contract"


# The processes (contract.Process) each part of the code runs in; the longest prefix wins, and a part not listed
# (scheduler/, envs/, paths.py, contract.py's own code...) runs in any of them.
PROCESSES: dict[str, set[str]] = {
    "spawner_config/": {"hub"}, "jupyter_hpcai/templates/": {"hub", "cli"},
    "jupyter_hpcai/spawner/": {"hub"}, "jupyter_hpcai/spawner/script.py": {"hub", "job"},
    "jupyter_hpcai/server/": {"server"}, "jupyter_hpcai/provisioner.py": {"server"},
    "jupyter_hpcai/kernelspec.py": {"cli", "server"},
    "jupyter_hpcai/engines/": {"kernel"}, "jupyter_hpcai/engines/warm.py": {"kernel", "job"},
    "jupyter_hpcai/magics.py": {"kernel"}, "jupyter_hpcai/widgets.py": {"kernel"}, "jupyter_hpcai/guard.py": {"kernel"},
    "jupyter_hpcai/hub_client.py": {"kernel"}, "jupyter_hpcai/magic_args.py": {"kernel"},
    "jupyter_hpcai/ranks/": {"rank", "kernel"}, "jupyter_hpcai/container_launch.py": {"rank"},
    "jupyter_hpcai/network.py": {"rank"},
    "jupyter_hpcai/cli.py": {"cli"}, "jupyter_hpcai/siteinit.py": {"cli"}, "jupyter_hpcai/sitecheck.py": {"cli"},
    "jupyter_hpcai/demo.py": {"cli", "hub"}, "jupyter_hpcai/export.py": {"cli", "batch"},
    "jupyter_hpcai/bench/": {"bench"}, "jupyter_hpcai/bench/horovodrun.py": {"bench", "rank"},
    "jupyter_hpcai/devcluster/": {"tests"},
}
CODE_PROCESSES = {"hub", "job", "server", "kernel", "rank", "batch", "cli", "bench"}  # not admin, user, tests
HPCAI_NAME = re.compile(r"\bHPCAI_[A-Z0-9_]+\b")


def _processes_of(path: str) -> set[str]:
    prefix = max((p for p in PROCESSES if path.startswith(p)), key=len, default="")
    return PROCESSES[prefix] if prefix else CODE_PROCESSES | {"tests"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes in ``tree`` (module, class and function docstrings): prose, not code."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _variables_named() -> dict[str, set[str]]:
    """HPCAI_* name -> the files whose code names it: in a string that is not a docstring, or through a module-level
    constant that holds it (``GRACE_VAR = "HPCAI_OWN_JOB_GRACE"``); contract.py's rows aside (they declare)."""
    sources = {p: p.read_text() for p in [*PACKAGE.rglob("*.py"), *(REPO / "spawner_config").rglob("*.py")]}
    constants = {target.id: node.value.value for source in sources.values() for node in ast.parse(source).body
                 if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                 and isinstance(node.value.value, str) and HPCAI_NAME.fullmatch(node.value.value)
                 for target in node.targets if isinstance(target, ast.Name)}
    named: dict[str, set[str]] = {}
    for path, source in sources.items():
        tree = ast.parse(source)
        skip = _docstrings(tree)
        skip |= {id(n.value) for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                 and HPCAI_NAME.fullmatch(str(n.value.value))}  # X_VAR = "HPCAI_X" defines it; X_VAR's uses count
        if path == PACKAGE / "contract.py":
            rows = next(n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_ROWS")
            skip |= {id(n) for n in ast.walk(rows)}
        for node in ast.walk(tree):
            names: set[str] = set()
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                names = set(HPCAI_NAME.findall(node.value))
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in constants:
                names = {constants[node.id]}
            elif isinstance(node, ast.Attribute) and node.attr in constants:
                names = {constants[node.attr]}
            for name in names:
                named.setdefault(name, set()).add(str(path.relative_to(REPO)))
    for path in (PACKAGE / "templates").rglob("*.in"):  # the site's hub config
        for line in path.read_text().splitlines():
            for name in HPCAI_NAME.findall(line.split("#")[0]):
                named.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return named


def _undeclared_processes(variables: dict, named: dict[str, set[str]]) -> list[str]:  # type: ignore[type-arg]
    """Where the rows and the code disagree: code that names a variable in processes its row says neither set nor
    read it; a process its row says reads it, whose code never names it."""
    found = []
    for name, row in variables.items():
        where = named.get(name, set())
        declared = {*row.set_by, *row.read_by}
        found += [f"{name}: {path} runs in {sorted(_processes_of(path))}, its row says {sorted(declared)}"
                  for path in sorted(where) if not _processes_of(path) & declared]
        reached = set().union(*map(_processes_of, where)) if where else set()
        found += [f"{name}: its row says the {process} reads it, and no code of the {process} names it"
                  for process in sorted(set(row.read_by) & CODE_PROCESSES - reached)]
    return found


def test_each_hpcai_variables_row_names_the_processes_whose_code_uses_it() -> None:
    """contract.VARIABLES says who sets and who reads each variable; the code of those processes (PROCESSES) is
    where the name appears, and nowhere else."""
    from dataclasses import replace

    from jupyter_hpcai.contract import VARIABLES

    named = _variables_named()
    assert "jupyter_hpcai/engines/own_job.py" in named["HPCAI_OWN_JOB_GRACE"]  # through GRACE_VAR: the walk sees it
    assert _undeclared_processes(VARIABLES, named) == []
    row = VARIABLES["HPCAI_REST_AFTER"]  # controls: a reader the code never is, and code in a process not declared
    assert _undeclared_processes({row.name: replace(row, read_by=("kernel", "hub"))}, named) == [
        "HPCAI_REST_AFTER: its row says the hub reads it, and no code of the hub names it"]
    assert any("engines/rest.py runs in ['kernel']" in f
               for f in _undeclared_processes({row.name: replace(row, read_by=("rank",))}, named))


LONGEST_CLASS = 300  # lines a reader holds at once (issue 56)


def _long_classes(sources: dict[str, str]) -> list[str]:
    return [f"{path}: {node.name} is {node.end_lineno - node.lineno + 1} lines"  # type: ignore[operator]
            for path, source in sources.items() for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > LONGEST_CLASS]  # type: ignore[operator]


def test_no_class_is_longer_than_a_reader_holds() -> None:
    sources = {str(p.relative_to(REPO)): p.read_text() for p in PACKAGE.rglob("*.py")}
    assert _long_classes(sources) == []
    long = "class Long:\n" + "    x = 1\n" * LONGEST_CLASS  # control: one line over
    assert _long_classes({"long.py": long}) == [f"long.py: Long is {LONGEST_CLASS + 1} lines"]


def test_one_place_renders_sbatch_lines() -> None:
    """Every batch script's header comes from jobscript.JobScript, through the Slurm implementation's ``header``:
    no other module writes an #SBATCH line."""
    import re

    line = re.compile(r"""["'(]#SBATCH |#SBATCH \{""")  # the start of a string that is (or builds) an #SBATCH line
    writers = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py") if line.search(p.read_text()))
    assert writers == ["jupyter_hpcai/scheduler/slurm/script.py"]
    assert line.search('x = f"#SBATCH --nodes={n}"') and line.search("'#SBATCH --x'")  # the pattern sees one


WORKSHOP = ("jupyter_hpcai.devcluster", "jupyter_hpcai.bench")  # the dev cluster and the benchmarks


def _loaded_by(module: str) -> list[str]:
    """The workshop's modules that importing ``module`` loads, in a fresh interpreter."""
    import subprocess
    import sys

    code = (f"import sys, {module}\n"
            f"print(sorted(m for m in sys.modules if m.startswith({WORKSHOP!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          check=True)
    return [m.strip(" '[]") for m in done.stdout.strip().split(",") if m.strip(" '[]")]


def test_the_hpcai_command_loads_the_workshop_for_its_own_commands_only() -> None:
    """`hpcai` loads the dev cluster and the benchmarks only when one of their commands runs; the control: the
    demo, which runs on the dev cluster, loads it."""
    assert _loaded_by("jupyter_hpcai.cli") == []
    assert "jupyter_hpcai.devcluster" in _loaded_by("jupyter_hpcai.demo")


SCHEDULER = PACKAGE / "scheduler"
SLURM = SCHEDULER / "slurm"  # everything this project knows of Slurm
SCHEDULER_COMMANDS = {"srun", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "salloc", "sacct", "sacctmgr",
                      "sdiag", "sstat"}
SCHEDULER_VARIABLE = re.compile(r"\b(?:SLURMD?|SBATCH|SRUN|SALLOC)_[A-Z_]+")
# a command line in a string (at its start, in $(...), after a pipe, a separator or an f-string's {prefix}): the
# command, then an option or a subcommand; prose that names a command ("sinfo lists no node") is not one
SCHEDULER_LINE = re.compile(r"(?:^|\$\(|[|;&]\s*|\}\s+)(?P<command>%s)\s+(?:-|show\b|update\b|ping\b|hostnames\b)"
                            % "|".join(SCHEDULER_COMMANDS))
BEFORE_SEAM = "b157952"  # main before the scheduler had its seam (issue 56)


def _names_the_scheduler(source: str) -> list[str]:
    """Where ``source`` runs a scheduler command (an argument list or tuple that starts with one, a command line in
    a string) or names a scheduler variable in a string (its docstrings and comments aside)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    unpacked = {id(node.value) for node in ast.walk(tree)  # name, kind = "srun", True: values, not a command
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)}
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}  # read whole
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if name := SCHEDULER_VARIABLE.search(node.value):
                found.append(f"line {node.lineno} names {name.group()}")
            elif id(node) not in pieces and (line := SCHEDULER_LINE.search(node.value)):
                found.append(f"line {node.lineno} runs {line['command']}")
        if isinstance(node, ast.JoinedStr):  # f"{as_user} sbatch --test-only": its text, each value a {}
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if line := SCHEDULER_LINE.search(text):
                found.append(f"line {node.lineno} runs {line['command']}")
        if isinstance(node, (ast.List, ast.Tuple)) and id(node) not in unpacked and node.elts \
                and isinstance(node.elts[0], ast.Constant) and node.elts[0].value in SCHEDULER_COMMANDS:
            found.append(f"line {node.lineno} runs {node.elts[0].value}")
    return found


def _naming(files: dict[str, str]) -> dict[str, list[str]]:
    """The package's modules (path -> source) that name the scheduler outside its implementation and the dev
    cluster (the workshop's own Slurm)."""
    return {path: found for path, source in files.items()
            if not path.startswith(("jupyter_hpcai/scheduler/slurm/", "jupyter_hpcai/devcluster/"))
            if (found := _names_the_scheduler(source))}


def _files_at(commit: str) -> dict[str, str] | None:
    """The package's Python files at ``commit``, or None where this clone lacks it."""
    import subprocess

    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "jupyter_hpcai"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        return None
    paths = [p for p in listed.stdout.split() if p.endswith(".py")]
    return {p: subprocess.run(["git", "show", f"{commit}:{p}"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout for p in paths}


def test_the_scheduler_lives_behind_one_seam(bench: list[str]) -> None:
    """Outside jupyter_hpcai/scheduler/slurm/ no module runs a scheduler command or names a scheduler variable (the
    dev cluster, the workshop's own Slurm, aside): adding a scheduler is a package beside it and its line in
    SCHEDULERS. Printed: how many modules name the scheduler, before the seam and now."""
    now = {str(p.relative_to(REPO)): p.read_text() for p in PACKAGE.rglob("*.py")}
    assert _naming(now) == {}, "move these into jupyter_hpcai/scheduler/slurm/"
    inside = {path for path, source in now.items() if path.startswith("jupyter_hpcai/scheduler/slurm/")
              and _names_the_scheduler(source)}
    assert "jupyter_hpcai/scheduler/slurm/commands.py" in inside  # the walk sees the implementation: a control
    outside = '"""a SLURM_PROCID docstring"""\nrun(["squeue", "--me"])\nx = env.get("SLURM_JOB_ID")\n' \
              'y = f"$(scontrol show node {n})"\nz = ("scancel", job)\nw = "sbatch --parsable"\n' \
              'v = "sinfo lists no node"\nu, t = "srun", True\n'
    assert sorted(_names_the_scheduler(outside)) == ["line 2 runs squeue", "line 3 names SLURM_JOB_ID",
                                                     "line 4 runs scontrol", "line 5 runs scancel",
                                                     "line 6 runs sbatch"]  # and one outside; prose, values aside
    before = _files_at(BEFORE_SEAM)
    counted = f"{len(_naming(before))} before the seam ({BEFORE_SEAM})" if before is not None else \
        f"before the seam: {BEFORE_SEAM} is not in this clone"
    bench.append(f"modules that name the scheduler outside its implementation: {len(_naming(now))} now, {counted}; "
                 f"adding one: a package beside jupyter_hpcai/scheduler/slurm/ ({len(inside)} of its "
                 f"{sum(p.startswith('jupyter_hpcai/scheduler/slurm/') for p in now)} modules name Slurm) and "
                 "one line of SCHEDULERS")


def _members(protocol: type) -> set[str]:
    return set(protocol.__annotations__) | {name for name, value in vars(protocol).items()
                                            if callable(value) and not name.startswith("_")}


def _missing(implementation: object) -> list[str]:
    """The members of interface.Scheduler (and of its environment and container client) ``implementation`` lacks."""
    from jupyter_hpcai.scheduler.interface import ContainerClient, JobEnvironment, Scheduler

    missing = [name for name in _members(Scheduler) if not hasattr(implementation, name)]
    for part, protocol in (("environment", JobEnvironment), ("client", ContainerClient)):
        missing += [f"{part}.{name}" for name in _members(protocol) if not hasattr(getattr(implementation, part,
                                                                                        None), name)]
    return sorted(missing)


def test_each_registered_scheduler_is_the_whole_interface_and_chosen_by_configuration(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every module of SCHEDULERS has every member of interface.Scheduler (a control: one without ``submit``
    fails); HPCAI_SCHEDULER chooses among them, and a name none registers is refused with what to set."""
    import importlib
    import types

    import pytest

    from jupyter_hpcai import scheduler
    from jupyter_hpcai.errors import HPCAIError

    for name, module in scheduler.SCHEDULERS.items():
        assert _missing(importlib.import_module(module)) == [], name
    slurm = importlib.import_module(scheduler.SCHEDULERS["slurm"])
    partial = types.SimpleNamespace(**{name: getattr(slurm, name) for name in dir(slurm) if name != "submit"})
    assert _missing(partial) == ["submit"]
    monkeypatch.delenv(scheduler.SCHEDULER_VAR, raising=False)
    assert scheduler.chosen() is slurm
    monkeypatch.setenv(scheduler.SCHEDULER_VAR, "pbs")
    with pytest.raises(HPCAIError, match="HPCAI_SCHEDULER='pbs' names no scheduler") as refused:
        scheduler.chosen()
    assert "slurm" in refused.value.hint


def test_what_a_rank_loads_of_the_scheduler_is_standard_library() -> None:
    """The scheduler package and its chosen implementation load nothing beyond the standard library and the
    package itself (a rank imports them, in containers too); the control: the engines load ipyparallel."""
    import subprocess
    import sys

    def third_party(imports: str) -> list[str]:
        code = (f"import sys\nbefore = set(sys.modules)\n{imports}\n"
                "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                             check=True).stdout
        return [name.strip(" '[]\n") for name in out.split(",") if name.strip(" '[]\n")]

    assert third_party("from jupyter_hpcai.scheduler import allocation, chosen, durations, jobscript\nchosen()") \
        == ["jupyter_hpcai"]
    assert "ipyparallel" in third_party("import jupyter_hpcai.engines.launch")
