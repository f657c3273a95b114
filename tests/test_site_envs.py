"""Site and user environments side by side: the admins' envs (built by root into a site root) and a user's
own, found without settings, with the user's first; site envs are read-only to users."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.envs import REPO
from helpers.hub import USER, ensure_user
from jupyter_hpcai.envs import Builder, EnvStore, load_recipe


HPCAI = str(Path(sys.executable).parent / "hpcai")


@pytest.fixture(scope="module")
def site(small_recipe: Path, conda_channel: Path) -> Iterator[dict[str, Path]]:
    """A world-readable folder (pytest's own are root-only) with the local channel, the small recipe (with a
    kernel) pointing at it,
    and a site root in which root built the small env; alice's own env root."""
    ensure_user(USER)
    shared = Path(tempfile.mkdtemp(prefix="hpcai-site-"))
    shared.chmod(0o755)
    channel = shared / "channel"
    shutil.copytree(conda_channel, channel)
    subprocess.run(["chmod", "-R", "a+rX", str(channel)], check=True, timeout=60)
    recipe = shared / "small.yaml"
    recipe.write_text(small_recipe.read_text().replace(str(conda_channel), str(channel))
                      .replace("pip: [six==1.16.0]", "pip: [six==1.16.0, ipykernel]"))
    root = shared / "site-envs"
    Builder(load_recipe(recipe), store=EnvStore(shared / "root-own", site=[root]), site=True).run()
    mine = shared / "alice"
    mine.mkdir()
    shutil.chown(mine, USER, USER)
    try:
        yield {"recipe": recipe, "site": root, "mine": mine}
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(Path(pwd.getpwnam(USER).pw_dir) / ".local" / "share" / "jupyter" / "kernels" / "hpcai-small",
                      ignore_errors=True)


def as_alice(site: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """`hpcai ARGS` as alice (not root), with the site root configured the way a site does (HPCAI_ENV_PATH)."""
    home = pwd.getpwnam(USER).pw_dir
    environ = {"HOME": home, "USER": USER, "LOGNAME": USER, "PATH": "/usr/bin:/bin", "COLUMNS": "250",
               "HPCAI_ENV_PATH": str(site["site"]),
               "HPCAI_ENV_ROOT": str(site["mine"] / "not" / "yet" / "envs"),  # folders made by her first build
               "HPCAI_CACHE_DIR": str(site["mine"] / "cache"), "UV_CACHE_DIR": str(site["mine"] / "uv-cache"),
               **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
    done = subprocess.run(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", "env", "-i",
                           *(f"{k}={v}" for k, v in environ.items()), HPCAI, *args],
                          capture_output=True, text=True, timeout=600, cwd=site["mine"])
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def _rows(listing: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in listing.splitlines() if line.count("│") >= 7]


def test_a_user_uses_the_site_env_and_cannot_remove_it(site: dict[str, Path]) -> None:
    listing = as_alice(site, "env", "list")
    assert listing.returncode == 0, listing.stdout
    assert any(r[:3] == ["small", "site", "conda"] for r in _rows(listing.stdout)), listing.stdout
    check = as_alice(site, "env", "check", "small")
    assert check.returncode == 0 and "✓ import six" in check.stdout and "(site," in check.stdout, check.stdout
    removed = as_alice(site, "env", "remove", "small")
    assert removed.returncode == 1, removed.stdout
    text = " ".join(removed.stdout.split())
    assert "it is a site environment in" in text and "read-only to you" in text and "build your own" in text, text
    assert (site["site"] / "small" / "current").is_symlink(), "the site env is still there"
    kernel = as_alice(site, "kernel", "install", "small")
    assert kernel.returncode == 1 and "an admin installs site kernels" in " ".join(kernel.stdout.split()), kernel.stdout


def test_a_users_own_env_shadows_the_site_one(site: dict[str, Path]) -> None:
    built = as_alice(site, "env", "build", str(site["recipe"]))
    assert built.returncode == 0, built.stdout + built.stderr
    assert str(site["mine"] / "not" / "yet" / "envs" / "small" / "builds") in built.stdout
    rows = _rows(as_alice(site, "env", "list").stdout)
    mine = [r for r in rows if r[:2] == ["small", "user"]]
    theirs = [r for r in rows if r[:2] == ["small", "site"]]
    assert mine and "shadows the site's" in mine[0][-1] and theirs and "shadowed by yours" in theirs[0][-1], rows
    check = as_alice(site, "env", "check", "small")
    assert check.returncode == 0 and "shadows the site env of the same name" in " ".join(check.stdout.split())
    assert "(user," in check.stdout, check.stdout
    kernel = as_alice(site, "kernel", "install", "small")  # hers: a kernelspec of her own, no --user needed
    home = pwd.getpwnam(USER).pw_dir
    assert kernel.returncode == 0 and f"{home}/.local/share/jupyter/kernels/hpcai-small" in kernel.stdout, kernel.stdout
    removed = as_alice(site, "env", "remove", "small")  # removes hers; the site's is found again
    assert removed.returncode == 0 and str(site["mine"] / "not" / "yet" / "envs") in removed.stdout, removed.stdout
    assert any(r[:2] == ["small", "site"] and r[-1] == "" for r in _rows(as_alice(site, "env", "list").stdout))


@pytest.mark.slurm
def test_the_hub_form_lists_the_site_envs(devcluster, site: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """No `environments` in the hub's config: the form offers what the admins built into the site roots."""
    from jupyter_hpcai.spawner.spawner import offline_spawner

    config = site["mine"].parent / "hub_config.py"
    config.write_text((REPO / "spawner_config" / "demo_config.py").read_text()
                      + "\nc.HPCSlurmSpawner.environments = {}\n")
    monkeypatch.setenv("HPCAI_ENV_PATH", str(site["site"]))
    spawner = offline_spawner(config, USER)
    html = asyncio.run(spawner._render_form())
    options = re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', html.split('name="environment"')[1])
    assert ("small", "small (conda, python 3.11.2)") in [(v, re.sub(r"3\.11\.\d+", "3.11.2", t)) for v, t in options]
    assert spawner._checked({"environment": "small"})["environment"] == "small"
