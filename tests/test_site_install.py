"""A site installs jupyter-hpcai from the docs alone: the install block of docs/howto/site-install.md, run as it is
written (the names mapped to the test's: paths under a folder of its own, which the dev cluster's nodes see as a
site's shared storage; the URL to hub.localhost; the GPU recipe to the CPU one; npm's global install skipped, the
test setup's), from a wheel and an sdist built with their version, with no checkout on any path. Then the hub as the
systemd unit of docs/howto/run-the-hub.md starts it (under a plain supervisor: no systemd here), PAM logins, a
2-node server, JupyterLab loading the side panel's extension, and a kernel of the site env running `%hpc start` and
`%%horovod_run` on 4 ranks. A step that drifts from the pages fails here."""

from __future__ import annotations

import asyncio
import configparser
import os
import re
import secrets
import shlex
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
ENV = "tf-horovod-cpu"  # the page's tf-horovod-nccl, on a machine without GPUs


def _run(argv: list[str], env: dict[str, str], timeout: float = 600, cwd: str = "/") -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def site(devcluster) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """A folder every user reads, outside the login node's own /usr/local and /opt: the site's shared storage."""
    folder = Path(tempfile.mkdtemp(prefix="hpcai-site-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def block(page: str, heading: str, language: str) -> str:
    """The first ``language`` code block after ``heading`` in docs/``page``, its continued lines joined."""
    text = (REPO / "docs" / page).read_text()
    after = text[text.index(heading):]
    found = re.search(rf"```{language}\n(.*?)```", after, re.S)
    assert found, f"{page}: no {language} block after {heading!r}"
    return found.group(1).replace("\\\n", " ")


def mapped(text: str, names: dict[str, str]) -> str:
    """The page's example names replaced by the test's, longest first."""
    for example in sorted(names, key=len, reverse=True):
        text = text.replace(example, names[example])
    return text


def _release(out: Path) -> Path:
    """The wheel and the sdist, named with the version (from the working tree: its side panel is built, so no npm)."""
    from jupyter_hpcai import __version__

    _run([UV, "build", "--sdist", "--wheel", "--out-dir", str(out), str(REPO)], dict(os.environ))
    names = sorted(p.name for p in out.iterdir() if p.suffix in (".whl", ".gz"))
    assert names == [f"jupyter_hpcai-{__version__}-py3-none-any.whl", f"jupyter_hpcai-{__version__}.tar.gz"], names
    out.chmod(0o755)
    return out


def _install(names: dict[str, str], env: dict[str, str], dist: Path) -> str:
    """The page's install block, mapped, run as root as one script from the wheel's folder; what it printed."""
    lines = mapped(block("howto/site-install.md", "## Install and write the configs", "bash"), names).splitlines()
    assert "npm install -g configurable-http-proxy" in lines, lines  # the test setup has installed it
    script = "\n".join(line for line in lines if not line.startswith("npm "))
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=1800,
                          env=env, cwd=dist)
    assert done.returncode == 0, f"the page's install block, as run:\n{script}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _written(site: Path, config: Path, port: int, login: str, said: str) -> None:
    """What site init wrote: the hub's address, one origin per user, every setting commented, PAM for the group."""
    assert f"wrote {config}" in said and f"hub address on the nodes' network: {login}" in said, said
    assert f"one origin per user: the hub at http://hub.localhost:{port}, each user's server at <user>.hub.localhost" \
        in " ".join(said.split()), said
    text = config.read_text()
    assert f"c.JupyterHub.subdomain_host = 'http://hub.localhost:{port}'" in text
    assert "c.JupyterHub.cookie_host_prefix_enabled = True" in text
    for setting in ("req_qos", "job_log_dir", "walltime_warning", "exec_prefix", "batch_script", "env_keep"):
        assert re.search(rf"^# c\.HPCSlurmSpawner\.{setting} = ", text, re.M), setting
    assert "## REFUSED here (the hub stops): use req_prologue" in text  # batch_script's line says what to use instead
    assert f"c.PAMAuthenticator.allowed_groups = {{'{USER}'}}" in text and "allow_all = True" not in text
    assert f"os.environ.setdefault(\"SLURM_CONF\", '{os.environ['SLURM_CONF']}')" in text
    assert f'site_roots = ["{site}/software/hpcai-envs"]' in (site / "software/etc/jupyter-hpcai/config.toml").read_text()
    assert oct(config.stat().st_mode & 0o777) == "0o600" and oct((site / "state").stat().st_mode & 0o777) == "0o700"


@contextmanager
def _service(names: dict[str, str], env: dict[str, str], log: Path) -> Iterator[None]:
    """The hub as run-the-hub.md's systemd unit runs it (its ExecStart, WorkingDirectory and Environment), under a
    plain supervisor; the ports other tests' hubs may hold given on its command line."""
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read_string(mapped(block("howto/run-the-hub.md", "## A systemd service", "ini"), names))
    service = unit["Service"]
    assert service["User"] == "root" and service["Restart"] == "on-failure", dict(service)
    variables = dict(v.split("=", 1) for v in shlex.split(service["Environment"]))
    argv = [*shlex.split(service["ExecStart"]), f"--JupyterHub.hub_port={free_port()}",
            f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{free_port()}"]
    with open(log, "w") as out:
        hub = subprocess.Popen(argv, cwd=service["WorkingDirectory"], env={**env, **variables}, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield
    finally:
        hub.send_signal(signal.SIGTERM)
        hub.wait(timeout=60)
        pid = Path(service["WorkingDirectory"]) / "jupyterhub-proxy.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


def test_the_install_page_and_the_service_give_a_working_hub(devcluster, tf_env, site: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    ensure_user(USER)
    password = "site-" + secrets.token_hex(6)
    subprocess.run(["chpasswd"], input=f"{USER}:{password}\n", text=True, check=True, timeout=30)
    port = free_port()
    slurm = os.environ.get("HPCAI_SLURM")  # the dev cluster's own Slurm: its client is the site's
    names = {"/shared/software": f"{site}/software", "/etc/jupyterhub": f"{site}/etc/jupyterhub",
             "/var/lib/jupyterhub": f"{site}/state",
             "https://hub.example.org": f"http://hub.localhost:{port}", "http://127.0.0.1:8000": f"http://127.0.0.1:{port}",
             "hpc-users": USER, "--user someone": f"--user {USER}", "tf-horovod-nccl": ENV,
             "/usr/bin:": f"{slurm}/bin:/usr/bin:" if slurm else "/usr/bin:"}
    env = {"PATH": ":".join([*([f"{slurm}/bin"] if slurm else []), "/usr/local/bin:/usr/bin:/bin"]), "LANG": "C.UTF-8",
           "HOME": "/root", "SLURM_CONF": os.environ["SLURM_CONF"]}
    said = _install(names, env, _release(tmp_path / "dist"))
    venv = site / "software" / "jupyterhub"
    where = _run([str(venv / "bin" / "python"), "-c", "import jupyter_hpcai; print(jupyter_hpcai.__file__)"], env)
    assert where.startswith(f"{venv}/lib/"), where  # from the wheel, not the checkout
    config = site / "etc" / "jupyterhub" / "jupyterhub_config.py"
    _written(site, config, port, devcluster.login_address, said)
    assert (venv / "share/jupyter/kernels" / f"hpcai-{ENV}" / "kernel.json").is_file()  # where the servers look
    url = f"http://hub.localhost:{port}"  # the hub's origin; the user's server is on hpcai-alice.hub.localhost
    with _service(names, env, tmp_path / "hub.log"):
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
    cells = {"import jupyter_hpcai; print(jupyter_hpcai.__file__)":
             rf"^{site}/software/hpcai-envs/{ENV}/builds/.*/jupyter_hpcai/",
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
