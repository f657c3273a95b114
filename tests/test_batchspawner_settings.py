"""batchspawner's settings under HPCSlurmSpawner: each one reaches the job script, or stops the hub with its name and
what to use instead; none is accepted and ignored (an admin moving from batchspawner's SlurmSpawner sets them)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
from batchspawner import SlurmSpawner
from traitlets.config import Config

from helpers.hub import USER, ensure_user
from helpers.jupyter import free_port
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.spawner import compat
from jupyter_hpcai.spawner.spawner import HPCSlurmSpawner, offline_spawner, one_address

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "spawner_config" / "demo_config.py"
PROFILE = {"profile": "1 node, 1 GPU (debug)"}


def test_every_batchspawner_setting_is_mapped_or_refused() -> None:
    """A setting batchspawner adds later fails here until it is mapped or refused."""
    names = {n for n in SlurmSpawner.class_trait_names(config=True)
             if n.startswith(("req_", "batch_", "state_")) or n == "exec_prefix"}
    assert names - {*compat.SBATCH, *compat.USED, *compat.REFUSED} == set()


def _replaced(cls: type) -> set[str]:
    """The methods and settings of batchspawner's SlurmSpawner (JupyterHub's Spawner's among them) that a method of
    ``cls`` or of its other bases (the mixins) defines again."""
    theirs = {name for base in SlurmSpawner.__mro__ for name in vars(base)}
    ours = {name for base in cls.__mro__ if base not in SlurmSpawner.__mro__
            for name, value in vars(base).items() if inspect.isfunction(value)}
    return ours & theirs


def test_the_spawner_says_in_one_place_which_of_batchspawners_methods_it_replaces() -> None:
    assert "start" in _replaced(HPCSlurmSpawner) and "poll" in _replaced(HPCSlurmSpawner)  # the walk finds them
    assert _replaced(HPCSlurmSpawner) == set(HPCSlurmSpawner.REPLACES), "HPCSlurmSpawner.REPLACES is not the list"

    class Stopping(HPCSlurmSpawner):  # control: one more replaced method, not in the list
        async def stop(self, now: bool = False) -> None: ...

    assert _replaced(Stopping) - set(Stopping.REPLACES) == {"stop"}


def test_a_hub_config_must_register_our_api_and_never_gets_batchspawners() -> None:
    """The hub's config registers the hub's API (hub_api.register()); a config with HPCSlurmSpawner that does not
    stops the hub (no server could report its port). batchspawner's own handler, which would let a server set any
    spawner attribute, is never served: taken out of the hub's handlers, and its class answers as ours."""
    import batchspawner.api
    from jupyterhub.apihandlers import default_handlers

    from jupyter_hpcai.spawner import hub_api

    before = list(default_handlers)
    try:
        default_handlers[:] = [h for h in default_handlers if h not in hub_api.HANDLERS]
        default_handlers.append((r"/api/batchspawner", batchspawner.api.BatchSpawnerAPIHandler))  # as its import does
        for spawner_class in ("jupyter_hpcai.spawner.HPCSlurmSpawner", type("Site", (HPCSlurmSpawner,), {})):
            config = Config()
            config.JupyterHub.spawner_class = spawner_class
            with pytest.raises(HPCAIError) as refused:
                compat.check(config)
            assert "does not register jupyter-hpcai's hub API" in refused.value.message
            assert refused.value.hint == "add to it: jupyter_hpcai.spawner.hub_api.register()"
        other = Config()
        other.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
        compat.check(other)  # another spawner's hub: not ours to check
        hub_api.register()
        compat.check(config)
        assert not any(h[1] is batchspawner.api.BatchSpawnerAPIHandler for h in default_handlers)
        default_handlers.insert(0, (r"/api/hpcai/extend", batchspawner.api.BatchSpawnerAPIHandler))  # shadowed
        assert not hub_api.registered()
    finally:
        default_handlers[:] = before
    # a hub that routed to batchspawner's class before this package was imported gets our checks from it
    assert batchspawner.api.BatchSpawnerAPIHandler.post is hub_api.PortHandler.post


