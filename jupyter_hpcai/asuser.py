"""Run a small Python program as a user, for root's work in that user's files: the program reads and writes
them with the user's rights only, so no link or race the user sets up can turn it against root's files."""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
from typing import Any

from .errors import HPCAIError


def as_user(user: str, code: str, data: Any, hint: str = "", timeout: float = 60) -> list[Any]:
    """Run ``code`` (Python) as ``user``: their uid and group, no other group, a minimal environment, ``data`` as
    JSON on its stdin (it needs to read nothing of the caller's); the JSON lines it prints, decoded. ``hint``:
    what to do when it fails.

    subprocess rather than proc.run, which cannot change the user."""
    entry = pwd.getpwnam(user)
    env = {"PATH": "/usr/bin:/bin", "HOME": entry.pw_dir, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8"}
    try:
        done = subprocess.run([sys.executable, "-I", "-c", code], input=json.dumps(data), capture_output=True,
                              text=True, user=entry.pw_uid, group=entry.pw_gid, extra_groups=[], env=env, cwd="/",
                              start_new_session=True, timeout=timeout)  # no controlling terminal of root's to type into
    except subprocess.TimeoutExpired:
        raise HPCAIError(f"a program run as {user} did not finish within {timeout:g} s") from None
    if done.returncode != 0:
        detail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise HPCAIError(f"a program run as {user} failed with exit status {done.returncode}:\n{detail}", hint)
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
