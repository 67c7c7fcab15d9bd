"""Cost of the default ``AttentionEvolution`` callback relative to the training it observes, in one process.

For a recipe (default ``quickstart``) it builds the recipe's ``ImageClassifier`` (its ``model:`` section, impulse init)
and times, interleaved over ``--rounds`` rounds on the same process:

* ``train step``: one optimizer step (forward, label-smoothed cross-entropy, backward, AdamW) of the backbone on a
  random batch of the recipe's batch size and image size (data loading excluded, which makes the ratio larger than
  in a real run);
* ``probe``: what the callback does at each logging point — ``probe_maps`` on the probe batch (the callback's default
  16 images) and the pseudo-input, then ``locality`` for both (``impulsevit.callbacks.attention_evolution``).

Overhead per epoch = probe time ÷ (steps per epoch × step time), with the recipe's ``every_n_epochs`` = 1 (the
default: one point per epoch) and its training-set size (``--train-size``, default Fashion-MNIST's 60,000).
Medians over rounds. The last line is ``ratio: X`` = that overhead (target X <= 0.02).

    python benchmarks/attention_overhead.py [--recipe quickstart] [--rounds 5] [--train-size 60000] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import yaml

from impulsevit.callbacks.attention_evolution import AttentionEvolution, probe_maps
from impulsevit.init import initialize
from impulsevit.init.locality import locality
from impulsevit.run.recipes import resolve_recipe
from impulsevit.training.module import ImageClassifier


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="quickstart")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps timed per round")
    ap.add_argument("--train-size", type=int, default=60000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = ap.parse_args()
    if args.smoke:  # one round of one step at a batch of the probe's 16 images, one thread
        args.rounds, args.steps, args.threads = 1, 1, 1
    torch.set_num_threads(args.threads)
    cfg = yaml.safe_load(resolve_recipe(args.recipe).read_text())
    data = cfg["data"]["init_args"]
    size, batch = int(data["image_size"]), int(data["batch_size"])
    if args.smoke:
        batch = min(batch, AttentionEvolution().num_images)
    model_cfg = {k: v for k, v in cfg["model"].items() if k not in ("compile",)}
    module = ImageClassifier(**model_cfg, num_classes=10, img_size=size)  # the CLI links data.image_size to it
    initialize(module.backbone, "impulse", generator=0)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, 3, size, size, generator=g), torch.randint(0, 10, (batch,), generator=g)
    probe = x[: AttentionEvolution().num_images].clone()

    def step() -> None:
        module.train()
        loss = F.cross_entropy(module.backbone(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def measure() -> None:
        module.eval()
        for maps in probe_maps(module.backbone, probe).values():
            locality(maps, tuple(maps.grid), int(maps.num_prefix))

    step(), measure()  # warm-up
    step_times, probe_times = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        step_times.append((time.perf_counter() - t0) / args.steps)
        t0 = time.perf_counter()
        measure()
        probe_times.append(time.perf_counter() - t0)
    step_s, probe_s = statistics.median(step_times), statistics.median(probe_times)
    steps_per_epoch = args.train_size // batch
    print(f"recipe {args.recipe}: {size} px, batch {batch}, {steps_per_epoch} steps/epoch, {args.threads} threads")
    print(f"train step   {1000 * step_s:8.1f} ms   (epoch ~{steps_per_epoch * step_s:.1f} s without data loading)")
    print(f"probe        {1000 * probe_s:8.1f} ms   (once per epoch)")
    print(f"ratio: {probe_s / (steps_per_epoch * step_s):.4f}")


if __name__ == "__main__":
    main()