def test_internal_ssl_stops_the_hub() -> None:
    """The hub's check of what answers on a server's port speaks plain HTTP: with internal_ssl it would never pass."""
    config = Config()
    config.JupyterHub.spawner_class = "jupyter_hpcai.spawner.HPCSlurmSpawner"
    config.JupyterHub.internal_ssl = True
    with pytest.raises(HPCAIError, match="internal_ssl is not supported"):
        compat.check(config)


@pytest.mark.parametrize("name", sorted(compat.REFUSED))
def test_a_setting_hpcslurmspawner_does_not_use_stops_the_hub(name: str) -> None:
    config = Config()
    config.SlurmSpawner[name] = "x"
    with pytest.raises(HPCAIError) as refused:
        compat.check(config)
    assert f"c.SlurmSpawner.{name} is batchspawner's" in refused.value.message
    assert refused.value.hint.startswith("remove it; use instead:")


@pytest.mark.parametrize(("value", "why"), [("--exclusive oops", "no option"), ("--comment='a b'", "one #SBATCH word"),
                                            ("--x\n#SBATCH --y", "no option"), ("--comment='a\nb'", "one #SBATCH word"),
                                            ("'unclosed", "split")])
def test_site_options_that_cannot_be_sbatch_lines_stop_the_hub(value: str, why: str) -> None:
    config = Config()
    config.HPCSlurmSpawner.req_options = value
    with pytest.raises(HPCAIError, match=why):
        compat.check(config)


@pytest.mark.parametrize("option", ["--nodes=4", "-N4", "-o/tmp/x", "--output=/tmp/x", "--gpus-per-node=8", "--partition=gpu",
                                    "--account=other", "--time=7-00:00:00", "--export=ALL"])
def test_site_options_may_not_change_what_the_hub_writes_itself(option: str) -> None:
    """Else the job would differ from the one the hub tracks and extends, or its log go elsewhere."""
    config = Config()
    config.SlurmSpawner.req_options = f"--exclusive {option}"
    with pytest.raises(HPCAIError, match="which the hub writes itself"):
        compat.check(config)


@pytest.mark.parametrize("value", ["", ".", "/scratch/logs"])
def test_a_job_log_folder_shared_by_users_stops_the_hub(value: str) -> None:
    config = Config()
    config.HPCSlurmSpawner.job_log_dir = value
    with pytest.raises(HPCAIError, match="not a folder of its own for each user"):
        compat.check(config)
    config.HPCSlurmSpawner.job_log_dir = "/scratch/{username}/logs"  # control
    compat.check(config)


def _spawner(tmp_path: Path, settings: str):  # type: ignore[no-untyped-def]
    """The demo hub's spawner for alice, with ``settings`` (config lines) after the demo config."""
    conf = tmp_path / "conf.py"
    conf.write_text(f"c = get_config()\nload_subconfig({str(DEMO)!r})\n{settings}\n")
    spawner = offline_spawner(conf, USER)
    spawner.user_options = spawner._checked(PROFILE)
    return spawner


@pytest.mark.parametrize(("settings", "launcher"), [
    ("", f"{sys.prefix}/bin/hpcai-singleuser"),  # the demo's cmd: beside its jupyterhub-singleuser
    ('c.Spawner.cmd = ["jupyterhub-singleuser"]', "hpcai-singleuser"),  # a bare name: the job's PATH
    ('c.HPCSlurmSpawner.server_launcher = "/site/bin/start-server"', "/site/bin/start-server"),
])
def test_the_server_starts_through_the_launcher_that_reports_once_listening(tmp_path: Path, settings: str,
                                                                            launcher: str) -> None:
    conf = tmp_path / "conf.py"
    conf.write_text(f"c = get_config()\nload_subconfig({str(DEMO)!r})\n{settings}\n")
    assert offline_spawner(conf, USER).launcher() == launcher


