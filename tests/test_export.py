"""From notebook to batch job: a notebook's tagged cells run in a job kernel, then exported (`hpcai job
from-notebook`) and submitted to the dev cluster; the batch job prints what the notebook printed, rank by rank
(real Slurm, Horovod on TensorFlow, torch.distributed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.kernels import kernel_in_job
from jupyter_hpcai import export, kernelspec
from jupyter_hpcai.envs import open_env
from jupyter_hpcai.errors import HPCAIError

HOROVOD = [
    ("%load_ext jupyter_hpcai\n%hpc start", []),
    ("import numpy as np\nseed = 7\ndata = [float(x) for x in np.random.default_rng(seed).normal(size=4).round(6)]\n"
     "print('setup done')", ["train"]),
    ("%%horovod_run --push seed,data\nimport numpy as np\n"
     "w = hvd.allreduce(tf.constant(np.array(data) * (rank + 1)), op=hvd.Sum).numpy()\n"
     "print('sum', round(float(w.sum()), 6), 'seed', seed)", ["train"]),
    ("%%horovod_run\nprint('rank', rank, 'of', size, 'first', round(float(w[0]), 6))\nrank * 100", ["train"]),
    ("print('not exported')", []),
]
TORCH = [
    ("%load_ext jupyter_hpcai\n%hpc start", []),
    ("scale = 3.0", ["train"]),
    ("%%torchrun --push scale\nt = torch.tensor([float(rank + 1) * scale])\ndist.all_reduce(t)\n"
     "print('sum', t.item(), 'world', world_size, 'local rank', local_rank)", ["train"]),
]


def _notebook(path: Path, kernel: str, cells: list[tuple[str, list[str]]]) -> Path:
    path.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {"tags": tags}, "source": source, "outputs": [],
                   "execution_count": None} for i, (source, tags) in enumerate(cells)]}))
    return path


def _rank_lines(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("[rank ") and "] Out[" not in line)


def _notebook_and_job(env_dir, cells: list[tuple[str, list[str]]], work: Path) -> tuple[list[str], list[str], str]:  # type: ignore[no-untyped-def]
    """Run the notebook's cells in a 2-node job kernel, then its export as a batch job: the lines each printed
    under a rank's prefix, and the export's whole output."""
    shown = ""
    notebook = _notebook(work / "train.ipynb", kernelspec.kernel_name(open_env(env_dir)), cells)
    with kernel_in_job(env_dir, work, ("-N2", "--ntasks-per-node=1", "--gpus-per-node=1")) as kernel:
        for source, _ in cells:
            cell = kernel.run(source, timeout=240)
            assert cell.status == "ok", (source, cell.error, cell.stdout)
            shown += cell.stdout
        # %hpc export in the notebook: the job's own layout and walltime (jupyter_server names the notebook)
        (work / "from-kernel").mkdir()
        cell = kernel.run(f"import os; os.environ['JPY_SESSION_NAME'] = {str(notebook)!r}\n"
                          f"%hpc export --cells train --out-dir {work / 'from-kernel'}")
        assert cell.status == "ok", (cell.error, cell.stdout)
        assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in cell.stdout, cell.stdout
        assert "#SBATCH --time=00:45:00\n" in cell.stdout and "#SBATCH --partition=gpu\n" in cell.stdout, cell.stdout
        assert (work / "from-kernel" / "train_job.py").read_text().count("job.cell(") == len(
            [c for c in cells if c[0].startswith("%%") and "train" in c[1]])
    done = subprocess.run([f"{Path(sys.executable).parent}/hpcai", "job", "from-notebook", str(notebook), "--cells",
                           "train", "--nodes", "2", "--gpus-per-node", "1", "--time", "00:05:00", "--submit"],
                          capture_output=True, text=True, timeout=400,
                          env={**os.environ, "JUPYTER_PATH": str(work / "share" / "jupyter")})
    assert done.returncode == 0, done.stdout + done.stderr
    return _rank_lines(shown), _rank_lines(done.stdout), done.stdout


@pytest.mark.oldest_slurm
@pytest.mark.slurm
@pytest.mark.slow
def test_an_exported_horovod_notebook_prints_what_the_notebook_did(devcluster, tf_env,  # type: ignore[no-untyped-def]
                                                                   tmp_path: Path) -> None:
    in_notebook, in_job, said = _notebook_and_job(tf_env, HOROVOD, tmp_path)
    assert len(in_notebook) == 4 and in_notebook == in_job, (in_notebook, in_job)
    assert "[rank 0 n1] sum" in said and "[rank 1 n2] rank 1 of 2" in said  # ranks on both nodes, as in the notebook
    assert "setup done" in said and "not exported" not in said  # the setup cell ran (once), untagged cells did not
    assert said.count("setup done") == 1 and "[rank 0 n1] Out[4]: 0" in said  # rank 0's value, as the cell showed it
    sbatch = (tmp_path / "train.sbatch").read_text()
    build = tf_env.current().id
    assert f"--build {build} {tf_env.name} -- {tmp_path}/train_job.py" in sbatch  # the exact build


@pytest.mark.slurm
@pytest.mark.slow
def test_an_exported_torch_notebook_prints_what_the_notebook_did(devcluster, torch_env,  # type: ignore[no-untyped-def]
                                                                 tmp_path: Path) -> None:
    in_notebook, in_job, said = _notebook_and_job(torch_env, TORCH, tmp_path)
    assert in_notebook == in_job == ["[rank 0 n1] sum 9.0 world 2 local rank 0",
                                     "[rank 1 n2] sum 9.0 world 2 local rank 0"], (in_notebook, in_job, said)
    sbatch = (tmp_path / "train.sbatch").read_text()
    # torch's store takes no key and its port is known before the job starts: two nodes of this user's alone
    assert "HPCAI_MASTER_ADDR" in sbatch and "#SBATCH --exclusive=user\n" in sbatch


def test_what_cannot_be_exported_is_said(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "n.ipynb", "x", [("print(1)", ["a"])])
    with pytest.raises(HPCAIError, match="no %%horovod_run or %%torchrun cell tagged 'a'") as err:
        export.read_cells(nb, "a")
    assert "--cells TAG" in err.value.hint
    mixed = export.read_cells(_notebook(tmp_path / "m.ipynb", "x", [("%%horovod_run\n1", []), ("%%torchrun\n2", [])]))
    spec = export.JobSpec(nb, mixed, export.EnvRef("e", tmp_path, "b"))
    with pytest.raises(HPCAIError, match="the chosen cells use horovod and torch"):
        export.python_script(spec)
    with pytest.raises(HPCAIError, match="cell 1 is a %%time cell"):
        export.read_cells(_notebook(tmp_path / "t.ipynb", "x", [("%%time\nx = 1", []), ("%%torchrun\n2", [])]))
    with pytest.raises(HPCAIError, match="is not a walltime"):
        export.JobSpec(nb, mixed, export.EnvRef("e", tmp_path, "b"), time="soon")
    with pytest.raises(HPCAIError, match="is not a Slurm name"):
        export.JobSpec(nb, mixed, export.EnvRef("e", tmp_path, "b"), partition="gpu\n#SBATCH --uid=0")
    with pytest.raises(HPCAIError, match="cannot read notebook"):
        export.read_cells(tmp_path / "missing.ipynb")


def test_the_scripts_keep_the_cells_and_drop_the_magics(tmp_path: Path) -> None:
    cells = export.read_cells(_notebook(tmp_path / "n.ipynb", "x", HOROVOD), "train")
    spec = export.JobSpec(tmp_path / "n.ipynb", cells, export.EnvRef("tf", tmp_path, "b1"), nodes=2, chosen="train")
    script = export.python_script(spec)
    compile(script, "job.py", "exec")  # valid Python
    assert "job.cell(r'''import numpy as np" in script and "push=('seed', 'data')" in script
    assert "print('not exported')" not in script and "%hpc start" not in script
    sbatch = export.job_script(spec, tmp_path / "n_job.py")
    assert "#SBATCH --nodes=2\n" in sbatch and "--kill-on-bad-exit=1" in sbatch and "HPCAI_MASTER" not in sbatch
    assert "--exclusive" not in sbatch  # Horovod's world needs no store of torch's
