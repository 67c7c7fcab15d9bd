"""Training-loop overhead: ``impulsevit fit`` vs a plain PyTorch loop, same timm model, data, optimizer and schedule.

Both contenders, in one process, alternating ``--rounds`` times (best round of each is reported, which filters out
noise from other processes on a shared machine):

* ``plain``: ``for images, labels in loader: loss = cross_entropy(model(images), labels, label_smoothing); zero_grad;
  backward; step; scheduler.step_update`` with timm's ``create_optimizer_v2`` (AdamW, weight-decay filter) and
  ``CosineLRScheduler(t_in_epochs=False)`` — what ``ImageClassifier`` uses — on the same ``SyntheticDataModule``
  loader;
* ``impulsevit``: ``impulsevit fit`` (the real CLI, in-process) on the same model / data / optimizer / schedule, with
  its default trainer (TensorBoard logging, ``RunCheckpoint``, atomic checkpoint IO, progress bar, the standard
  callbacks: initializer, per-rank RNG, SLURM requeue, non-finite-loss guard, throughput logger, lr monitor;
  torchmetrics train accuracy), mixup and EMA off
  (the plain loop has neither).

Timed: the optimizer steps ``[warmup, steps)`` of the single training epoch, from the start of step ``warmup`` to the
end of the last step (Lightning: ``on_train_batch_start`` → ``on_train_batch_end``; one-off costs — start-up, the
initializer, the end-of-epoch validation / checkpoint — are outside the window in both).

Prints steps/s of both and ends with ``ratio: X`` = plain time per step / impulsevit time per step (X > 1: impulsevit
faster; the target is X >= 0.95). Run: ``.venv/bin/python benchmarks/loop_overhead.py [--steps 30 --threads 2]
[--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import lightning as L
import timm
import torch
import torch.nn.functional as F
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler

from impulsevit.cli import ImpulseCLI, prepare_argv
from impulsevit.data import SyntheticDataModule

BACKBONE = "vit_tiny_patch16_224"
KWARGS = {"img_size": 32, "patch_size": 4, "embed_dim": 128, "depth": 4, "num_heads": 4}
LR, WD, WARMUP_STEPS, MIN_LR, WARMUP_LR, SMOOTHING = 1e-3, 0.05, 3, 1e-5, 1e-6, 0.1


def data_kwargs(steps: int, batch: int) -> dict:
    return {"num_classes": 10, "image_size": 32, "num_train": steps * batch, "num_val": batch, "batch_size": batch,
            "num_workers": 0}


class StepTimer(L.Callback):
    """Wall time from the start of optimizer step ``warmup`` to the end of the last training step."""

    def __init__(self, warmup: int = 5) -> None:
        self.warmup, self.start, self.end, self.steps = warmup, None, None, 0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if self.start is not None:
            self.end = time.perf_counter()
            self.steps = trainer.global_step - self.warmup


def plain_loop(steps: int, batch: int, warmup: int) -> float:
    """Seconds per optimizer step of the plain loop (steps ``[warmup, steps)``)."""
    torch.manual_seed(0)
    dm = SyntheticDataModule(**data_kwargs(steps, batch))
    dm.setup("fit")
    loader = dm.train_dataloader()
    model = timm.create_model(BACKBONE, num_classes=10, **KWARGS)
    opt = create_optimizer_v2(model, opt="adamw", lr=LR, weight_decay=WD, eps=1e-8, betas=(0.9, 0.999))
    sched = CosineLRScheduler(opt, t_initial=steps, lr_min=MIN_LR, warmup_t=WARMUP_STEPS, warmup_lr_init=WARMUP_LR,
                              t_in_epochs=False)
    model.train()
    start = None
    for i, (images, labels) in enumerate(loader):
        if i == warmup:
            start = time.perf_counter()
        loss = F.cross_entropy(model(images), labels, label_smoothing=SMOOTHING)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step_update(num_updates=i + 1)
    return (time.perf_counter() - start) / (len(loader) - warmup)


def impulsevit_fit_cli(steps: int, batch: int, warmup: int, runs_dir: Path, extra: list[str] = ()) -> ImpulseCLI:
    """One ``impulsevit fit`` run (in-process, the real CLI) of the benchmark's setting; ``extra``: more CLI args."""
    data = {"class_path": "impulsevit.data.SyntheticDataModule", "init_args": data_kwargs(steps, batch)}
    timer = {"class_path": f"{StepTimer.__module__}.StepTimer", "init_args": {"warmup": warmup}}
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny_synthetic.yaml"
    argv = [
        "fit", "--recipe", str(recipe), f"--runs_dir={runs_dir}", "--name=bench",
        f"--model.backbone={BACKBONE}", f"--model.backbone_kwargs={json.dumps(KWARGS)}", f"--data={json.dumps(data)}",
        "--model.init.method=timm", "--model.mixup=null", "--model.ema_decay=null",
        f"--model.label_smoothing={SMOOTHING}",
        f"--model.optimizer.lr={LR}", f"--model.optimizer.weight_decay={WD}",
        f"--model.scheduler.warmup_epochs={WARMUP_STEPS / steps}", f"--model.scheduler.min_lr={MIN_LR}",
        f"--model.scheduler.warmup_lr={WARMUP_LR}",
        "--trainer.max_epochs=1", "--trainer.deterministic=false", "--trainer.log_every_n_steps=50",
        "--trainer.enable_progress_bar=true", "--trainer.enable_model_summary=true", "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0", f"--trainer.callbacks=[{json.dumps(timer)}]", *extra,
    ]
    with mock.patch.object(sys, "argv", ["impulsevit"]):
        cli = ImpulseCLI(args=prepare_argv(argv))
    torch.use_deterministic_algorithms(False)
    return cli


def impulsevit_fit(steps: int, batch: int, warmup: int, runs_dir: Path) -> float:
    """Seconds per optimizer step of ``impulsevit fit`` (steps ``[warmup, steps)``)."""
    cli = impulsevit_fit_cli(steps, batch, warmup, runs_dir)
    t = next(cb for cb in cli.trainer.callbacks if isinstance(cb, StepTimer))
    assert t.steps == steps - warmup, (t.steps, steps, warmup)
    return (t.end - t.start) / t.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per run (one epoch)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of each run")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each contender; the best is kept")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, in seconds: checks that the script runs and prints its table, not its speed")
    args = ap.parse_args()
    if args.smoke:  # one round of each contender: 2 untimed + 2 timed steps of 4 images, one thread
        args.steps, args.warmup, args.batch, args.rounds, args.threads = 4, 2, 4, 1, 1
    torch.set_num_threads(args.threads)
    plain, ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            plain.append(plain_loop(args.steps, args.batch, args.warmup))
            ours.append(impulsevit_fit(args.steps, args.batch, args.warmup, Path(tmp) / f"r{r}"))
            print(f"round {r}: plain {1 / plain[-1]:.3f} steps/s, impulsevit {1 / ours[-1]:.3f} steps/s", flush=True)
    p, o = min(plain), min(ours)
    print(f"model {BACKBONE} {KWARGS}, batch {args.batch}, steps {args.warmup}..{args.steps}, "
          f"threads {args.threads}, best of {args.rounds}")
    print(f"plain PyTorch loop: {1 / p:.3f} steps/s ({p * 1000:.1f} ms/step)")
    print(f"impulsevit fit:     {1 / o:.3f} steps/s ({o * 1000:.1f} ms/step)")
    print(f"ratio: {p / o:.3f}")


if __name__ == "__main__":
    main()