def test_the_hub_reaches_a_node_at_one_address() -> None:
    """A NodeAddr that is a name is resolved once, so that the hub's check of a server and the proxy's route go to
    the same address; an IP address stays as it is; a name that does not resolve says so."""
    assert one_address("10.213.0.2") == "10.213.0.2" and one_address("fd00::2") == "fd00::2"
    assert one_address("localhost") in ("127.0.0.1", "::1")
    with pytest.raises(HPCAIError, match="does not resolve on the hub"):
        one_address("no-such-node.invalid")


@pytest.mark.slurm
def test_the_settings_it_uses_reach_the_job_script(devcluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Mapped onto #SBATCH lines, the job's environment and its shell lines; Slurm accepts the script."""
    ensure_user(USER)
    monkeypatch.setenv("HPCAI_SITE_TEST", "kept")
    spawner = _spawner(tmp_path, "\n".join([
        'c.SlurmSpawner.req_memory = "1M"', 'c.SlurmSpawner.req_qos = "normal"',
        'c.SlurmSpawner.req_reservation = "maint"', 'c.SlurmSpawner.req_options = "--exclusive --comment=site-wide"',
        'c.SlurmSpawner.req_prologue = "echo prologue-ran"', 'c.SlurmSpawner.req_epilogue = "echo epilogue-ran"',
        'c.SlurmSpawner.req_keepvars_extra = "HPCAI_SITE_TEST"', 'c.Spawner.env_keep = ["PATH", "HPCAI_SITE_TEST"]']))
    script = spawner.job_script()
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for option in ("--mem=1M", "--qos=normal", "--reservation=maint", "--exclusive", "--comment=site-wide"):
        assert f"#SBATCH {option}" in header, header
    export = next(line for line in header if line.startswith("#SBATCH --export="))
    assert "HPCAI_SITE_TEST" in export.split("=", 1)[1].split(","), export
    lines = script.splitlines()
    launcher = f"{sys.prefix}/bin/hpcai-singleuser {sys.prefix}/bin/jupyterhub-singleuser "  # the same venv's
    server = next(i for i, line in enumerate(lines) if line.endswith(" &") and launcher in line)
    assert lines.index("echo prologue-ran") < server < lines.index("echo epilogue-ran"), script
    # Slurm reads it as a job script (without the reservation and QOS, which this dev cluster does not have)
    tried = script.replace("#SBATCH --reservation=maint\n", "").replace("#SBATCH --qos=normal\n", "")
    accepted = subprocess.run(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", "env",
                               f"SLURM_CONF={os.environ['SLURM_CONF']}", "sbatch", "--test-only"], input=tried,
                              capture_output=True, text=True, timeout=60, cwd="/")
    assert accepted.returncode == 0 and "to start at" in accepted.stderr, accepted.stderr


@pytest.mark.slurm
def test_the_hub_refuses_to_start_with_a_setting_it_would_ignore(devcluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    last = "jupyter_hpcai.spawner.compat.check(c)"
    conf = tmp_path / "conf.py"  # the demo config, with one more setting before its last line
    conf.write_text(DEMO.read_text().replace(last, f"c.SlurmSpawner.req_runtime = '01:00:00'\n{last}"))
    assert "req_runtime" in conf.read_text()
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir(mode=0o700)
    started = subprocess.run([str(Path(sys.executable).parent / "jupyterhub"), "-f", str(conf)], cwd=hub_dir,
                             env={**os.environ, "HPCAI_HUB_DIR": str(hub_dir), "HPCAI_HUB_PORT": str(free_port())},
                             capture_output=True, text=True, timeout=120)
    said = started.stdout + started.stderr
    assert started.returncode != 0 and "c.SlurmSpawner.req_runtime is batchspawner's" in said, said[-2000:]
    assert "the profiles (partition, nodes, gpus_per_node, walltime, account)" in said, said[-2000:]
