"""A small DDP training loop reporting images/sec; the same file runs under plain srun, torchrun and %%torchrun.

Plain launch: ``srun --mpi=none python -m jupyter_hpcai.bench.train_torch`` (rank, world size and the
rendezvous come from Slurm's variables), or ``torchrun --standalone --nproc-per-node=N -m ...`` (from its own).
"""

from __future__ import annotations

import os
import sys
import time

from .train_small import parse_args


def init_plain() -> None:
    """A plain launch: torchrun's variables when it set them, else (srun) RANK/WORLD_SIZE from Slurm with rank 0's
    node and a port derived from the job id; NCCL where there is a GPU, Gloo elsewhere (as %%torchrun chooses)."""
    import torch
    import torch.distributed as dist

    if "TORCHELASTIC_RUN_ID" not in os.environ:
        from ..scheduler import chosen

        scheduler = chosen()
        environment = scheduler.environment
        first = scheduler.expand_hostlist(os.environ[environment.STEP_NODES])[0]
        os.environ.setdefault("RANK", os.environ[environment.RANK])
        os.environ.setdefault("WORLD_SIZE", os.environ[environment.TASKS])
        os.environ.setdefault("MASTER_ADDR", scheduler.node_address(first))
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ[environment.JOB_ID]) % 20000))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def end_plain_launch() -> None:
    """The end of a plain launch's process, once its results are printed: the process group goes, then the process,
    without C++'s static destructors. Left to the interpreter's exit, torch 2.13's Gloo transport aborts now and then
    ("terminate called without an active exception"; destroying the group first did not stop it), and torchrun
    then reports a run that did its work as failed."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if not dist.is_initialized():
        init_plain()
    torch.manual_seed(dist.get_rank())
    model = nn.parallel.DistributedDataParallel(nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    images, labels = torch.rand(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    rate = torch.tensor([args.batch * args.steps / (time.perf_counter() - start)])
    dist.all_reduce(rate)
    total = float(rate.item())
    if dist.get_rank() == 0:
        print(f"images/sec total {total:.1f} per rank {total / dist.get_world_size():.1f}", flush=True)
    return total


if __name__ == "__main__":
    main()
    end_plain_launch()
