"""`hpcai site check` on the dev cluster: everything passes as set up; seven faults an admin meets fail, each with
what to do, and nothing else does: the nodes cannot reach hub_connect_ip, an env root users cannot read, no proxy,
every user's server on the hub's own origin; Spawner.cmd in a folder of the login node's own, a kernelspec there too,
a site env whose jupyter-hpcai came from a package index. The dev cluster's nodes see /usr/local empty, as a site's
nodes do not have its login node's local software."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers.hub import USER, ensure_user
from jupyter_hpcai import kernelspec
from jupyter_hpcai.envs import Builder, EnvStore, load_recipe, open_env

pytestmark = pytest.mark.slurm
DEMO = Path(__file__).resolve().parents[1] / "spawner_config" / "demo_config.py"
HPCAI = str(Path(sys.executable).parent / "hpcai")


def _check(config: Path, environ: dict[str, str]) -> tuple[int, dict[str, dict[str, object]]]:
    mine = {k: v for k, v in os.environ.items() if k != "JUPYTER_PATH"}  # other tests' kernels, not the site's
    done = subprocess.run([HPCAI, "site", "check", "--config", str(config), "--user", USER, "--json"],
                          capture_output=True, text=True, timeout=600, env={**mine, **environ})
    return done.returncode, {c["name"]: c for c in json.loads(done.stdout)}


def test_site_check_finds_four_faults(devcluster, tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ensure_user(USER)
    code, checks = _check(DEMO, {})  # control: the dev cluster as set up
    warned = {name: c for name, c in checks.items() if not c["passed"]}
    assert code == 0 and all(c["severity"] == "warn" for c in warned.values()), checks
    # its partitions let several users' jobs share a node: said, as a warning, with the fix
    assert sorted(warned) == ["partition debug keeps users apart", "partition gpu keeps users apart"], warned
    assert all("ExclusiveUser=YES" in str(c["fix"]) for c in warned.values()), warned
    assert any(name.startswith("a node reaches the hub's API") for name in checks) and "Slurm hands out GPUs" in checks
    unused = ipaddress.ip_network(devcluster.network)[250]  # in the dev cluster's own network, held by no host
    last = "jupyter_hpcai.spawner.compat.check(c)"
    broken = tmp_path / "jupyterhub_config.py"
    broken.write_text(DEMO.read_text().replace(last, f"c.JupyterHub.hub_connect_ip = '{unused}'\n"
                                               "c.ConfigurableHTTPProxy.command = ['/nonexistent/chp']\n"
                                               "c.JupyterHub.subdomain_host = ''\n" + last))
    private = tmp_path / "envs"
    private.mkdir(mode=0o700)
    code, checks = _check(broken, {"HPCAI_ENV_PATH": str(private)})
    failed = {name: c for name, c in checks.items() if not c["passed"] and c["severity"] == "fail"}
    reach = next(name for name in failed if name.startswith(f"a node reaches the hub's API at {unused}:"))
    assert code == 1 and sorted(failed) == sorted([reach, f"env root {private} readable by {USER}",
                                                   "configurable-http-proxy", "one origin per user"]), failed
    assert "subdomain_host" in str(failed["one origin per user"]["fix"])
    assert "take their account" in str(failed["one origin per user"]["detail"])
    assert "hub_connect_ip" in str(failed[reach]["fix"])
    assert f"chmod o+rx {private}" in str(failed[f"env root {private} readable by {USER}"]["fix"])
    assert "ConfigurableHTTPProxy.command" in str(failed["configurable-http-proxy"]["fix"])


def test_site_check_finds_what_the_nodes_lack(devcluster, tf_env, small_recipe: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The servers' software where only the login node has it, and a site env's jupyter-hpcai from an index."""
    ensure_user(USER)
    login_only = Path(tempfile.mkdtemp(prefix="hpcai-check-", dir="/usr/local"))  # the nodes see /usr/local empty
    root = Path(tempfile.mkdtemp(prefix="hpcai-check-envs-", dir="/var/tmp"))  # a site root every user reads
    root.chmod(0o755)
    try:
        small_env = Builder(load_recipe(small_recipe), store=EnvStore(root)).run().env_dir
        (login_only / "bin").mkdir()
        for name in ("jupyterhub-singleuser", "python"):
            (login_only / "bin" / name).symlink_to(Path(sys.prefix) / "bin" / name)
        spec = Path("/usr/local/share/jupyter/kernels") / f"hpcai-{login_only.name}"  # the system path: the host's
        spec.mkdir(parents=True)
        shutil.copy(Path(kernelspec.install(open_env(tf_env))) / "kernel.json", spec / "kernel.json")
        # a site env built by an earlier version from a recipe that named the product bare: its lock says so
        lock = small_env.current().meta / "lock.json"
        written = json.loads(lock.read_text())
        lock.write_text(json.dumps({**written, "pip": [*written["pip"], "jupyter-hpcai==0.1.0"]}))
        site = {"HPCAI_ENV_PATH": str(root)}
        code, checks = _check(DEMO, site)
        failed = {name: c for name, c in checks.items() if not c["passed"] and c["severity"] == "fail"}
        assert code == 1 and sorted(failed) == ["site envs install jupyter-hpcai from the site's own copy",
                                                "the nodes' servers offer the site's kernels"], checks
        kernels = failed["the nodes' servers offer the site's kernels"]
        assert kernels["detail"] == (f"missing on the node: {spec.name} (this host has them in "
                                     "/usr/local/share/jupyter/kernels)"), kernels
        assert "hpcai kernel install NAME" in str(kernels["fix"])
        bare = failed["site envs install jupyter-hpcai from the site's own copy"]
        assert bare["detail"] == f"{small_env.name}: jupyter-hpcai==0.1.0, from a package index", bare
        assert "${HPCAI_PRODUCT}" in str(bare["fix"])
        ran = next(c for name, c in checks.items() if name.startswith("a site env's kernel"))
        assert ran["passed"] and ran["detail"].startswith("ok"), ran  # the tf env's kernel, started on a node
        lock.write_text(json.dumps(written))
        shutil.rmtree(spec)
        moved = tmp_path / "jupyterhub_config.py"
        last = "jupyter_hpcai.spawner.compat.check(c)"
        moved.write_text(DEMO.read_text().replace(last, f"c.Spawner.cmd = ['{login_only}/bin/jupyterhub-singleuser']\n"
                                                  + last))
        code, checks = _check(moved, site)
        failed = {name: c for name, c in checks.items() if not c["passed"] and c["severity"] == "fail"}
        cmd = f"a node runs Spawner.cmd ({login_only}/bin/jupyterhub-singleuser)"
        assert code == 1 and sorted(failed) == [cmd, "the nodes' servers offer the site's kernels"], checks
        assert "No such file or directory" in str(failed[cmd]["detail"]), failed[cmd]
        assert "storage every node sees at the same path" in str(failed[cmd]["fix"])
        assert "did not run there" in str(failed["the nodes' servers offer the site's kernels"]["detail"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(login_only, ignore_errors=True)
        shutil.rmtree(Path("/usr/local/share/jupyter/kernels") / f"hpcai-{login_only.name}", ignore_errors=True)


def test_a_users_job_report_is_read_defensively() -> None:
    """The small job runs as the user, whose processes write to its report too: each key's first line counts (the
    probe's own come first), and a kernel's value only under a kernel's name (it is quoted into the fix printed)."""
    from jupyter_hpcai import sitecheck

    seen = sitecheck._report("hub=connected\ncmd=ok\nkernels=hpcai-a\nkernel=hpcai-a;curl${IFS}x|sh ok\n"
                             "hub=refused\ncmd=forged\n")
    assert seen == {"hub": "connected", "cmd": "ok", "kernels": "hpcai-a"}, seen
    assert sitecheck._report("kernel=hpcai-tf ok\n") == {"kernel": "hpcai-tf ok"}
