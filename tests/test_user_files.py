"""Files that root, or a user's own export, writes where a hostile user chooses what is there: the examples that
`hpcai demo` (root) copies into a home, the environment a container gets, the scripts an export writes, and
what the stack dump's hint tells admins. Runs as root, without the dev cluster."""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.record import attack
from helpers.hub import BOB, ensure_user
from jupyter_hpcai import export
from jupyter_hpcai.demo import REPO, copy_examples
from jupyter_hpcai.ranks import stacks
from jupyter_hpcai.contract import without_secrets
from jupyter_hpcai.errors import HPCAIError


EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.ipynb"))
RECORD = ".hpcai-examples.json"
KEPT = "changed since it was copied (delete it to get the current example)"


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int, bytes | None]]:
    """Owner, group, mode and content (files) of ``folder`` and everything in it, links not followed."""
    found = {}
    for path in [folder, *folder.rglob("*")]:
        info = path.lstat()
        found[str(path)] = (info.st_uid, info.st_gid, info.st_mode,
                            path.read_bytes() if stat.S_ISREG(info.st_mode) else None)
    return found


def _clear(home: Path) -> None:
    for name in (RECORD, *EXAMPLES):
        (home / name).unlink(missing_ok=True)


@pytest.fixture
def home() -> Iterator[Path]:
    """Bob's home (bob: the hostile user), without examples or their record before and after."""
    ensure_user(BOB)
    path = Path(pwd.getpwnam(BOB).pw_dir)
    _clear(path)
    yield path
    _clear(path)


