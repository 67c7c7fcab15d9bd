"""Training throughput: ``impulsevit fit`` (Lightning + ImageClassifier, every default callback) vs a plain timm loop,
on the same synthetic batch, model, precision and optimizer, in one process.

Both contenders copy the same pinned host batch to the device every step (``non_blocking``), run forward / backward
under the same autocast, and step a fused AdamW on CUDA (timm's loop: ``torch.optim.AdamW(fused=True)``; impulsevit:
its own choice on CUDA). Timing starts after ``--warmup`` steps and ends after the last step, with a device
synchronize at both ends only. MFU = measured FLOP/s ÷ the device's dense peak for the compute dtype (forward +
backward FLOPs of one batch from ``torch.utils.flop_counter`` on the meta device); on CPU there is no peak (``-``).

    python benchmarks/gpu_throughput.py [--model vit_base_patch16_224] [--image-size 224] [--batch 128]
        [--steps 40] [--warmup 10] [--device cuda|cpu] [--contenders timm,fit,fit_fsdp2] [--compile] [--smoke]

Prints a ``columns:`` header, one ``row`` line per contender (``row <name> <img/s> <mfu>``, read by
``benchmarks/gpu_check.sh``) and, as the last line, ``ratio: X`` = impulsevit fit img/s ÷ timm loop img/s (1.0: no
framework overhead).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning as L
import timm
import torch
import torch.nn.functional as F

from impulsevit import ImageClassifier
from impulsevit.callbacks.throughput import peak_flops, training_flops


def batch(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g)
    y = torch.randint(0, 1000, (args.batch,), generator=g)
    if args.device == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
    return x, y


def peak(args: argparse.Namespace) -> float | None:
    if args.device != "cuda":
        return None
    from lightning.fabric.utilities.throughput import get_available_flops

    dtype = torch.bfloat16
    return peak_flops(torch.cuda.get_device_name(), dtype) or get_available_flops(torch.device("cuda"), dtype)


def flops(args: argparse.Namespace) -> int:
    with torch.device("meta"):
        model = timm.create_model(args.model, img_size=args.image_size, num_classes=1000)
        return training_flops(model, torch.empty(args.batch, 3, args.image_size, args.image_size))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timm_loop(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    dev = torch.device(args.device)
    model = timm.create_model(args.model, img_size=args.image_size, num_classes=1000).to(dev).train()
    if args.compile:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, fused=args.device == "cuda")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    t0 = 0.0
    for step in range(args.steps):
        if step == args.warmup:
            sync(args.device)
            t0 = time.perf_counter()
        x, y = (t.to(dev, non_blocking=True) for t in data)
        with torch.autocast(args.device, dtype=dtype, enabled=args.device == "cuda"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(args.device)
    return (args.steps - args.warmup) * args.batch / (time.perf_counter() - t0)


class _Clock(L.Callback):
    def __init__(self, warmup: int, device: str) -> None:
        self.warmup, self.device, self.t0, self.t1 = warmup, device, 0.0, 0.0

    def on_train_batch_start(self, trainer: L.Trainer, *a: Any) -> None:
        if trainer.global_step == self.warmup and not self.t0:
            sync(self.device)
            self.t0 = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, *a: Any) -> None:
        sync(self.device)
        self.t1 = time.perf_counter()


class _Data(L.LightningDataModule):
    """The same pinned batch ``steps`` times (Lightning moves it to the device with ``non_blocking=True``)."""

    def __init__(self, data: tuple[torch.Tensor, torch.Tensor], steps: int, image_size: int) -> None:
        super().__init__()
        self.data, self.steps, self.image_size, self.batch_size = data, steps, image_size, data[0].shape[0]
        self.num_classes = 1000

    def train_dataloader(self) -> _Repeat:
        return _Repeat(self.data, self.steps)


class _Repeat:
    """An iterable of ``n`` times the same batch (a plain list would be read as a list of dataloaders)."""

    def __init__(self, item: tuple[torch.Tensor, torch.Tensor], n: int) -> None:
        self.item, self.n = item, n

    def __iter__(self):  # noqa: ANN204
        return iter([self.item] * self.n)

    def __len__(self) -> int:
        return self.n


def fit(args: argparse.Namespace, data: tuple[torch.Tensor, torch.Tensor], strategy: str) -> float:
    model = ImageClassifier(args.model, backbone_kwargs={"img_size": args.image_size, "weight_init": "skip"},
                            num_classes=1000, mixup=None, log_attention=False, compile=args.compile,
                            optimizer={"lr": 1e-4, "weight_decay": 0.05}, scheduler={"warmup_epochs": 0})
    clock = _Clock(args.warmup, args.device)
    trainer = L.Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, strategy=strategy,
                        precision="bf16-mixed" if args.device == "cuda" else "32-true", max_steps=args.steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, log_every_n_steps=50, callbacks=[clock])
    trainer.fit(model, datamodule=_Data(data, args.steps, args.image_size))
    return (args.steps - args.warmup) * args.batch / (clock.t1 - clock.t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--contenders", default="timm,fit,fit_fsdp2")
    p.add_argument("--compile", action="store_true", help="torch.compile both contenders' models")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = p.parse_args()
    if args.smoke:  # ViT-Ti at 64 px (a 4x4 grid: impulse needs 3x3), batch 2, 3 steps after 1 warm-up, on --device
        args.model, args.image_size, args.batch, args.steps, args.warmup = "vit_tiny_patch16_224", 64, 2, 3, 1
    if args.device == "cuda":
        torch.set_float32_matmul_precision("high")
    data = batch(args)
    per_batch, top = flops(args), peak(args)
    print("columns: row <contender>[<model>@<image size>,b<batch>,<device>] <img/s> <MFU>")
    rates: dict[str, float] = {}
    for name in args.contenders.split(","):
        if name == "timm":
            rates[name] = timm_loop(args, data)
        elif name == "fit":
            rates[name] = fit(args, data, "auto")
        elif name == "fit_fsdp2":
            rates[name] = fit(args, data, "fsdp2")
        else:
            raise SystemExit(f"unknown contender {name!r}: timm, fit, fit_fsdp2")
        mfu = f"{rates[name] / args.batch * per_batch / top:.3f}" if top else "-"
        print(f"row {name}[{args.model}@{args.image_size},b{args.batch},{args.device}] {rates[name]:.1f} {mfu}",
              flush=True)
    if "timm" in rates and "fit" in rates:
        print(f"ratio: {rates['fit'] / rates['timm']:.3f}")


if __name__ == "__main__":
    main()
