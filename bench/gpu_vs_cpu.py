"""GPU vs CPU in one run: a ResNet-style training step and a PGD-40 batch (images/s and the ratio).

    .venv/bin/python bench/gpu_vs_cpu.py [--batch 64] [--image 64] [--repeats 5] [--threads N]

The model is the zoo's ResNet-style bottleneck network ([1, 1, 1, 1] sections, base 16 channels) on random
3×image×image inputs with 100 classes; PGD-40 (L∞, ε = 8/255) attacks the same model in eval mode. Without a CUDA
device the CPU figures are printed and the GPU rows say why they are missing. `--amp bf16` times the training
step under bfloat16 autocast on both devices.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F
from _timing import median_time

from modelward.core.zoo import ModelConfig, build_model
from modelward.robustness.attacks.pgd import PGD


def _setup(device: str, batch: int, image: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="resnet", sections=[1, 1, 1, 1], base_channels=16), (3, image, image), 100)
    x = torch.rand(batch, 3, image, image, device=device)
    y = torch.randint(0, 100, (batch,), device=device)
    return model.to(device), x, y


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def train_step_rate(device: str, batch: int, image: int, repeats: int, amp: bool) -> float:
    model, x, y = _setup(device, batch, image)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dtype = torch.bfloat16

    def step() -> None:
        ctx = torch.autocast(device_type=device.split(":")[0], dtype=dtype) if amp else contextlib.nullcontext()
        with ctx:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _sync(device)

    return batch / median_time(step, repeats)


def pgd_rate(device: str, batch: int, image: int, repeats: int) -> float:
    model, x, y = _setup(device, batch, image)
    model.eval()
    attack = PGD(model, eps=8 / 255, steps=40, seed=0)

    def run() -> None:
        attack(x, y)
        _sync(device)

    return batch / median_time(run, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--amp", choices=["none", "bf16"], default="none")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    amp = args.amp == "bf16"
    print(f"ResNet-style [1,1,1,1] base 16, batch {args.batch}, {args.image}×{args.image}×3, 100 classes; "
          f"CPU threads {args.threads}; amp {args.amp}")
    cpu_train = train_step_rate("cpu", args.batch, args.image, args.repeats, amp)
    cpu_pgd = pgd_rate("cpu", args.batch, args.image, max(1, args.repeats // 2))
    print(f"cpu   training step {cpu_train:10.1f} images/s   PGD-40 {cpu_pgd:10.1f} images/s")
    if not torch.cuda.is_available():
        print("cuda  not available on this machine: no GPU figures (run this script on a GPU machine)")
        return
    name = torch.cuda.get_device_name(0)
    gpu_train = train_step_rate("cuda", args.batch, args.image, args.repeats, amp)
    gpu_pgd = pgd_rate("cuda", args.batch, args.image, args.repeats)
    print(f"cuda  training step {gpu_train:10.1f} images/s   PGD-40 {gpu_pgd:10.1f} images/s   ({name})")
    print(f"ratio GPU/CPU: training step {gpu_train / cpu_train:.1f}×, PGD-40 {gpu_pgd / cpu_pgd:.1f}×")


if __name__ == "__main__":
    main()
