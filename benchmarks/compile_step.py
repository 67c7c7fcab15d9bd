"""CPU training-step time of the recipes' ViT with ``model.compile`` (torch.compile, inductor) vs eager, side by side.

The step is the DeiT / ViT-Ti recipes' model path at a CPU-sized scale: a timm ViT-Ti-width backbone (drop path 0.1)
built as ``ImageClassifier`` builds it, timm ``Mixup``/CutMix with label smoothing, ``SoftTargetCrossEntropy``,
backward, AdamW step. The compiled contender compiles the backbone in place (``nn.Module.compile``, inductor), as
``model.compile: true`` does. Both contenders start from the same weights and run the same batches in one process;
after ``--warmup`` untimed steps (the compiled one's first step includes compiling, reported separately), the median
of ``--rounds`` interleaved rounds of ``--steps`` steps each is taken.

    OMP_NUM_THREADS=2 python benchmarks/compile_step.py [--depth 4] [--image-size 64] [--patch 8] [--batch 32]
        [--steps 10] [--rounds 3] [--warmup 2] [--threads N] [--backend inductor] [--smoke]

Prints one row per contender (ms per step, img/s) and, as the last line, ``ratio: X`` = eager step time ÷ compiled
step time (above 1: compiling pays off). Needs a C compiler (inductor's CPU backend). CPU only; the GPU figure comes
from ``benchmarks/gpu_throughput.py --compile``. ``--smoke`` (one block, batch 2, one step) compiles with the
``aot_eager`` backend unless ``--backend`` is given: dynamo traces and AOT autograd splits the same step, without
inductor's minutes of C++ code generation (its ratio means nothing; it checks that the script runs).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import timm
import torch
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--patch", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (the compiled one compiles here)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--backend", default=None, help="torch.compile backend (default: inductor; aot_eager with --smoke)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = p.parse_args()
    if args.smoke:  # one block, 4 tokens, batch 2, one step each
        args.depth, args.image_size, args.patch, args.batch, args.steps, args.rounds, args.warmup = 1, 16, 8, 2, 1, 1, 1
    args.backend = args.backend or ("aot_eager" if args.smoke else "inductor")
    return args


class Step:
    """One contender: a backbone, its optimizer, and the recipe's mixup + loss."""

    def __init__(self, backbone: torch.nn.Module, backend: str | None) -> None:
        self.backbone = backbone
        if backend is not None:
            self.backbone.compile(backend=backend)  # in place: what ImageClassifier.configure_model does (inductor)
        self.opt = torch.optim.AdamW(self.backbone.parameters(), lr=1e-3, weight_decay=0.05)
        self.mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
        self.loss = SoftTargetCrossEntropy()
        self.backbone.train()

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> float:
        x, y = self.mixup(images, labels)
        loss = self.loss(self.backbone(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())


def timed(step: Step, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Seconds per step over ``batches``."""
    t0 = time.perf_counter()
    for images, labels in batches:
        step(images, labels)
    return (time.perf_counter() - t0) / len(batches)


def main() -> None:
    args = parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=args.image_size,
                              patch_size=args.patch, depth=args.depth, drop_path_rate=0.1)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(args.batch, 3, args.image_size, args.image_size, generator=g),
                torch.randint(0, 10, (args.batch,), generator=g)) for _ in range(args.steps)]
    compiled = f"compiled ({args.backend})"
    contenders = {"eager": Step(copy.deepcopy(model), backend=None),
                  compiled: Step(copy.deepcopy(model), backend=args.backend)}
    first: dict[str, float] = {}
    for name, step in contenders.items():
        t0 = time.perf_counter()
        for images, labels in batches[:max(args.warmup, 1)]:
            step(images, labels)
        first[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, step in contenders.items():
            times[name].append(timed(step, batches))
    print(f"ViT-Ti width (D 192, 3 heads), depth {args.depth}, {args.image_size} px / patch {args.patch} "
          f"({(args.image_size // args.patch) ** 2} tokens), batch {args.batch}, drop path 0.1, mixup/cutmix, AdamW; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.rounds} rounds x "
          f"{args.steps} steps")
    print(f"{'contender':<22} {'ms/step':>9} {'img/s':>8} {'warmup s':>9}")
    med = {name: statistics.median(v) for name, v in times.items()}
    for name in contenders:
        print(f"{name:<22} {med[name] * 1e3:>9.1f} {args.batch / med[name]:>8.1f} {first[name]:>9.1f}")
    print(f"ratio: {med['eager'] / med[compiled]:.3f}")


if __name__ == "__main__":
    main()
