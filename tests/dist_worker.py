"""Multi-process worker for tests/training/test_ddp.py and tests/training/test_fsdp.py (not a test module itself).

Run as a script: Lightning's ``ddp`` / ``fsdp2`` strategies on CPU re-launch this file as one subprocess per extra rank
(gloo). Each phase fits a tiny ViT on synthetic data and every rank writes ``<out>/<phase>_rank<R>.pt`` with what the
tests assert on:

- ``init_digest``: float64 checksum of the full parameters right after ``on_fit_start`` (on_train_start, i.e. after
  the Initializer and, on resume, after the weights were restored);
- ``local``: each parameter's local tensor at that point (the rank's shard under FSDP2) and its placements;
- ``final_digest`` / ``final_full``: the full parameters at the end of fitting; ``losses``; ``global_step``;
- ``initializer``: the Initializer's ``applied``, ``skipped_reason`` and ``max_rank_difference``;
- ``opt_ok``: the optimizer holds the live parameters.

Usage: ``python tests/dist_worker.py OUT --strategy ddp|fsdp2 --phases impulse,mimetic [--bad-seed-rank 1]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch

from impulsevit import ImageClassifier
from impulsevit.callbacks import Initializer
from impulsevit.data.loading.synthetic import SyntheticDataModule
from impulsevit.init import initialize, read_full, register
from impulsevit.init.api import InitResult
from impulsevit.init.vit_layout import is_vit

ROOT = Path(__file__).resolve().parents[1]


def run_worker(out: Path, *args: str, timeout: int = 420) -> subprocess.CompletedProcess:
    """Run this script in a fresh interpreter (for the tests); Lightning launches the other ranks from it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, __file__, str(out), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def load(out: Path, phase: str) -> list[dict]:
    """The per-rank records of ``phase``."""
    return [torch.load(out / f"{phase}_rank{r}.pt", weights_only=False) for r in (0, 1)]


TINY = dict(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, weight_init="skip")


@register("impulse_jitter", family="vit", matches=is_vit)
def _impulse_jitter(model: torch.nn.Module, generator: torch.Generator, options: dict) -> InitResult:
    """Test-only: impulse, then a rank-dependent rounding-size change of one tensor (what a non-bit-reproducible
    LAPACK path in another process would produce). The Initializer must remove it by broadcasting rank 0's values."""
    initialize(model, "impulse", generator=generator)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    model.head.weight.data.mul_(1.0 + 2e-7 * rank)  # ~2 float32 ulps
    return InitResult(options={})


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: read_full(p).detach().to("cpu", torch.float64).clone() for n, p in model.named_parameters()}


def digest(state: dict[str, torch.Tensor]) -> list[float]:
    return [float(sum(t.sum() for t in state.values())), float(sum((t * t).sum() for t in state.values()))]


class Probe(L.Callback):
    """Records what the tests need; every rank participates (read_full is a collective under FSDP2)."""

    def __init__(self, out: Path, phase: str) -> None:
        self.out, self.phase = out, phase
        self.record: dict = {"losses": []}

    def on_train_start(self, trainer: L.Trainer, pl_module: ImageClassifier) -> None:
        state = full_state(pl_module.backbone)
        local = {}
        for n, p in pl_module.backbone.named_parameters():
            t = p.data
            local[n] = {
                "tensor": (t.to_local() if hasattr(t, "to_local") else t).detach().cpu().clone(),
                "placements": repr(getattr(t, "placements", None)),
            }
        opt = trainer.optimizers[0]
        in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
        self.record.update(
            init_digest=digest(state), init_full=state, local=local, world_size=trainer.world_size,
            opt_ok=in_opt == {id(p) for p in pl_module.backbone.parameters()}, start_step=trainer.global_step,
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001
        self.record["losses"].append(float(outputs["loss"]))

    def on_train_end(self, trainer: L.Trainer, pl_module: ImageClassifier) -> None:
        state = full_state(pl_module.backbone)
        init_cb = next(c for c in trainer.callbacks if isinstance(c, Initializer))
        self.record.update(
            final_digest=digest(state), final_full=state, global_step=trainer.global_step,
            initializer={"applied": init_cb.applied, "skipped_reason": init_cb.skipped_reason,
                         "max_rank_difference": init_cb.max_rank_difference},
        )
        torch.save(self.record, self.out / f"{self.phase}_rank{trainer.global_rank}.pt")


def run_phase(args: argparse.Namespace, phase: str) -> None:
    # "impulse", "impulse:resume" (fit(ckpt_path=...) from that run's last.ckpt), "impulse:propagated" (a fresh run
    # with the option pseudo_input='propagated'), "impulse:calibration" (pseudo_input='calibration' on 16 images of
    # the training data)
    method, _, tag = phase.partition(":")
    options = {"propagated": {"pseudo_input": "propagated"},
               "calibration": {"pseudo_input": "calibration", "calibration_images": 16}}.get(tag, {})
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    seed = 0 + (1 if args.bad_seed_rank is not None and rank == args.bad_seed_rank else 0)
    model = ImageClassifier(
        "vit_tiny_patch16_224", dict(TINY), num_classes=4, init={"method": method, "seed": seed, "options": options},
        optimizer={"lr": 1e-3}, scheduler={"warmup_epochs": 0}, log_attention=args.log_attention,
        ema_decay=args.ema_decay,
    )
    dm = SyntheticDataModule(num_classes=4, image_size=32, num_train=64, num_val=16, batch_size=8)
    root = args.out / (f"root_{method}" + (f"_{tag}" if options else ""))
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=root / "checkpoints", save_last=True)
    trainer = L.Trainer(
        accelerator="cpu", devices=args.devices, strategy=args.strategy,
        max_steps=args.steps * (2 if tag == "resume" else 1),
        limit_val_batches=1, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root, callbacks=[Probe(args.out, phase), ckpt],
        gradient_clip_val=1.0, precision=args.precision,
    )
    trainer.fit(model, dm, ckpt_path=str(root / "checkpoints" / "last.ckpt") if tag == "resume" else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--phases", default="impulse")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--bad-seed-rank", type=int, default=None)
    ap.add_argument("--ema-decay", type=float, default=None)
    ap.add_argument("--log-attention", action="store_true")
    ap.add_argument("--precision", default="32-true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for phase in args.phases.split(","):
        run_phase(args, phase)


if __name__ == "__main__":
    main()
