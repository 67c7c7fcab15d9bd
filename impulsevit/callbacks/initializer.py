"""The ``Initializer`` callback: apply an ``impulsevit.init`` method once, at the start of fitting, on every rank.

Lightning 2.6 ``Trainer._run`` order: ``setup`` -> ``configure_model`` -> restore weights from ``ckpt_path`` (DDP,
single device) -> ``strategy.setup`` (DDP wrap + rank-0 broadcast, optimizers built) -> **on_fit_start** -> restore
weights (FSDP2 / ModelParallel) -> restore optimizer and loop state. Hence (design.md §4):

1. Never on a resumed run: skipped when ``trainer.ckpt_path`` is set (covers FSDP2, whose callback state is restored
   only after ``on_fit_start``) or when this callback's own restored state says it was applied.
2. Identical on every rank: each rank seeds its own ``torch.Generator(seed)`` (never global RNG), computes the same
   values, then the callback all-gathers a checksum and raises ``RuntimeError`` naming the ranks when they differ.
   For plain tensors the checksum covers every parameter and buffer; for FSDP2 ``DTensor`` shards (each rank holds a
   different slice) it covers the seed, the generator's final state and any replicated tensors.
3. FSDP2: the initializer reads / writes ``DTensor`` parameters through ``read_full`` / ``write_full_``; this callback
   passes the unwrapped backbone (``pl_module.backbone``, never the DDP wrapper).
4. In place, so the optimizer built in ``strategy.setup`` keeps valid references; afterwards it calls
   ``pl_module.on_initialized(report)`` when defined (``ImageClassifier`` takes its EMA copy there).

Logs (global rank 0): the method, seed, family and resolved options as hyperparameters (``init/*``), the
``InitReport`` table as text (``init/report``), and the initial attention maps + per-head summary
(``init/attention/*``, see ``attention_logging``).

Not supported: Lightning's FSDP1 ``FSDPStrategy`` (flat parameters), models the method does not handle (the error
names the method and the model before any training step).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from impulsevit.callbacks.attention_logging import log_attention
from impulsevit.init import InitReport, initialize, make_generator

__all__ = ["Initializer", "model_checksum", "verify_same_on_all_ranks"]

log = logging.getLogger(__name__)


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "device_mesh") and hasattr(t, "placements")


def model_checksum(model: nn.Module, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
    """A float64 vector ``(5,)`` that differs when parameters, the generator state or the seed differ.

    Entries: sum and position-weighted sum over every non-sharded parameter / buffer (float64), sum and weighted sum of
    the generator's byte state, and the seed. ``DTensor`` shards are left out (they differ between ranks by design).
    """
    s = torch.zeros(5, dtype=torch.float64)
    for i, (_, t) in enumerate(list(model.named_parameters()) + list(model.named_buffers())):
        data = t.data if isinstance(t, nn.Parameter) else t
        if _is_dtensor(data) or not (data.is_floating_point() or data.dtype in (torch.int64, torch.int32)):
            continue
        flat = data.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
        s[0] += flat.sum()
        w = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64) if flat.numel() else flat
        s[1] += (flat * w).sum() * (1.0 + 1e-3 * i)
    if generator is not None:
        state = generator.get_state().to(torch.float64)
        s[2] = state.sum()
        s[3] = (state * torch.arange(1, state.numel() + 1, dtype=torch.float64)).sum()
    if seed is not None:
        s[4] = float(seed)
    return s


def verify_same_on_all_ranks(trainer: L.Trainer, digest: torch.Tensor, what: str) -> None:
    """All-gather ``digest`` and raise ``RuntimeError`` naming the ranks whose digest differs from rank 0's."""
    if trainer.world_size <= 1:
        return
    device = trainer.strategy.root_device
    gathered = trainer.strategy.all_gather(digest.to(device)).reshape(trainer.world_size, -1).cpu()
    ref = gathered[0]
    bad = [r for r in range(trainer.world_size) if not torch.allclose(gathered[r], ref, rtol=1e-12, atol=0.0)]
    if bad:
        rows = "; ".join(f"rank {r}: {gathered[r].tolist()}" for r in range(trainer.world_size))
        raise RuntimeError(
            f"Initializer: {what} differs across ranks after init (ranks {bad} differ from rank 0). Every rank must "
            f"use the same init seed and the same model; replicas would silently diverge. Checksums: {rows}"
        )


