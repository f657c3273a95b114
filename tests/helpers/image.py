"""The small Debian image the container tests run: built once with debootstrap, cached outside the repo.

bookworm (python 3.11, OpenMPI 4.1.4 like the host) with python3, openmpi-bin and python3-mpi4py from
Debian, and ipykernel + ipyparallel (the host's version) from PyPI. A marker file tells a process that
it runs inside. Cache: ``HPCAI_TEST_IMAGE_CACHE`` (default /var/cache/hpcai-test), keyed by the recipe.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

MARKER = "/etc/hpcai-test-image"
DEBIAN = ["python3", "openmpi-bin", "python3-mpi4py"]
PYPI = ["ipykernel", f"ipyparallel=={metadata.version('ipyparallel')}"]


def _mirror() -> str:
    """The Debian mirror apt already uses here."""
    for source in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        text = source.read_text() if source.is_file() else ""
        found = re.search(r"(?:URIs:|deb)\s+(https?://\S+/debian)\b(?!-)", text)
        if found:
            return found.group(1)
    return "http://deb.debian.org/debian"


def image_tarball() -> Path:
    """The image as a root filesystem tarball (for `udocker import`), built on first use."""
    cache = Path(os.environ.get("HPCAI_TEST_IMAGE_CACHE", "/var/cache/hpcai-test"))
    cache.mkdir(parents=True, exist_ok=True)
    mirror = _mirror()
    key = hashlib.sha256(repr((DEBIAN, PYPI, mirror, MARKER)).encode()).hexdigest()[:12]
    tarball = cache / f"debian-bookworm-hpcai-{key}.tar"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait for it and reuse it
        if tarball.exists():
            return tarball
        rootfs = cache / f"rootfs-{key}"
        shutil.rmtree(rootfs, ignore_errors=True)
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN)}", "bookworm", str(rootfs),
                        mirror], check=True, timeout=900, capture_output=True)
        site = rootfs / "usr/local/lib/python3.11/dist-packages"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), *PYPI],
                       check=True, timeout=600)
        (rootfs / MARKER.lstrip("/")).write_text("jupyter-hpcai test image\n")
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
        os.replace(partial, tarball)
        shutil.rmtree(rootfs, ignore_errors=True)
    return tarball
