"""Hostile input, property-based: spawner options, magic arguments, recipes and env names through the Python API,
the `hpcai` command (as a subprocess) and the hub's REST API. Every case is either accepted and valid, or
rejected with a clear message; never a traceback, never a shell or #SBATCH injection.

Crashes are counted, not raised, so that the printed figure is the real one; the last test fails when any case
crashed, with the first of them."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_hpcai.engines.launch import plan
from jupyter_hpcai.envs import EnvStore
from jupyter_hpcai.envs.recipe import parse_recipe
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.magic_args import hpc_parser, parse, run_parser
from jupyter_hpcai.scheduler.interface import Partition
from jupyter_hpcai.spawner.options import OptionsError, Profile, merge_limits, validate
from jupyter_hpcai.spawner.script import render

CASES = 2500

# The cases' tally is this process's, and the file's last test (the hub's) reads it: scripts/test.sh hands a whole file
# to one process.
TALLY: Counter[str] = Counter()
CRASHES: list[str] = []
NASTY = st.sampled_from(["\n#SBATCH --uid=0", "; rm -rf ~", "$(reboot)", "`id`", "a b", "../../etc", "\x00", "é",
                         "--partition=gpu", "99999999999999999999", "-1", "1e3", "0x10", "", " ", "gpu\r", "'\"", "%j",
                         "[/x]", "[bold]", "[rank 0 n1]", "x\n", "tf\n", "%s%n", "{username}"])
TEXT = st.one_of(st.text(max_size=40), NASTY, st.integers(-10**6, 10**6).map(str))
VALUE = st.one_of(TEXT, st.integers(-10**9, 10**9), st.none(), st.booleans(), st.floats(allow_nan=False),
                  st.lists(TEXT, max_size=3))
PROFILES = [Profile(name="debug", partition="debug", nodes=1, gpus_per_node=1, walltime="01:00:00"),
            Profile(name="big", partition="gpu", nodes=2, gpus_per_node=2, walltime="02:00:00", environment="tf")]
LIMITS = merge_limits([Partition("gpu", 2, 2, 4, 8, 86400, True), Partition("debug", 2, 2, 4, 8, 7200)], {})
SBATCH_LINE = re.compile(r"^#SBATCH --[a-z-]+=[A-Za-z0-9_.:,/%+=-]+$")
FIELDS = st.sampled_from(["profile", "partition", "nodes", "gpus_per_node", "walltime", "account", "environment",
                          "uid", "options"])


@pytest.fixture(scope="module", autouse=True)
def tally(bench: list[str]):  # type: ignore[no-untyped-def]
    yield
    tried = sum(TALLY.values())
    bench.append(f"hostile inputs: {tried} tried, {TALLY['rejected']} rejected cleanly, {TALLY['accepted']} accepted "
                 f"and valid, {TALLY['crashed']} crashed")


T = TypeVar("T")


def crashed(what: str) -> None:
    TALLY["crashed"] += 1
    CRASHES.append(what[:400])


def attempt(case: Callable[[], T], clear: Callable[[HPCAIError], bool] = lambda e: bool(e.message and e.hint)) -> T | None:
    """One hostile case: its result, or None when it was rejected (counted). An error that says nothing useful,
    or any other exception, is a crash: counted, and reported by test_no_case_crashed."""
    try:
        return case()
    except HPCAIError as err:
        if clear(err):
            TALLY["rejected"] += 1
        else:
            crashed(f"unclear error: {err!r}")
        return None
    except Exception as err:
        crashed(f"{type(err).__name__}: {err}")
        return None


@settings(max_examples=2 * CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(FIELDS, VALUE, max_size=7))
def test_spawner_options(raw: dict[str, object]) -> None:
    valid = attempt(lambda: validate(raw, PROFILES, LIMITS, {"tf": "TF"}),
                    lambda e: isinstance(e, OptionsError) and all(isinstance(m, str) and m for m in e.errors.values()))
    if valid is None:
        return
    options, profile = valid
    script = render(options, profile, user="alice", homedir="/home/alice", keepvars="PATH,JUPYTERHUB_API_TOKEN",
                    cmd=["/venv/bin/jupyterhub-singleuser"])
    sbatch = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert all(SBATCH_LINE.match(ln) for ln in sbatch), sbatch
    assert len(sbatch) == len(set(ln.split("=")[0] for ln in sbatch))  # no option given twice
    env_line = next(ln for ln in script.splitlines() if ln.startswith("export HPCAI_ENV="))
    assert shlex.split(env_line) == ["export", f"HPCAI_ENV={options.environment}"]
    assert not re.search(r"[;`$]|\$\(", "".join(sbatch))
    TALLY["accepted"] += 1


WORDS = st.sampled_from(["start", "stop", "restart", "status", "panel", "-n", "--nodes", "--gpus-per-node",
                         "--launcher", "srun", "mpirun", "local", "local-mpi", "--timeout", "--output", "all", "rank0", "collapse",
                         "--push", "-o", "x", "0", "-3", "4", "1e9", "nan", "'", '"', "--help", "-h", "; id"])


@settings(max_examples=CASES, deadline=None)
@given(st.lists(st.one_of(WORDS, st.text(max_size=12)), max_size=8), st.booleans())
def test_magic_arguments(words: list[str], cell_magic: bool) -> None:
    line = " ".join(words)
    parser = run_parser("%%horovod_run") if cell_magic else hpc_parser()
    args = attempt(lambda: parse(parser, line), lambda e: bool(e.message))
    if args is None:
        return
    if not cell_magic and args.command == "start":  # the layout check is the API's, against an allocation
        try:
            layout = plan(None, n=args.n, nodes=args.nodes, gpus_per_node=args.gpus_per_node, launcher=args.launcher)
            assert layout.n >= 1 and layout.nodes == 1
        except HPCAIError:
            TALLY["rejected"] += 1
            return
    TALLY["accepted"] += 1


RECIPE_KEYS = st.sampled_from(["name", "conda", "python", "pip", "build_env", "no_build_isolation", "modules",
                               "activate", "verify", "build", "channels", "specs", "imports", "commands", "run",
                               "expect", "bogus"])
YAML_VALUE = st.recursive(st.one_of(TEXT, st.integers(), st.none(), st.booleans()),
                          lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.dictionaries(st.one_of(RECIPE_KEYS, TEXT), inner, max_size=3)),
                          max_leaves=12)


@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(RECIPE_KEYS, YAML_VALUE, max_size=6), st.booleans())
def test_recipes(data: dict[str, object], with_name: bool) -> None:
    import yaml

    if with_name:
        data = {"name": "x", **data}
    recipe = attempt(lambda: parse_recipe(yaml.safe_dump(data)))
    if recipe is None:
        return
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", recipe.name)
    assert all("\n" not in v for v in recipe.build_env.values())
    TALLY["accepted"] += 1


@settings(max_examples=CASES // 2, deadline=None)
@given(TEXT)
def test_env_names(name: str) -> None:
    """An env name (from `--name`, a recipe or a kernelspec) becomes a folder, a kernel and a container name."""
    store = EnvStore(Path("/nonexistent/envs"))
    env = attempt(lambda: store.env(name))
    if env is None:
        return
    assert env.path.parent == store.root and env.path.name == name and name not in (".", "..")
    TALLY["accepted"] += 1


# -- the `hpcai` command, as a user runs it ------------------------------------------------------------------------

HPCAI = str(Path(sys.executable).parent / "hpcai")
REPO = Path(__file__).resolve().parents[1]
CLI_CASES = 80


@pytest.fixture(scope="module")
def cli_env(devcluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from helpers.hub import USER, ensure_user

    ensure_user(USER)  # whom the spawner's preview checks the options for
    return {**os.environ, "HPCAI_ENV_ROOT": str(tmp_path_factory.mktemp("hostile-envs")), "COLUMNS": "200"}


def _cli(args: list[str], env: dict[str, str], cwd: Path = REPO) -> None:
    """One CLI case: exit 0 (accepted), or 1 or 2 with an error line (rejected); a traceback or any other exit
    is a crash."""
    done = subprocess.run([HPCAI, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    said = done.stdout + done.stderr
    if "Traceback" in said or done.returncode not in (0, 1, 2):
        crashed(f"hpcai {shlex.join(args)}: exit {done.returncode}: {said[-300:]}")
    elif done.returncode:
        assert re.search(r"^(error|Error):", said, re.M), said  # what went wrong, said plainly
        TALLY["rejected"] += 1
    else:
        TALLY["accepted"] += 1


@settings(max_examples=CLI_CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["recipe", "path", "name", "option"]), TEXT, st.dictionaries(RECIPE_KEYS | TEXT, YAML_VALUE,
                                                                                     max_size=4))
def test_cli(cli_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, kind: str, text: str,
             recipe: dict[str, object]) -> None:
    """Hostile recipes, recipe paths, env names and spawner options, each through the real command."""
    import yaml

    text = text.replace("\x00", "")  # an argument cannot hold a NUL: the OS refuses it before hpcai runs
    if kind == "recipe":
        path = tmp_path_factory.mktemp("recipe") / "hostile.yaml"
        path.write_text(yaml.safe_dump({"name": text, **recipe}))
        _cli(["env", "preflight", str(path)], cli_env)
    elif kind == "path":
        _cli(["env", "build", f"/nonexistent/{text}/recipe.yaml"], cli_env)
    elif kind == "name":
        _cli(["env", "check" if len(text) % 2 else "remove", text or "''"], cli_env)
    else:
        from helpers.hub import USER

        _cli(["spawner", "preview", "--config", "spawner_config/demo_config.py", "--option", f"walltime={text}",
              "--option", f"account={text}", "--user", USER], cli_env)


# -- the hub's REST API ----------------------------------------------------------------------------------------

REST_CASES = 300


@pytest.fixture(scope="module")
def site(hub):  # type: ignore[no-untyped-def]
    """The demo hub's own profiles, limits and environments, for telling valid requests from invalid ones."""
    from traitlets.config import PyFileConfigLoader

    from jupyter_hpcai.scheduler import slurm

    config = PyFileConfigLoader("demo_config.py", str(REPO / "spawner_config")).load_config().HPCSlurmSpawner
    profiles = [Profile(**p) for p in config.profiles]
    return hub, profiles, merge_limits(slurm.partitions(), config.limits), config.environments


