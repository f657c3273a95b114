"""The PyTorch backend: %%torchrun (torch.distributed over Gloo) on the same engines, and the line magics.

Fake here: only the GPUs (character devices; CUDA_VISIBLE_DEVICES is real). torch is the CPU build, so
ranks use gloo, and a cell that asks for nccl must fail clearly.
"""

from __future__ import annotations

import pytest

from helpers.kernels import JobKernel, kernel_in_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(devcluster, torch_env, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with kernel_in_job(torch_env, tmp_path_factory.mktemp("torch-kernel")) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok"
        assert kernel.run("%hpc start").status == "ok"
        yield kernel


def test_world_size_and_all_reduce(world: JobKernel) -> None:
    cell = world.run("%%torchrun\nt = torch.tensor([float(rank + 1)])\ndist.all_reduce(t)\n"
                     "print('world', dist.get_world_size(), 'sum', t.item(), 'device', device)\nt.item()")
    assert cell.status == "ok", cell.error
    assert cell.result == "10.0"
    for rank, host in enumerate(["n1", "n1", "n2", "n2"]):
        assert f"[rank {rank} {host}] world 4 sum 10.0 device cpu" in cell.stdout


def test_rank_variables_and_gpu_pinning(world: JobKernel) -> None:
    cell = world.run("%%torchrun -o seen\nimport os\n"
                     "{k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', "
                     "'MASTER_ADDR', 'MASTER_PORT', 'CUDA_VISIBLE_DEVICES', 'HPCAI_NODE_GPUS')}")
    assert cell.status == "ok", cell.error
    seen = eval(world.run("seen").result)  # noqa: S307 - our kernel's repr of a list of dicts
    assert [s["RANK"] for s in seen] == ["0", "1", "2", "3"] and {s["WORLD_SIZE"] for s in seen} == {"4"}
    assert [s["LOCAL_RANK"] for s in seen] == ["0", "1", "0", "1"] and {s["LOCAL_WORLD_SIZE"] for s in seen} == {"2"}
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen}) == 1
    for s in seen:  # LOCAL_RANK picks the rank's GPU among the node's
        assert s["CUDA_VISIBLE_DEVICES"] == s["HPCAI_NODE_GPUS"].split(",")[int(s["LOCAL_RANK"])]


DDP = """%%torchrun -o params
import torch.nn as nn
torch.manual_seed(rank)                          # different initial weights and data on every rank
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.rand(64, 8); y = x.sum(1, keepdim=True)
for _ in range(5):
    opt.zero_grad(); loss = nn.functional.mse_loss(model(x), y); loss.backward(); opt.step()
[p.detach().tolist() for p in model.parameters()]
"""


def test_ddp_training_ends_with_identical_parameters(world: JobKernel) -> None:
    cell = world.run(DDP)
    assert cell.status == "ok", cell.error
    assert world.run("all(p == params[0] for p in params) and len(params) == 4").result == "True"