@pytest.fixture
def root_files() -> Iterator[Path]:
    """A root-only folder (0700) with root's files (0600, known contents) and a root-only folder in it."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in ("record", *EXAMPLES):
            (folder / name).write_text(f"root's {name}\n")
            (folder / name).chmod(0o600)
        (folder / "dir").mkdir(mode=0o700)
        yield folder


def _bob_owns(path: Path) -> bool:
    entry, info = pwd.getpwnam(BOB), path.lstat()
    return stat.S_ISREG(info.st_mode) and (info.st_uid, info.st_gid) == (entry.pw_uid, entry.pw_gid)


def test_hpcai_demo_never_writes_through_a_users_links_to_roots_files(home: Path, root_files: Path) -> None:
    (home / RECORD).symlink_to(root_files / "record")
    for name in EXAMPLES:
        (home / name).symlink_to(root_files / name)
    before = _snapshot(root_files)
    said = copy_examples(BOB)
    changed = sorted(p for p, seen in _snapshot(root_files).items() if before.get(p) != seen)
    attack("`hpcai demo` (root) writing and chowning root's files that a user linked from their home", not changed,
           f"changed: {changed}" if changed else "root's files unchanged (owner, mode, content)")
    assert _bob_owns(home / RECORD)  # the link at the record replaced by bob's own file, in the home
    assert all(os.readlink(home / name) == str(root_files / name) for name in EXAMPLES)  # kept, never followed
    assert said == [f"kept {home / name}: {KEPT}" for name in EXAMPLES]


def test_hpcai_demo_never_creates_a_file_where_a_users_link_points(home: Path, root_files: Path) -> None:
    (home / RECORD).symlink_to(root_files / "planted")  # not there: writing through the link would make it
    for name in EXAMPLES:
        (home / name).symlink_to(root_files / "dir")
    before = _snapshot(root_files)
    copy_examples(BOB)
    after = _snapshot(root_files)
    attack("`hpcai demo` (root) creating a file in a root-only folder through a user's dangling link",
           after == before, f"root's folder now holds {sorted(set(after) - set(before)) or 'nothing new'}")
    assert _bob_owns(home / RECORD) and all((home / name).is_symlink() for name in EXAMPLES)


def test_hpcai_demo_writes_a_home_with_its_users_rights_only(home: Path) -> None:
    mode = home.stat().st_mode
    home.chmod(0o555)  # bob may not write his home; root may (and must not)
    try:
        copy_examples(BOB)
        refused = ""
    except HPCAIError as err:
        refused = err.message.splitlines()[-1]
    finally:
        home.chmod(stat.S_IMODE(mode))
    made = [name for name in (RECORD, *EXAMPLES) if os.path.lexists(home / name)]
    attack("`hpcai demo` (root) writing in a home with root's rights", bool(refused) and not made,
           f"written: {made}" if made else f"refused: {refused}")


def test_hpcai_demo_copies_the_examples_as_the_user_and_keeps_their_changes(home: Path) -> None:
    assert copy_examples(BOB) == [f"example notebook: {home / name}" for name in EXAMPLES]
    for name in (RECORD, *EXAMPLES):
        assert _bob_owns(home / name), name
    for name in EXAMPLES:
        assert (home / name).read_bytes() == (REPO / "examples" / name).read_bytes()
    assert copy_examples(BOB) == [f"example notebook: {home / name}" for name in EXAMPLES]  # unchanged: refreshed
    changed = home / EXAMPLES[0]
    changed.write_text("my own notes")
    assert copy_examples(BOB)[0] == f"kept {changed}: {KEPT}" and changed.read_text() == "my own notes"


def test_a_sites_deny_list_adds_to_the_default_one() -> None:
    environ = {"JUPYTERHUB_API_TOKEN": "t", "JPY_API_TOKEN": "t", "MY_SITE_X": "x", "db_password": "p",
               "PATH": "/bin", "HPCAI_CONTAINER_ENV_DENY": "MY_SITE_*"}
    seen = without_secrets(environ)
    leaked = sorted({"JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "MY_SITE_X", "db_password"} & set(seen))
    attack("a site's HPCAI_CONTAINER_ENV_DENY letting the hub's token into a container", not leaked,
           f"the container sees {leaked}" if leaked else f"the container sees only {sorted(seen)}")
    assert "PATH" in seen


def _spec(notebook: Path, chosen: str = export.ALL) -> export.JobSpec:
    """An export of one %%horovod_run cell, in an env that need not exist (nothing here reads it)."""
    return export.JobSpec(notebook, [export.Cell(1, "print(rank)", "horovod")],
                          export.EnvRef("small", notebook.parent / "envs", "b1"), chosen=chosen)


@pytest.mark.parametrize("name, chosen", [("train\n#SBATCH --uid=0.ipynb", export.ALL), ("a\rb.ipynb", export.ALL),
                                          ("esc\x1b[2J.ipynb", export.ALL), ("train.ipynb", "train\ntouch ~/owned")])
def test_an_export_refuses_control_characters_in_its_header(tmp_path: Path, name: str, chosen: str) -> None:
    notebook = tmp_path / name
    notebook.write_text("{}")
    try:
        export.write(_spec(notebook, chosen))
        refused = ""
    except HPCAIError as err:
        refused = str(err)
    written = sorted(p.name for p in tmp_path.iterdir() if p != notebook)
    attack(f"a line of its own in an export's job script ({name!r}, cells {chosen!r})",
           bool(refused) and not written, f"refused: {refused.splitlines()[0]}" if refused else f"written: {written}")
    assert "hint: " in refused


def test_an_export_replaces_a_link_at_its_scripts(tmp_path: Path) -> None:
    spec = _spec(tmp_path / "train.ipynb")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    targets = {}
    for dest in spec.paths():
        targets[dest] = elsewhere / dest.name
        targets[dest].write_text("someone else's\n")
        dest.symlink_to(targets[dest])
    sbatch, script = export.write(spec)
    followed = [str(t) for t in targets.values() if t.read_text() != "someone else's\n"]
    attack("an export writing through a link at its scripts", not followed,
           f"written through: {followed}" if followed else "the links' targets unchanged")
    umask = os.umask(0)
    os.umask(umask)
    assert not sbatch.is_symlink() and stat.S_IMODE(sbatch.stat().st_mode) == 0o755
    assert not script.is_symlink() and stat.S_IMODE(script.stat().st_mode) == 0o666 & ~umask
    assert script.read_text() == export.python_script(spec) and sbatch.read_text() == export.job_script(spec, script)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["elsewhere", sbatch.name, script.name])  # no temp


@pytest.mark.parametrize("scope", ["1", "2"])
def test_the_ptrace_hint_asks_for_the_sysctl_never_a_capability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 scope: str) -> None:
    (tmp_path / "ptrace_scope").write_text(scope + "\n")
    monkeypatch.setattr(stacks, "PTRACE_SCOPE", tmp_path / "ptrace_scope")
    hint = stacks._ptrace_hint()
    assert f"kernel.yama.ptrace_scope is {scope}" in hint and "sysctl -w kernel.yama.ptrace_scope=0" in hint
    assert "CAP_" not in hint and "capabilit" not in hint.lower()
