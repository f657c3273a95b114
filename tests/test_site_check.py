"""`hpcai site check` on the dev cluster: everything passes as set up; four faults an admin meets (the nodes cannot
reach hub_connect_ip, an env root users cannot read, no proxy, every user's server on the hub's own origin) fail, each
with what to do, and nothing else does."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hub import USER, ensure_user

pytestmark = pytest.mark.slurm
DEMO = Path(__file__).resolve().parents[1] / "spawner_config" / "demo_config.py"
HPCAI = str(Path(sys.executable).parent / "hpcai")


def _check(config: Path, environ: dict[str, str]) -> tuple[int, dict[str, dict[str, object]]]:
    done = subprocess.run([HPCAI, "site", "check", "--config", str(config), "--user", USER, "--json"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **environ})
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