def test_checkpoint_with_torch_saved_by_rank_0_and_restored_on_every_rank(world: JobKernel, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    """%hpc checkpoint runs the ranks' walltime hooks (a torch Checkpoint: model and optimizer state_dict and the
    step, rank 0 writing, all_reduce for the agreement and the wait); %hpc restore loads it back after the
    parameters moved on."""
    folder = tmp_path_factory.mktemp("torch-checkpoints")
    folder.chmod(0o777)
    assert world.run(DDP).status == "ok"
    cell = world.run("%%torchrun -o saved\n"
                     f"ckpt = hpc.Checkpoint(model, opt, name='torch-test', directory={str(folder)!r})\n"
                     "hpc.on_walltime(ckpt.save)\n"
                     "for _ in range(10): hpc.step()\n"
                     "[hpc.any_rank(rank == 2), hpc.steps()]")
    assert cell.status == "ok", cell.error
    assert world.run("saved").result == "[[True, 10], [True, 10], [True, 10], [True, 10]]"  # one rank's flag, for all
    cell = world.run("%hpc checkpoint")
    assert cell.status == "ok", cell.error
    assert "hpcai: ranks 0-3: ran 1 walltime hook(s) at step 10" in cell.stdout and "step-000000010" in cell.stdout
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-000000010"]
    cell = world.run("%%torchrun -o moved --push params\nwith torch.no_grad():\n    for p in model.parameters(): p.add_(1.0)\n"
                     "opt.step()\n[p.detach().tolist() for p in model.parameters()] == params[rank]")
    assert cell.status == "ok" and world.run("moved").result == "[False, False, False, False]"
    cell = world.run("%hpc restore")
    assert cell.status == "ok", cell.error
    assert "hpcai: ranks 0-3: resumed at step 10 from " in cell.stdout, cell.stdout
    cell = world.run("%%torchrun -o back --push params\n[p.detach().tolist() for p in model.parameters()] == params[rank]")
    assert cell.status == "ok" and world.run("back").result == "[True, True, True, True]"


def test_line_magic_runs_a_script_with_arguments(world: JobKernel, tmp_path_factory: pytest.TempPathFactory) -> None:
    script = tmp_path_factory.mktemp("scripts") / "train.py"
    script.write_text("import sys\nimport torch.distributed as dist\n\n"
                      "def main(args):\n    print('args', args, 'rank', dist.get_rank())\n    if '--fail' in args and "
                      "dist.get_rank() == 2:\n        raise SystemExit('rank 2 gave up')\n\n"
                      "if __name__ == '__main__':\n    main(sys.argv[1:])\n")
    cell = world.run(f"%torchrun --output collapse {script} --epochs 3")
    assert cell.status == "ok", cell.error
    assert [ln for ln in cell.stdout.splitlines() if "args" in ln][0].startswith("[rank 0 n1] args ['--epochs', '3'] rank 0")
    cell = world.run(f"%torchrun {script} --fail")
    assert cell.status == "error" and "1 of 4 ranks failed: 2 (SystemExit: rank 2 gave up)" in cell.error


def test_rank_that_raises_and_timeout(world: JobKernel) -> None:
    cell = world.run("%%torchrun\nif rank == 1:\n    raise KeyError('lost')")
    assert cell.status == "error" and "1 of 4 ranks failed: 1 (KeyError" in cell.error
    assert "---- rank 1 on n1: KeyError ----" in cell.stdout
    cell = world.run("%%torchrun --timeout 10\nif rank != 0:\n    dist.all_reduce(torch.ones(1))")
    assert cell.status == "error" and "still running: rank 1 on n1, rank 2 on n2, rank 3 on n2" in cell.error
    assert world.run("%hpc restart").status == "ok"
    cell = world.run("%%torchrun\nt = torch.ones(1); dist.all_reduce(t); t.item()")
    assert cell.status == "ok" and cell.result == "4.0", "re-initialised after restart"


def test_killed_rank_and_restart(world: JobKernel) -> None:
    cell = world.run("%%torchrun\nimport os, time\nif rank == 3:\n    os.kill(os.getpid(), 9)\ntime.sleep(60)",
                     timeout=120)
    assert cell.status == "error" and "rank 3 on n2" in cell.error
    assert world.run("%hpc restart").status == "ok"
    assert world.run("%%torchrun\ndist.get_world_size()").result == "4"


def test_a_slow_framework_start_says_where_it_waits(world: JobKernel) -> None:
    """A framework's initialisation that outlasts calls.SLOW_INIT (1 s here, 60 s for real): the cell says which
    ranks it waits for and where each rank's boot thread is, then goes on. The slow boot is a thread of the test's
    own standing in for the rank's (a 4 s import), put where the rank's boot keeps it."""
    assert world.run("%hpc restart").status == "ok"
    held = world.run("import jupyter_hpcai.ranks.calls as calls\ncalls.SLOW_INIT = 1\n"
                     "from jupyter_hpcai.engines import current\ncurrent().view().activate()")
    assert held.status == "ok", held.error
    held = world.run("%%px --block\nimport threading, time, concurrent.futures as cf\n"
                     "import jupyter_hpcai.ranks.calls as calls\ncalls.SLOW_INIT = 1\nheld = cf.Future()\n"
                     "def slow_import():\n    time.sleep(4)\n    held.set_result(None)\n"
                     "calls._booting['torch'] = held\ncalls._boot_threads['torch'] = threading.Thread(target=slow_import)\n"
                     "calls._boot_threads['torch'].start()")
    assert held.status == "ok", held.error
    try:
        cell = world.run("%%torchrun\nt = torch.ones(1); dist.all_reduce(t); t.item()")
    finally:
        world.run("calls.SLOW_INIT = 60")  # the ranks' own is theirs until the next test's restart
    assert cell.status == "ok" and cell.result == "4.0", cell.error
    assert ("hpcai: initialising torch has taken over 1 s; not done yet: rank 0 on n1, rank 1 on n1, rank 2 on n2, "
            "rank 3 on n2") in cell.stdout, cell.stdout
    for rank, host in enumerate(["n1", "n1", "n2", "n2"]):
        assert f"[rank {rank} {host}] hpcai: rank {rank}: initialising torch has taken over 1 s" in cell.stdout
    assert "in slow_import" in cell.stdout and "time.sleep(4)" in cell.stdout, cell.stdout


def test_a_framework_start_that_fails_on_one_rank_does_not_leave_the_others_waiting(world: JobKernel) -> None:
    """Rank 1's torch start fails (its boot thread's error, standing in for a broken import on one node) while the
    others wait for it in init_process_group: within FAILED_INIT_GRACE the cell stops the world and shows rank 1's
    traceback, instead of waiting out torch's own timeout (Horovod over MPI has none)."""
    assert world.run("%hpc restart").status == "ok"
    assert world.run("from jupyter_hpcai.engines import current\ncurrent().view().activate()").status == "ok"
    broken = world.run("%%px --block\nimport concurrent.futures as cf, os\nimport jupyter_hpcai.ranks.calls as calls\n"
                       "if os.environ['SLURM_PROCID'] == '1':\n    calls._booting['torch'] = cf.Future()\n"
                       "    calls._booting['torch'].set_exception(ImportError('libtorch_cpu.so: cannot open shared "
                       "object file'))")
    assert broken.status == "ok", broken.error
    cell = world.run("%%torchrun\ndist.get_world_size()")
    assert cell.status == "error", cell.stdout
    assert "initialising torch failed on some ranks while the others waited for them" in cell.error, cell.error
    assert "---- rank 1 on n1: ImportError ----" in cell.error and "libtorch_cpu.so" in cell.error, cell.error
    assert "the engines were stopped" in cell.error
    assert world.run("%hpc restart").status == "ok"
    assert world.run("%%torchrun\ndist.get_world_size()").result == "4"


def test_nccl_without_a_gpu_fails_clearly(world: JobKernel) -> None:
    cell = world.run("%%torchrun --timeout 60\ndist.new_group(backend='nccl')")
    assert cell.status == "error" and "4 of 4 ranks failed" in cell.error
    assert "timed out" not in cell.error  # failed at once, did not hang
    world.run("import os; os.environ['HPCAI_TORCH_BACKEND'] = 'nccl'")
    world.run("%hpc restart")
    cell = world.run("%%torchrun\n1")
    assert cell.status == "error" and "backend nccl needs a GPU on every rank" in cell.error
    world.run("del os.environ['HPCAI_TORCH_BACKEND']")
    world.run("%hpc restart")


def test_benchmark_torchrun_against_plain_srun(world: JobKernel, bench: list[str]) -> None:
    code = r'''
import re, subprocess, sys, os
from jupyter_hpcai.engines import current
ip = get_ipython()
args = ["--batch", "32", "--warmup", "200", "--steps", "100"]
threads = {"OMP_NUM_THREADS": "1"}
srun = ["srun", "--mpi=none", "--overlap", "--nodes=2", "--ntasks-per-node=2"]
plains, magics = [], []
for _ in range(2):  # best of two each: 2 cores for 4 ranks are noisy
    ip.run_cell_magic("torchrun", "-o rates", "from jupyter_hpcai.bench.train_torch import main\nmain(%r)" % args)
    magics.append(rates[0])
ip.run_line_magic("hpc", "stop")  # plain runs with no engines alive
for _ in range(2):
    out = subprocess.run([*srun, sys.executable, "-m", "jupyter_hpcai.bench.train_torch", *args], capture_output=True,
                         text=True, timeout=600, env={**os.environ, **threads}).stdout
    plains.append(float(re.search(r"images/sec total ([\d.]+)", out).group(1)))
ip.run_line_magic("hpc", "start")
print("RESULT", max(magics), max(plains))
'''
    cell = world.run(code, timeout=900)
    assert cell.status == "ok", cell.error
    magic, plain = map(float, cell.stdout.split("RESULT ")[1].split())
    bench.append(f"%%torchrun throughput {magic:.1f} img/s / srun --mpi=none plain launch {plain:.1f} img/s "
                 f"= {magic / plain:.3f}")


DUMP = ("import json, os, pathlib, sys\n"  # each process's environment, in a file of its own
        "pathlib.Path(sys.argv[1], f'{os.getpid()}.json').write_text(json.dumps(dict(os.environ)))\n")
# torchrun's variables %%torchrun leaves out, and why
NOT_SET = {"TORCHELASTIC_ERROR_FILE": "the agent's error file: no agent here, the cell shows each rank's traceback",
           "OMP_NUM_THREADS": "torchrun sets 1 where it is unset; a rank here has its share of the node's CPUs (identity.pin)"}


def test_a_rank_has_the_variables_torchrun_gives_a_worker(world: JobKernel, tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    """The same layout (2 nodes x 2) under torchrun, started by srun in the job, and under %%torchrun: every variable
    torchrun adds to a worker's environment is set on the rank (but NOT_SET), the layout's with the same value."""
    folder = tmp_path_factory.mktemp("torchrun-env")
    (folder / "dump.py").write_text(DUMP)
    cell = world.run("%%torchrun -o ours\nimport os\ndict(os.environ)")
    assert cell.status == "ok", cell.error
    master = world.run("ours[0]['MASTER_ADDR']").result.strip("'")
    run = world.run(
        "import json, subprocess, sys\n"
        "from pathlib import Path\n"
        "def on_nodes(tag, *argv):\n"
        f"    out = Path({str(folder)!r}, tag)\n"
        "    out.mkdir()\n"
        "    done = subprocess.run(['srun', '--overlap', '-N2', '--ntasks-per-node=1', '-n2', *argv,\n"
        f"                           {str(folder / 'dump.py')!r}, str(out)], capture_output=True, text=True, timeout=300)\n"
        "    assert done.returncode == 0, done.stderr[-3000:]\n"
        "    return [json.loads(f.read_text()) for f in out.iterdir()]\n"
        "plain = on_nodes('plain', sys.executable)\n"
        "theirs = on_nodes('torchrun', sys.executable, '-m', 'torch.distributed.run', '--nnodes', '2',\n"
        f"                 '--nproc-per-node', '2', '--rdzv-backend', 'c10d', '--rdzv-endpoint', '{master}:29577',\n"
        "                 '--rdzv-id', 'envtest')\n"
        "added = sorted(set().union(*theirs) - set().union(*plain))\n"
        "theirs = sorted(theirs, key=lambda e: int(e['RANK']))\n"
        "len(theirs), added")
    assert run.status == "ok", run.error
    count = world.run("len(theirs)").result
    assert count == "4", run.stdout
    added = eval(world.run("added").result)  # noqa: S307 - our kernel's repr of a list of names
    assert "GROUP_RANK" in added and "TORCHELASTIC_RUN_ID" in added  # a control: the comparison sees torchrun's own
    missing = world.run(f"[k for k in added if k not in ours[0] and k not in {sorted(NOT_SET)!r}]").result
    assert missing == "[]", missing
    same = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_NAME", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
    differ = world.run(f"[(r, k, o.get(k), t.get(k)) for r, (o, t) in enumerate(zip(ours, theirs)) for k in {same!r} "
                       "if o.get(k) != t.get(k)]").result
    assert differ == "[]", differ
