"""jobscript.py's shared pieces, as every batch script of the project gets them (the scripts themselves are tested
where they run: test_export, test_build_jobs, test_spawner, test_bench, test_own_allocation)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.scheduler.jobscript import JobScript, rank_launch
from jupyter_hpcai.scheduler.slurm import versions
from jupyter_hpcai.scheduler.slurm.script import export_node_addresses


def test_the_rank_launch_line_is_one_rank_per_gpu_in_block_order() -> None:
    line = shlex.split(rank_launch(2, 4, ["python", "my script.py"]))
    assert line == ["srun", versions.cpus_per_task_in_shell(), "--mpi=pmix", "--nodes=2", "--ntasks-per-node=4", "--distribution=block",
                    "--kill-on-bad-exit=1", "python", "my script.py"]
    assert "--ntasks-per-node=1" in rank_launch(3, 0, ["true"])  # a node without GPUs runs one rank


def test_node_addresses_are_exported_as_the_network_module_reads_them() -> None:
    """The lines run in bash with a stand-in scontrol: 'node=addr,...' in the variable, the first in addrs[0]."""
    fake = ('scontrol() { case "$1 $2" in "show hostnames") echo n1; echo n2;; '
            '"show node") echo "NodeName=$3 NodeAddr=10.0.0.${3#n} NodeHostName=$3";; esac; }\n')
    script = fake + "SLURM_JOB_NODELIST='n[1-2]'\n" + "\n".join(export_node_addresses("ADDRS")) + \
        '\necho "$ADDRS ${addrs[0]#*=}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=10)
    assert done.stdout.strip() == "n1=10.0.0.1,n2=10.0.0.2 10.0.0.1", done.stderr


@pytest.mark.parametrize("value", ["a b", "a\nb", "", "x\x1b[31m"])
def test_a_header_value_that_is_not_one_printable_word_is_refused(value: str) -> None:
    with pytest.raises(HPCAIError, match="refusing to write"):
        JobScript(name="j", partition=value or " ").render()
    assert "#SBATCH --partition=gpu\n" in JobScript(name="j", partition="gpu").render()  # a control