class Initializer(L.Callback):
    """Run ``impulsevit.init.initialize(backbone, method, generator=Generator(seed), **options)`` at ``on_fit_start``.

    Args:
        method: registered init method (``impulse``, ``mimetic``, ``timm``, ``torch``, ``weight_selection``, ...).
        seed: seed of the generator every rank uses.
        options: method options (validated by the method; unknown keys raise).
        log_attention: log the initial attention maps and per-head summary (models without attention maps are
            skipped).
        verify: all-gather a checksum after init and fail on mismatch (multi-process runs only).

    The model initialized is ``pl_module.backbone`` if the module has one, else the module itself. See the module
    docstring for the resume / DDP / FSDP2 rules. State (``state_dict``): ``applied``, method, seed and the report.
    """

    def __init__(
        self,
        method: str = "impulse",
        seed: int = 0,
        options: dict[str, Any] | None = None,
        log_attention: bool = True,
        verify: bool = True,
    ) -> None:
        self.method = method
        self.seed = int(seed)
        self.options = dict(options or {})
        self.log_attention = log_attention
        self.verify = verify
        self.applied = False
        self.report: InitReport | None = None
        self.skipped_reason: str | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(method=self.method, seed=self.seed)

    def state_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "method": self.method,
            "seed": self.seed,
            "options": dict(self.options),
            "report": None if self.report is None else self.report.to_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.applied = bool(state_dict.get("applied", False))
        rep = state_dict.get("report")
        if rep is not None and self.report is None:
            self.report = InitReport(**rep)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path is not None or self.applied:
            self.skipped_reason = (
                f"resumed from {trainer.ckpt_path}" if trainer.ckpt_path is not None else "already applied"
            )
            rank_zero_info(f"Initializer: {self.skipped_reason}; init {self.method!r} is not re-applied")
            return
        model = getattr(pl_module, "backbone", pl_module)
        name = pl_module.hparams.get("backbone", type(model).__name__) if hasattr(pl_module, "hparams") else None
        generator = make_generator(self.seed)
        try:
            report = initialize(model, self.method, generator=generator, **self.options)
        except (ValueError, TypeError) as e:
            raise type(e)(f"init method {self.method!r} does not fit backbone {name!r}: {e}") from e
        self.applied, self.report = True, report
        if self.verify:
            verify_same_on_all_ranks(
                trainer, model_checksum(model, generator, self.seed), f"the {self.method!r} init of {name!r}"
            )
        hook = getattr(pl_module, "on_initialized", None)
        if callable(hook):
            hook(report)
        rank_zero_info(f"Initializer: applied {report.method!r} ({report.family}) to {report.model} in "
                       f"{report.seconds * 1000:.1f} ms")
        self._log(trainer, model, report)

    def _log(self, trainer: L.Trainer, model: nn.Module, report: InitReport) -> None:
        if self.log_attention:
            log_attention(trainer, model, "init/attention", trainer.global_step, offsets=report.offsets or None)
        if trainer.global_rank != 0:
            return
        from lightning.pytorch.loggers import TensorBoardLogger

        for lg in trainer.loggers:
            lg.log_hyperparams({"init": {"method": report.method, "seed": self.seed, "family": report.family,
                                         "options": report.options}})
            if isinstance(lg, TensorBoardLogger):
                lg.experiment.add_text("init/report", "```\n" + report.table() + "\n```", global_step=0)
