"""A site installs jupyter-hpcai from a wheel, with no checkout: the wheel and its `hub` extra in a fresh venv, a site
env built from the wheel, `hpcai site init` writing the hub's config and the site config, a hub started from those
files alone (PAM logins, the dev cluster's Slurm) spawning a 2-node server, JupyterLab loading the side panel's
extension, and a kernel from the site env running `%hpc start` and `%%horovod_run` on 4 ranks."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.hub import CHROMIUM_ARGS, USER, ensure_user
from helpers.jupyter import free_port
from jupyter_hpcai import demo
from jupyter_hpcai.proc import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]
UV = str(Path(sys.executable).parent / "uv")
ENV = "site-tf"


def _run(argv: list[str], env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd="/")
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def site(devcluster) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """A folder every user reads (the venv, the envs and the config live there, as on a shared filesystem)."""
    folder = Path(tempfile.mkdtemp(prefix="hpcai-site-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _installed(site: Path, tmp_path: Path) -> dict[str, str]:
    """The wheel (built from this checkout, as a release would be) in a fresh venv with the hub extra, its recipes
    in it; the environment every later command runs with (no checkout on any path)."""
    _run([UV, "build", "--wheel", "-o", str(tmp_path / "dist"), str(REPO)], dict(os.environ))
    wheel = next((tmp_path / "dist").glob("jupyter_hpcai-*.whl"))
    venv = site / "venv"
    _run([UV, "venv", "-q", str(venv), "--python", "/usr/bin/python3"], dict(os.environ))
    _run([UV, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), f"{wheel}[hub]"], dict(os.environ))
    prefix = os.environ.get("HPCAI_SLURM")  # the dev cluster's own Slurm: its client is the site's
    slurm = [f"{prefix}/bin"] if prefix else []
    env = {"PATH": ":".join([f"{venv}/bin", *slurm, "/usr/local/bin:/usr/bin:/bin"]), "LANG": "C.UTF-8", "HOME": "/root",
           "SLURM_CONF": os.environ["SLURM_CONF"], "HPCAI_CONFIG": str(site / "config.toml")}
    where = _run([str(venv / "bin" / "python"), "-c", "import jupyter_hpcai; print(jupyter_hpcai.__file__)"], env)
    assert where.startswith(f"{venv}/lib/"), where  # from the wheel, not the checkout
    workshop = _run([str(venv / "bin" / "python"), "-c", "import importlib.resources as r; print(sorted(p.name for p "
                     "in r.files('jupyter_hpcai.devcluster').joinpath('templates').iterdir()))"], env)
    assert "slurm.conf" in workshop, workshop  # the workshop ships in the wheel, loaded only by its own commands
    assert "--check" in _run([str(venv / "bin" / "hpcai"), "demo", "--help"], env)
    shipped = _run([str(venv / "bin" / "python"), "-c", "from jupyter_hpcai import paths; "
                    "print(paths.recipes_dir(), paths.product_requirement())"], env).split()
    assert shipped == [f"{venv}/lib/python3.11/site-packages/jupyter_hpcai/recipes", str(wheel)], shipped
    (tmp_path / "dist").chmod(0o755)  # the site env installs the product from the wheel the site installed
    return env


def _site_init(site: Path, env: dict[str, str], port: int, login: str) -> Path:
    """`hpcai site init`, then the files it wrote: a hub config whose every setting is there, commented."""
    config = site / "jupyterhub_config.py"
    said = _run([f"{site}/venv/bin/hpcai", "site", "init", "--hub-config", str(config), "--site-config",
                 str(site / "config.toml"), "--bind-url", f"http://127.0.0.1:{port}",
                 "--public-url", f"http://hub.localhost:{port}",
                 "--state-dir", str(site / "state"), "--allowed-group", USER,
                 "--env-root", str(site / "envs")], env)
    assert f"wrote {config}" in said and f"hub address on the nodes' network: {login}" in said, said
    assert f"one origin per user: the hub at http://hub.localhost:{port}, each user's server at <user>.hub.localhost" \
        in " ".join(said.split()), said
    text = config.read_text()
    assert f"c.JupyterHub.subdomain_host = 'http://hub.localhost:{port}'" in text
    assert "c.JupyterHub.cookie_host_prefix_enabled = True" in text
    for setting in ("req_qos", "job_log_dir", "walltime_warning", "exec_prefix", "batch_script", "env_keep"):
        assert re.search(rf"^# c\.HPCSlurmSpawner\.{setting} = ", text, re.M), setting
    assert "## REFUSED here (the hub stops): use req_prologue" in text  # batch_script's line says what to use instead
    # who logs in: the members of the named group only (never allow_all); SLURM_CONF as site init found it
    assert f"c.PAMAuthenticator.allowed_groups = {{'{USER}'}}" in text and "allow_all = True" not in text
    assert f"os.environ.setdefault(\"SLURM_CONF\", '{os.environ['SLURM_CONF']}')" in text
    assert f'site_roots = ["{site}/envs"]' in (site / "config.toml").read_text()
    assert oct(config.stat().st_mode & 0o777) == "0o600" and oct((site / "state").stat().st_mode & 0o777) == "0o700"
    again = subprocess.run([f"{site}/venv/bin/hpcai", "site", "init", "--hub-config", str(config), "--site-config",
                            str(site / "config.toml")], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 1 and "exists; nothing was written" in again.stdout, again  # loses nothing
    return config


@contextmanager
def _hub(site: Path, config: Path, env: dict[str, str], log: Path) -> Iterator[None]:
    """The hub from the written config alone (the ports other tests' hubs may hold, on its command line)."""
    api = f"http://127.0.0.1:{free_port()}"
    with open(log, "w") as out:
        hub = subprocess.Popen([f"{site}/venv/bin/jupyterhub", "-f", str(config),
                                f"--JupyterHub.hub_port={free_port()}",
                                f"--ConfigurableHTTPProxy.api_url={api}"], cwd=site / "state", env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield
    finally:
        hub.send_signal(signal.SIGTERM)
        hub.wait(timeout=60)
        pid = site / "state" / "jupyterhub-proxy.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


def test_a_wheel_a_template_and_a_hub_are_enough(devcluster, tf_env, site: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    ensure_user(USER)
    password = "site-" + secrets.token_hex(6)
    subprocess.run(["chpasswd"], input=f"{USER}:{password}\n", text=True, check=True, timeout=30)
    env = _installed(site, tmp_path)
    port = free_port()
    config = _site_init(site, env, port, devcluster.login_address)
    # the shipped recipe, by name: ${HPCAI_PRODUCT} is the wheel this venv was installed from
    _run([f"{site}/venv/bin/hpcai", "env", "build", "tf-horovod-cpu", "--name", ENV, "--site"], env, timeout=1800)
    _run([f"{site}/venv/bin/hpcai", "kernel", "install", ENV, "--prefix", str(site / "venv")], env)
    url = f"http://hub.localhost:{port}"  # the hub's origin; the user's server is on hpcai-alice.hub.localhost
    with _hub(site, config, env, tmp_path / "hub.log"):
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/hub/api"), timeout=120, what="the hub to answer")
        token = ""
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{url}/hub/login")  # the login form, through PAM: the hub knows the user from now on
                page.fill("#username_input", USER)
                page.fill("#password_input", password)
                page.click("#login_submit")
                page.wait_for_url(re.compile(r".*/hub/(home|spawn).*"), timeout=60_000)
                token = _token(url, password)
                _spawned(url, token)
                page.goto(f"{url}/user/{USER}/lab")
                page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
                # the hub sent the browser to the user's own origin
                assert page.url.startswith(f"http://{USER}.hub.localhost:{port}/user/{USER}/"), page.url
                page.wait_for_selector('li[data-id="hpcai-panel"]', timeout=60_000)  # the HPC tab: our lab extension
                browser.close()
            _trains(url, token, site)  # outside Playwright's event loop (the websocket client runs its own)
        finally:
            if token:
                demo.request(f"{url}/hub/api/users/{USER}/server", token, "DELETE")
            for job in subprocess.run(["squeue", "--noheader", f"--user={USER}", "--format=%i"], capture_output=True,
                                      text=True, timeout=30).stdout.split():
                subprocess.run(["scancel", job], timeout=30, check=False)


def _token(url: str, password: str) -> str:
    """A token as a script gets one: the user's name and password in the body, checked by PAM."""
    status, made = demo.request(f"{url}/hub/api/users/{USER}/tokens", "(none)", "POST",
                                {"auth": {"username": USER, "password": password}, "note": "site install test",
                                 "expires_in": 3600})
    assert status == 201, made
    return str(made["token"])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def _spawned(url: str, token: str) -> None:
    """A 2-node server from the first 2-node profile the template made, 2 GPUs per node, the site env."""
    status, body = demo.request(f"{url}/hub/api/users/{USER}/server", token, "POST",
                                {"profile": "gpu: 2 nodes x 4 GPUs", "gpus_per_node": 2, "environment": ENV})
    assert status in (201, 202), body

    def ready() -> bool:
        servers = (demo.request(f"{url}/hub/api/users/{USER}", token)[1] or {}).get("servers", {})
        return bool(servers.get("", {}).get("ready"))

    wait_until(ready, timeout=300, what="the server's job to run and the server to answer")
    jobs = subprocess.run(["squeue", "--noheader", f"--user={USER}", "--format=%i %D %b"], capture_output=True,
                          text=True, timeout=30).stdout.split("\n")
    assert re.fullmatch(r"\d+ 2 \S*gpu:2", jobs[0].strip()), jobs


def _trains(url: str, token: str, site: Path) -> None:
    """A kernel of the site env, from the wheel: 4 engines on the 2 nodes, then Horovod's allreduce over them."""
    base = f"{url.replace('://', f'://{USER}.')}/user/{USER}"  # the user's own origin
    status, kernel = demo.request(f"{base}/api/kernels", token, "POST", {"name": f"hpcai-{ENV}"})
    assert status == 201, kernel
    cells = {"import jupyter_hpcai; print(jupyter_hpcai.__file__)": rf"^{site}/envs/{ENV}/builds/.*/jupyter_hpcai/",
             "%load_ext jupyter_hpcai": "",
             "%hpc start": r"^4 engines ready \(srun\)",
             "%%horovod_run\nimport tensorflow as tf\nprint('sum', float(hvd.allreduce(tf.constant(float(rank + 1)), "
             "op=hvd.Sum)))": r"\[rank 3 n2\] sum 10\.0"}
    for code, expect in cells.items():
        result = asyncio.run(demo.execute(base, token, kernel["id"], code, timeout=600))
        assert result["status"] == "ok" and re.search(expect, result["stdout"], re.M), (code, result)
    demo.request(f"{base}/api/kernels/{kernel['id']}", token, "DELETE")


def test_site_init_never_writes_through_a_link_and_loses_nothing(tmp_path: Path) -> None:
    """Root writes the hub's config: never through a link someone planted, never over a file without --force,
    and the old file kept with its mode; the hub's state folder must be root's alone."""
    from jupyter_hpcai import siteinit
    from jupyter_hpcai.errors import HPCAIError

    elsewhere = tmp_path / "shadow"
    elsewhere.write_text("root's secret")
    planted = tmp_path / "jupyterhub_config.py"
    planted.symlink_to(elsewhere)
    with pytest.raises(HPCAIError, match="is a symbolic link; nothing was written"):
        siteinit.write(planted, "c = 1\n", 0o600, force=True)
    assert elsewhere.read_text() == "root's secret"
    real = tmp_path / "config.py"
    real.write_text("old\n")
    real.chmod(0o600)
    with pytest.raises(HPCAIError, match="exists; nothing was written"):
        siteinit.write(real, "new\n", 0o600, force=False)
    backup = siteinit.write(real, "new\n", 0o644, force=True)
    assert backup is not None and backup.read_text() == "old\n" and backup.stat().st_mode & 0o777 == 0o600
    assert real.read_text() == "new\n" and real.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["shadow", "jupyterhub_config.py", "config.py",
                                                                backup.name])  # no temporary file left
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    link = tmp_path / "state-link"
    link.symlink_to(tmp_path)
    for bad in (shared, link):
        with pytest.raises(HPCAIError, match="only you can write"):
            siteinit.state_folder(bad)
    made = siteinit.state_folder(tmp_path / "state")
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700


def test_the_public_url_is_https_but_on_localhost_names() -> None:
    """The hub's public URL (subdomain_host) as site init takes it, and the site check's word on one origin per user:
    plain http only for *.localhost, where browsers keep Secure cookies; elsewhere nobody could log in."""
    from traitlets.config import Config

    from jupyter_hpcai import sitecheck, siteinit
    from jupyter_hpcai.errors import HPCAIError

    assert siteinit.public_url("http://127.0.0.1:8000", "https://hub.example.org/ignored") == "https://hub.example.org"
    assert siteinit.public_url("https://hub.example.org:8443") == "https://hub.example.org:8443"  # the bind URL's name
    assert siteinit.public_url("http://127.0.0.1:8000").startswith("https://")  # an address: this host's full name
    assert siteinit.public_url("http://127.0.0.1:8000", "http://hub.localhost:8000") == "http://hub.localhost:8000"
    with pytest.raises(HPCAIError, match="plain http"):
        siteinit.public_url("http://127.0.0.1:8000", "http://hub.example.org")
    with pytest.raises(HPCAIError, match="plain http"):
        siteinit.public_url("http://hub.example.org:8000")

    def checked(**hub: object) -> tuple[bool, str]:
        config = Config()
        for key, value in hub.items():
            setattr(config.JupyterHub, key, value)
        check = sitecheck._one_origin(config)
        return check.passed, check.detail

    assert checked(subdomain_host="https://hub.example.org", cookie_host_prefix_enabled=True)[0]
    assert checked(subdomain_host="http://hub.localhost:8000", cookie_host_prefix_enabled=True)[0]
    for hub, said in (({}, "on the hub's own origin"),
                      ({"subdomain_host": "https://hub.example.org"}, "lack the __Host- prefix"),
                      ({"subdomain_host": "http://hub.example.org", "cookie_host_prefix_enabled": True}, "plain http")):
        passed, detail = checked(**hub)
        assert not passed and said in detail, (hub, detail)
