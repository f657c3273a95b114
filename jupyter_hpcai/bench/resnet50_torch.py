"""ResNet-50 with torch.distributed (DDP) on synthetic data; the same file runs under srun, torchrun and %%torchrun.

torchvision's model when it imports beside this torch, else the same network defined here (bottleneck
blocks [3, 4, 6, 3], 25.6 M parameters). Rank 0 prints ``HPCAI_BENCH {json}``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from torch import nn

from .resnet50_train import parse


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out = planes * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(inplanes, planes, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes), nn.ReLU(inplace=True),
            nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = (nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out))
                         if stride != 1 or inplanes != out else nn.Identity())
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


def resnet50(classes: int = 1000) -> nn.Module:
    """torchvision's resnet50 when available, else this definition of the same network."""
    try:
        from torchvision.models import resnet50 as tv_resnet50

        return tv_resnet50(weights=None, num_classes=classes)
    except Exception:  # torchvision missing, or built for another torch
        pass
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    inplanes = 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(inplanes, planes, stride if i == 0 else 1))
            inplanes = planes * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, classes)]
    return nn.Sequential(*layers)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    import torch.distributed as dist

    from .train_torch import init_plain

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if not dist.is_initialized():
        init_plain()
    cuda = torch.cuda.is_available()
    # one GPU per rank: the engines pin each rank to its own (it sees one); bare torchrun shows every GPU to each
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()) if cuda \
        else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # NCCL's communicator on this rank's GPU
    model = nn.parallel.DistributedDataParallel(resnet50().to(device), device_ids=[device] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * dist.get_world_size())
    size = args.image_size
    images = torch.rand(args.batch, 3, size, size, device=device)
    labels = torch.randint(0, 1000, (args.batch,), device=device)
    use_amp = args.mixed_precision and cuda

    def step() -> None:
        opt.zero_grad()
        with torch.autocast(device.type, enabled=use_amp):
            loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()

    for _ in range(args.warmup + 1):
        step()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    rate = torch.tensor([args.batch * args.steps / (time.perf_counter() - start)], device=device)
    dist.all_reduce(rate)
    total = float(rate.item())
    result = {"ranks": dist.get_world_size(), "images_per_sec": total, "per_rank": total / dist.get_world_size(),
              "batch": args.batch, "steps": args.steps, "gpus": int(cuda),
              "parameters": sum(p.numel() for p in model.parameters())}
    if dist.get_rank() == 0:
        print("HPCAI_BENCH " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    from .train_torch import end_plain_launch

    main()
    end_plain_launch()