@settings(max_examples=REST_CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.filter_too_much,
                                                                           HealthCheck.function_scoped_fixture])
@given(st.dictionaries(FIELDS, VALUE, max_size=6))
def test_rest_spawn_options(site, raw: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    """Every request the validation refuses is refused by the hub too: 400 with the reason, nothing submitted
    (valid ones are left out: they would start real jobs)."""
    from hypothesis import assume

    from helpers.hub import USER

    hub, profiles, limits, environments = site
    try:
        validate(raw, profiles, limits, environments)
        valid = True
    except (HPCAIError, Exception):
        valid = False
    assume(not valid)
    try:
        status, body = hub.api("POST", f"/users/{USER}/server", json.loads(json.dumps(raw)))
    except Exception as err:  # the hub did not answer
        crashed(f"POST {raw!r}: {type(err).__name__}: {err}")
        return
    message = (body or {}).get("message", "") if isinstance(body, dict) else ""
    if status == 400 and message:
        TALLY["rejected"] += 1
    else:
        crashed(f"POST {raw!r}: HTTP {status} {message!r}")
    if hub.server() is not None:  # accepted after all (or still stopping): never leave a job behind
        hub.stop_server()


def test_no_case_crashed(hub) -> None:  # type: ignore[no-untyped-def]
    """Last: nothing above crashed, and no hostile request reached the scheduler."""
    from helpers.hub import USER

    queued = subprocess.run(["squeue", "--noheader", "--user", USER], capture_output=True, text=True, timeout=30).stdout
    assert not queued.strip(), queued
    assert TALLY["crashed"] == 0, f"{TALLY['crashed']} cases crashed; the first: " + "\n".join(CRASHES[:5])
    assert sum(TALLY.values()) > 10_000, TALLY
