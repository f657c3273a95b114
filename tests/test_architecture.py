"""The code's shape, checked: no import circle in the package (imports inside functions count: they only hide a
circle), no import back up its layers, and the tests' conftest.py holds fixtures and pytest hooks only, its
helpers in tests/helpers/."""

from __future__ import annotations

import ast
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
    import re

    from jupyter_hpcai.contract import _ROWS, VARIABLES

    assert len(VARIABLES) == len(_ROWS), "a variable is declared twice"

    places = [PACKAGE, REPO / "spawner_config", REPO / "kernels", REPO / "scripts", REPO / "labextension" / "src"]
    used: dict[str, str] = {}
    for place in places:
        for path in place.rglob("*"):
            if path.is_file() and path.suffix in {".py", ".in", ".json", ".sh", ".ts", ".tsx", ".toml"} \
                    and path.name != "contract.py":
                for name in re.findall(r"\bHPCAI_[A-Z0-9_]+\b", path.read_text(errors="replace")):
                    used.setdefault(name, str(path.relative_to(REPO)))
    assert "HPCAI_OWN_JOB_GRACE" in used and "HPCAI_JOB_STATE" in used  # the walk reads the code: a control
    undeclared = {name: where for name, where in used.items() if name not in VARIABLES}
    assert undeclared == {}, f"declare these in jupyter_hpcai/contract.py: {undeclared}"
    assert sorted(set(VARIABLES) - set(used)) == [], "declared but used nowhere: remove them from the contract"


def test_one_place_renders_sbatch_lines() -> None:
    """Every batch script's header comes from jobscript.JobScript: no other module writes an #SBATCH line."""
    import re

    line = re.compile(r"""["'(]#SBATCH |#SBATCH \{""")  # the start of a string that is (or builds) an #SBATCH line
    writers = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py") if line.search(p.read_text()))
    assert writers == ["jupyter_hpcai/jobscript.py"]
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
