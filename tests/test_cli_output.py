"""The CLI in scripts: tables in a pipe keep every name whole, and each listing and status command's --json is
one document with the keys its --help documents."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HPCAI = str(Path(sys.executable).parent / "hpcai")
MANIFESTS = REPO / "tests" / "data" / "manifests"
LONG = "tf-horovod-cpu-with-a-name-longer-than-any-terminal-column-0123"  # 64 characters, the longest allowed

ENV_KEYS = {"name", "scope", "root", "kind", "build", "python", "packages", "note"}
CHECK_KEYS = {"name", "scope", "root", "build", "passed", "warnings", "shadows"}
PREFLIGHT_KEYS = {"facts", "warnings", "problems", "passed"}
FACT_KEYS = {"node", "job_id", "partition", "gpus", "compiler", "cmake", "mpi", "mpicc", "cuda"}
STATUS_KEYS = {"state_dir", "conf", "running", "mode", "note", "login_address", "slurm", "accounting", "daemons", "nodes"}


def _install(root: Path, name: str, manifest: str, verify: dict[str, list[str]] | None = None) -> Path:
    """Env ``name`` under ``root`` from a manifest an earlier build wrote (no channel, no download); with
    ``verify``, a venv env whose python is this one, checking those steps."""
    data = json.loads((MANIFESTS / manifest).read_text())
    build = root / name / "builds" / data["build_id"]
    (build / ".hpcai").mkdir(parents=True)
    if verify is not None:
        data["recipe"]["verify"] = verify
        (build / "bin").mkdir()
        (build / "bin" / "python").symlink_to(sys.executable)
    (build / ".hpcai" / "manifest.json").write_text(json.dumps(data))
    (root / name / "current").symlink_to(Path("builds") / data["build_id"])
    return build


@pytest.fixture
def store(tmp_path: Path) -> dict[str, str]:
    """A user root and a site root: the long-named env, a container env, an env of both (yours shadows the
    site's), an env whose build never finished; the variables that point `hpcai` at them."""
    mine, site = tmp_path / "my-envs", tmp_path / "site-envs"
    _install(mine, LONG, "prefix-2026-12.json")
    _install(mine, "deb", "container-2026-12.json")
    _install(mine, "both", "prefix-2026-12.json", verify={"imports": ["json"], "commands": []})
    _install(site, "both", "conda-2026-12.json")
    (mine / "broken" / "builds" / "unfinished").mkdir(parents=True)
    (mine / "broken" / "current").symlink_to(Path("builds") / "unfinished")
    return {"HPCAI_ENV_ROOT": str(mine), "HPCAI_ENV_PATH": str(site), "HPCAI_CONFIG": str(tmp_path / "none.toml")}


def _hpcai(*args: str, variables: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`hpcai ARGS | cat`: stdout a pipe, as in a script; no COLUMNS to widen it."""
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run(f"{shlex.join([HPCAI, *args])} | cat; exit ${{PIPESTATUS[0]}}", shell=True,
                          executable="/bin/bash", capture_output=True, text=True, timeout=120,
                          env={**environ, **(variables or {})})


def _documented(*command: str) -> str:
    """The command's --help text, on one line."""
    done = _hpcai(*command, "--help")
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_a_piped_env_list_keeps_every_name_whole(store: dict[str, str]) -> None:
    done = _hpcai("env", "list", variables=store)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert f"environments in {store['HPCAI_ENV_ROOT']} (user), {store['HPCAI_ENV_PATH']} (site)" in lines[0]
    row = [line for line in lines if LONG in line]
    whole_row = r"│ user\s+│ venv\s+│ 20261201-121757-805e │ 3\.11\.2\s+│ 0 conda, 94 pip"
    assert len(row) == 1 and re.search(whole_row, row[0]), done.stdout
    assert "…" not in done.stdout, done.stdout
    assert any("ipykernel 7.4.0, ipyparallel 9.2.0, mpi4py 3.1.4" in line for line in lines), done.stdout
    assert any("shadows the site's" in line for line in lines) and any("shadowed by yours" in line for line in lines)
    assert any("has no finished build" in line and "broken" in line for line in lines), done.stdout


def test_env_list_json_has_the_documented_keys(store: dict[str, str]) -> None:
    done = _hpcai("env", "list", "--json", variables=store)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)
    assert [(r["name"], r["scope"]) for r in rows] == [("both", "user"), ("broken", "user"), ("deb", "user"),
                                                        (LONG, "user"), ("both", "site")]
    assert all(set(r) == ENV_KEYS for r in rows), rows
    by_name = {(r["name"], r["scope"]): r for r in rows}
    assert by_name[(LONG, "user")] == {"name": LONG, "scope": "user", "root": store["HPCAI_ENV_ROOT"], "kind": "venv",
                                       "build": "20261201-121757-805e", "python": "3.11.2",
                                       "packages": "0 conda, 94 pip", "note": None}
    assert by_name[("deb", "user")]["kind"] == "container" and by_name[("deb", "user")]["note"] is None
    assert by_name[("both", "user")]["note"] == "shadows the site's"
    assert by_name[("both", "site")]["note"] == "shadowed by yours"
    assert by_name[("both", "site")]["root"] == store["HPCAI_ENV_PATH"]
    broken = by_name[("broken", "user")]
    assert broken["kind"] is None and broken["python"] is None and "has no finished build" in broken["note"]
    help_text = _documented("env", "list")
    assert all(key in help_text for key in ENV_KEYS) and "--json" in help_text


def test_env_check_json_and_its_error_on_stderr(store: dict[str, str]) -> None:
    done = _hpcai("env", "check", "both", "--json", variables=store)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = json.loads(done.stdout)
    assert set(checked) == CHECK_KEYS
    assert checked["name"] == "both" and checked["scope"] == "user" and checked["root"] == store["HPCAI_ENV_ROOT"]
    assert checked["build"] == "20261201-121757-805e" and checked["passed"] == ["import json"]
    assert checked["shadows"] == [store["HPCAI_ENV_PATH"]] and isinstance(checked["warnings"], list)
    assert all(key in _documented("env", "check") for key in CHECK_KEYS)
    shown = _hpcai("env", "check", "both", variables=store)
    assert shown.returncode == 0 and "✓ import json" in shown.stdout and "shadows the site env" in shown.stdout
    missing = _hpcai("env", "check", "nowhere", "--json", variables=store)
    assert missing.returncode == 1 and missing.stdout == "", missing.stdout
    assert "error: no environment named 'nowhere'" in missing.stderr and "hint:" in missing.stderr


def test_env_preflight_json_passed_and_with_problems(tmp_path: Path, store: dict[str, str]) -> None:
    recipe = tmp_path / "plain.yaml"
    recipe.write_text("name: plain\npython: /usr/bin/python3\npip: [six]\n")
    done = _hpcai("env", "preflight", str(recipe), "--json", variables=store)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert set(found) == PREFLIGHT_KEYS and set(found["facts"]) == FACT_KEYS
    assert found["passed"] is True and found["problems"] == [] and found["facts"]["node"]
    recipe.write_text("name: old\npython: /usr/bin/python3\npip: [six]\nbuild: {min_gcc: '99.1'}\n")
    failed = _hpcai("env", "preflight", str(recipe), "--json", variables=store)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    found = json.loads(failed.stdout)
    assert found["passed"] is False and found["problems"]
    assert all(set(p) == {"problem", "fix"} for p in found["problems"])
    assert "99.1" in found["problems"][0]["problem"] and "preflight found" in failed.stderr
    help_text = _documented("env", "preflight")
    assert all(key in help_text for key in PREFLIGHT_KEYS | FACT_KEYS)


def test_devcluster_status_json_where_no_cluster_runs(tmp_path: Path) -> None:
    state = tmp_path / "no-cluster"
    done = _hpcai("devcluster", "status", "--state-dir", str(state), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    status = json.loads(done.stdout)
    assert set(status) == STATUS_KEYS
    assert status["running"] is False and status["nodes"] == [] and status["state_dir"] == str(state)
    assert status["conf"] == str(state / "slurm.conf") and status["mode"] is None
    daemons = ("munged", "slurmctld", "slurmd n1", "slurmd n2", "mariadbd", "slurmdbd")
    assert status["daemons"] == [{"name": name, "pid": None} for name in daemons]
    assert status["slurm"] is None and status["accounting"] is True
    assert all(key in _documented("devcluster", "status") for key in STATUS_KEYS)
    shown = _hpcai("devcluster", "status", "--state-dir", str(state))
    assert shown.returncode == 0 and re.search(r"│ slurmctld\s+│ not running │", shown.stdout), shown.stdout
