"""Hostile input, property-based: spawner options, magic arguments and recipes. Every case is either
accepted and valid, or rejected with a clear message; never a traceback, never a shell or #SBATCH injection."""

from __future__ import annotations

import re
import shlex
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
from jupyter_hpcai.magics import hpc_parser, parse, run_parser
from jupyter_hpcai.slurm import Partition
from jupyter_hpcai.spawner.options import OptionsError, Profile, merge_limits, validate
from jupyter_hpcai.spawner.script import render

CASES = 1500
TALLY: Counter[str] = Counter()
NASTY = st.sampled_from(["\n#SBATCH --uid=0", "; rm -rf ~", "$(reboot)", "`id`", "a b", "../../etc", "\x00", "é",
                         "--partition=gpu", "99999999999999999999", "-1", "1e3", "0x10", "", " ", "gpu\r", "'\"", "%j"])
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


def attempt(case: Callable[[], T], clear: Callable[[HPCAIError], bool] = lambda e: bool(e.message and e.hint)) -> T | None:
    """One hostile case: its result, or None when it was rejected with a clear error (counted). Any other
    exception is a crash: counted, and the test fails."""
    try:
        return case()
    except HPCAIError as err:
        assert clear(err), err
        TALLY["rejected"] += 1
        return None
    except Exception:
        TALLY["crashed"] += 1
        raise


@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
                         "--launcher", "srun", "mpirun", "local", "--timeout", "--output", "all", "rank0", "collapse",
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


@settings(max_examples=CASES // 3, deadline=None)
@given(TEXT)
def test_env_names(name: str) -> None:
    """An env name (from `--name`, a recipe or a kernelspec) becomes a folder, a kernel and a container name."""
    store = EnvStore(Path("/nonexistent/envs"))
    env = attempt(lambda: store.env(name))
    if env is None:
        return
    assert env.dir.parent == store.root and env.dir.name == name and name not in (".", "..")
    TALLY["accepted"] += 1
