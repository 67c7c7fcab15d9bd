"""Shared pieces of the CLI / resume / export tests: run the real CLI in-process on the tiny synthetic recipe."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from unittest import mock

import lightning as L
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from impulsevit.cli import ImpulseCLI, prepare_argv

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "tiny_synthetic.yaml"
LR_TAG = "lr/pg1"  # LearningRateMonitor's tag for the first param group (timm: no-decay, then decay)


class StopAfterEpoch(L.Callback):
    """Stops fitting (Lightning's graceful ``should_stop``) at the end of epoch ``epoch`` (0-based) — an interruption
    that, unlike a smaller ``max_epochs``, leaves the recipe (and so the lr schedule) unchanged."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch >= self.epoch:
            trainer.should_stop = True


class StopAfterStep(L.Callback):
    """Stops fitting right after optimizer step ``step`` (1-based ``global_step``), mid-epoch."""

    def __init__(self, step: int = 1) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class SlowSteps(L.Callback):
    """Sleeps ``seconds`` after every training step (so a signal or ``max_time`` lands mid-training); writes the file
    ``marker`` once ``after`` steps are done."""

    def __init__(self, seconds: float = 0.1, marker: str | None = None, after: int = 0) -> None:
        self.seconds, self.marker, self.after = seconds, marker, after

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        time.sleep(self.seconds)
        if self.marker and trainer.global_step >= self.after and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(trainer.global_step))


class MarkThenSleep(L.Callback):
    """After ``after`` optimizer steps, writes the file ``marker`` and then sleeps ``seconds`` (once), still inside
    that step's ``on_train_batch_end``: a test that sees the marker knows the process is in that sleep, before the
    step boundary's checks that run after this callback."""

    def __init__(self, marker: str, seconds: float = 5.0, after: int = 1) -> None:
        self.marker, self.seconds, self.after, self.done = marker, seconds, after, False

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.after and not self.done:
            self.done = True
            Path(self.marker).write_text(str(trainer.global_step))
            time.sleep(self.seconds)


class SignalAtStep(L.Callback):
    """Sends signal ``signum`` to this process at the start of the training batch after ``step`` optimizer steps."""

    def __init__(self, step: int = 1, signum: int = 15) -> None:
        self.step, self.signum, self.sent = step, signum, False

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class EpochEndLog(L.Callback):
    """Appends one line per ``on_validation_epoch_end`` (not the sanity check) and ``on_train_epoch_end`` to the file
    ``path``: ``<hook> epoch=<current_epoch> step=<global_step>``. Append mode, so a stopped and resumed run's lives
    write one list: each epoch's lines exactly once, in an uninterrupted run's order, is what a resume must give."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _line(self, trainer: L.Trainer, hook: str) -> None:
        with self.path.open("a") as f:
            f.write(f"{hook} epoch={trainer.current_epoch} step={trainer.global_step}\n")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._line(trainer, "validation_epoch_end")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._line(trainer, "train_epoch_end")


class DrawProbe(L.Callback):
    """Records, per training step, the mixup / CutMix draw (timm ``Mixup``'s λ and kind) and the drop-path keep masks
    of every ``DropPath`` module, plus the torch RNG state at ``on_fit_start`` (after a resume restored it); writes
    ``<out>/rank<R>.pt`` at the end of fitting."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.record: dict = {"lam": {}, "masks": {}}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from timm.layers import DropPath

        mix = pl_module.mixup_fn
        draw = mix._params_per_batch

        def recorded():  # noqa: ANN202
            lam, cutmix = draw()
            self.record["lam"][trainer.global_step] = (float(lam), bool(cutmix))
            return lam, cutmix

        mix._params_per_batch = recorded
        for name, module in pl_module.named_modules():
            if isinstance(module, DropPath):
                def hook(mod, inputs, output, name=name):  # noqa: ANN001, ANN202
                    if mod.training:
                        kept = output.flatten(1).abs().sum(1).ne(0)
                        self.record["masks"].setdefault(trainer.global_step, {})[name] = kept.tolist()
                module.register_forward_hook(hook)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after Lightning restored the callbacks' states from a checkpoint, before the loaders are built
        self.record["rng_at_start"] = torch.get_rng_state()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record["start_step"] = trainer.global_step  # the loops' state is restored after on_fit_start

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        torch.save(self.record, self.out / f"rank{trainer.global_rank}.pt")


def run_cli(*args: str) -> ImpulseCLI:
    """``impulsevit <args>`` in this process (argv normalised as the console script does); returns the CLI object.

    ``sys.argv`` is set to the bare program name meanwhile, as under the console script (LightningCLI warns when it
    sees pytest's own arguments next to ``args``), and ``os.environ`` is restored afterwards: a single-process
    ``fsdp2`` run sets ``LOCAL_RANK`` / ``MASTER_PORT`` / ... there, which would make later subprocesses (any test's
    DDP launch) believe an external launcher started them."""
    with mock.patch.object(sys, "argv", ["impulsevit"]), mock.patch.dict(os.environ):
        return ImpulseCLI(args=prepare_argv(list(args)))


def subprocess_env() -> dict[str, str]:
    """Environment for an ``impulsevit`` subprocess: one thread, the repo and ``tests/`` importable, and no
    distributed-launch variables inherited from this process."""
    launch = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "TORCHELASTIC_RUN_ID")
    env = {k: v for k, v in os.environ.items() if k not in launch}
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), *extra]))
    return env


def tiny(runs_dir: Path, name: str, *extra: str, subcommand: str = "fit") -> list[str]:
    """Arguments for the tiny synthetic recipe writing to ``runs_dir/name``."""
    return [subcommand, "--recipe", str(TINY), f"--runs_dir={runs_dir}", f"--name={name}", *extra]


def state_dict(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """All ``(step, value)`` of a TensorBoard scalar over every event file of a run directory, in file order."""
    out: list[tuple[int, float]] = []
    for f in sorted(run_dir.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns):
        ea = EventAccumulator(str(f), size_guidance={"scalars": 0})
        ea.Reload()
        if tag in ea.Tags()["scalars"]:
            out += [(e.step, e.value) for e in ea.Scalars(tag)]
    return out
