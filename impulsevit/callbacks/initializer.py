"""The ``Initializer`` callback: apply an ``impulsevit.init`` method once, at the start of fitting, on every rank.

Lightning 2.6 ``Trainer._run`` order: ``setup`` -> ``configure_model`` -> restore weights from ``ckpt_path`` (DDP,
single device) -> ``strategy.setup`` (DDP wrap + rank-0 broadcast, optimizers built) -> **on_fit_start** -> restore
weights (FSDP2 / ModelParallel) -> restore optimizer and loop state. Hence (docs/design.md, "Resume and determinism"):

1. Never on a resumed run: skipped when ``trainer.ckpt_path`` is set or when this callback's restored state says it
   was applied (DDP / single device restore both before ``on_fit_start``). FSDP2 restores weights, callback state and
   ``trainer.ckpt_path`` only after ``on_fit_start``: with ``fit(ckpt_path=...)`` the init runs and is then overwritten
   by the checkpoint (the resumed weights are right; ``on_train_start`` records it and logs nothing); set
   ``trainer.ckpt_path = path`` before ``fit`` to skip even that computation.
2. Identical on every rank: each rank seeds its own ``torch.Generator(seed)`` (never global RNG) and computes the
   same values; the callback then all-gathers the seed, the generator's final state and per-tensor checksums and
   raises ``RuntimeError`` naming the ranks and tensors when they differ (wrong seed, different code or model).
   Rounding-level differences (LAPACK/BLAS are not bit-reproducible across processes) are removed by broadcasting
   rank 0's tensors. FSDP2 ``DTensor`` shards (a different slice per rank) are checked through the generator state.
3. FSDP2: the initializer reads / writes ``DTensor`` parameters through ``read_full`` / ``write_full_``; this callback
   passes the unwrapped backbone (``pl_module.backbone``, never the DDP wrapper).
4. In place, so the optimizer built in ``strategy.setup`` keeps valid references; afterwards it calls
   ``pl_module.on_initialized(report)`` when the module implements :class:`InitializedHook` (``ImageClassifier`` takes
   its EMA copy there).

Logs (global rank 0, at ``on_train_start``, before the first step): the method, seed, family and resolved options
as hyperparameters (``init/*``), the ``InitReport`` table as text (``init/report``), and the initial attention maps +
per-head summary (``init/attention/*``, see ``attention_logging``).

Not supported: Lightning's FSDP1 ``FSDPStrategy`` (flat parameters), models the method does not handle (the error
names the method and the model before any training step).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from impulsevit._compat.lightning import callback_state_key
from impulsevit.callbacks.attention_logging import log_attention
from impulsevit.errors import ConfigError
from impulsevit.init import InitReport, calibration_size, initialize, is_dtensor, make_generator
from impulsevit.training.pretrained import FROM_WEIGHTS

__all__ = ["InitializedHook", "Initializer", "generator_digest", "tensor_digests", "verify_same_on_all_ranks"]

log = logging.getLogger(__name__)


def tensor_digests(model: nn.Module) -> tuple[list[str], torch.Tensor]:
    """Names and float64 digests ``(T, 3)`` (sum, position-weighted sum, sum of absolute values) of every parameter
    and buffer of ``model`` that is a plain (not ``DTensor``-sharded) numeric tensor."""
    names: list[str] = []
    rows: list[torch.Tensor] = []
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        data = t.data if isinstance(t, nn.Parameter) else t
        if is_dtensor(data) or not (data.is_floating_point() or data.dtype in (torch.int64, torch.int32)):
            continue
        flat = data.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
        w = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64)
        names.append(name)
        rows.append(torch.stack([flat.sum(), (flat * w).sum(), flat.abs().sum()]))
    return names, torch.stack(rows) if rows else torch.zeros(0, 3, dtype=torch.float64)


def generator_digest(generator: torch.Generator, seed: int) -> torch.Tensor:
    """float64 ``(3,)``: the seed and two sums of the generator's byte state (equal iff same seed and same draws)."""
    state = generator.get_state().to(torch.float64)
    return torch.stack([torch.tensor(float(seed), dtype=torch.float64), state.sum(),
                        (state * torch.arange(1, state.numel() + 1, dtype=torch.float64)).sum()])


def verify_same_on_all_ranks(
    trainer: L.Trainer, model: nn.Module, generator: torch.Generator, seed: int, what: str, rtol: float = 1e-6
) -> float:
    """Check that every rank computed the same init; make plain tensors bit-identical to rank 0's.

    All-gathers the seed, the generator state and per-tensor digests. Raises ``RuntimeError`` naming the ranks and
    tensors when the seed / generator state differ or a tensor's digest differs by more than ``rtol`` (relative to its
    absolute sum) — a wrong seed, different code or a different model on some rank. Differences within ``rtol`` (the
    same computation rounding differently in another process: BLAS / LAPACK paths are not bit-reproducible across
    processes) are removed by broadcasting rank 0's plain tensors in place. ``DTensor`` shards are checked through the
    generator state only (each rank holds a different slice). Returns the largest relative difference seen.
    """
    if trainer.world_size <= 1:
        return 0.0
    names, per = tensor_digests(model)
    vec = torch.cat([generator_digest(generator, seed), per.reshape(-1)])
    device = trainer.strategy.root_device
    gathered = trainer.strategy.all_gather(vec.to(device)).reshape(trainer.world_size, -1).cpu()
    gen_ok = [r for r in range(trainer.world_size) if torch.equal(gathered[r, :3], gathered[0, :3])]
    tens = gathered[:, 3:].reshape(trainer.world_size, len(names), 3)
    scale = tens[0, :, 2].abs().clamp_min(1e-30)
    rel = ((tens - tens[0]).abs().amax(dim=2) / scale) if names else torch.zeros(trainer.world_size, 0)
    worst = float(rel.max()) if rel.numel() else 0.0
    bad_ranks = sorted({r for r in range(trainer.world_size) if r not in gen_ok}
                       | {r for r in range(trainer.world_size) if rel.numel() and float(rel[r].max()) > rtol})
    if bad_ranks:
        bad_tensors = [names[i] for i in range(len(names)) if float(rel[:, i].max()) > rtol]
        seeds = {r: float(gathered[r, 0]) for r in range(trainer.world_size)}
        raise RuntimeError(
            f"Initializer: {what} differs across ranks (ranks {bad_ranks} differ from rank 0; generator state "
            f"{'differs' if len(gen_ok) < trainer.world_size else 'matches'}; seeds per rank {seeds}; tensors "
            f"differing: {bad_tensors[:8]}{' ...' if len(bad_tensors) > 8 else ''}; max relative difference "
            f"{worst:.3g}). Every rank must run the same code with the same init seed; otherwise the replicas would "
            "silently train different models."
        )
    if worst > 0.0:
        import torch.distributed as dist

        with torch.no_grad():
            for name, t in list(model.named_parameters()) + list(model.named_buffers()):
                if name in names:
                    dist.broadcast(t.data if isinstance(t, nn.Parameter) else t, src=0)
        rank_zero_info(f"Initializer: {what} differed across ranks by {worst:.2g} (relative, rounding); "
                       "rank 0's values were broadcast")
    return worst



@runtime_checkable
class InitializedHook(Protocol):
    """The hook the ``Initializer`` calls on the LightningModule right after the init was applied, once per run (not on
    resume): a module implementing it (``ImageClassifier``: its EMA copy of the freshly initialised backbone) gets the
    :class:`~impulsevit.init.api.InitReport`."""

    def on_initialized(self, report: Any) -> None: ...

class Initializer(L.Callback):
    """Run ``impulsevit.init.initialize(backbone, method, generator=Generator(seed), **options)`` at ``on_fit_start``.

    Args:
        method: registered init method (``impulse``, ``mimetic``, ``timm``, ``torch``, ``weight_selection``, ..., or
            one a plugin module registered; an import path ``module:function`` is deprecated) (checked once, before
            any data work, by :func:`impulsevit.init.check_init_method` through ``ImageClassifier`` / the CLI; a
            callback built by hand with an unknown method fails when it runs, naming the method).
        seed: seed of the generator every rank uses.
        options: method options (validated by the method; unknown keys raise).
        log_attention: log the initial attention maps and per-head summary (models without attention maps are
            skipped).
        verify: all-gather a checksum after init and fail on mismatch (multi-process runs only).
        pretrained: ``model.pretrained``: instead of the init, the module's ``load_weights()`` loads these weights
            (:mod:`impulsevit.training.pretrained`; once per run, never on a resume, like the init); the report's
            method is ``from weights``, with the source and its sha256.

    A method whose options ask for a calibration batch (impulse's ``pseudo_input='calibration'``) gets the first
    ``calibration_images`` training images: rank 0 reads them (the datamodule's ``calibration_images``) and
    broadcasts them, so every rank solves for the same batch; their count, shape and sha256 are in the report.

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
        pretrained: str | None = None,
    ) -> None:
        self.pretrained = pretrained or None
        self.method = method
        self.seed = int(seed)
        self.options = dict(options or {})
        self.log_attention = log_attention
        self.verify = verify
        self.applied = False
        self.report: InitReport | None = None
        self.skipped_reason: str | None = None
        self.max_rank_difference: float | None = None
        self._pending_log: tuple[nn.Module, InitReport] | None = None

    @property
    def state_key(self) -> str:
        return callback_state_key(self, method=self.method, seed=self.seed)

    def state_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "method": FROM_WEIGHTS if self.pretrained else self.method,
            "seed": self.seed,
            "pretrained": self.pretrained,
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
            what = f"the weights of {self.pretrained!r} are not re-read" if self.pretrained else \
                f"init {self.method!r} is not re-applied"
            rank_zero_info(f"Initializer: {self.skipped_reason}; {what}")
            return
        if self.pretrained:
            self._load_weights(pl_module)
            return
        model = getattr(pl_module, "backbone", pl_module)
        name = pl_module.hparams.get("backbone", type(model).__name__) if hasattr(pl_module, "hparams") else None
        generator = make_generator(self.seed)
        try:
            calibration = self._calibration(trainer, model)
            report = initialize(model, self.method, generator=generator, calibration=calibration, **self.options)
        except (ValueError, TypeError) as e:
            raise type(e)(f"init method {self.method!r} does not fit backbone {name!r}: {e}") from e
        self.applied, self.report = True, report
        if self.verify:
            self.max_rank_difference = verify_same_on_all_ranks(
                trainer, model, generator, self.seed, f"the {self.method!r} init of {name!r}"
            )
        if isinstance(pl_module, InitializedHook):
            pl_module.on_initialized(report)
        rank_zero_info(f"Initializer: applied {report.method!r} ({report.family}) to {report.model} in "
                       f"{report.seconds * 1000:.1f} ms")
        self._pending_log = (model, report)

    def _calibration(self, trainer: L.Trainer, model: nn.Module) -> torch.Tensor | None:
        """The calibration batch the method's options ask for (:func:`impulsevit.init.api.calibration_size`), or
        ``None``: rank 0 reads the first images of the training data (the datamodule's ``calibration_images``) and
        broadcasts them, so every rank solves for the same images.

        Raises:
            ConfigError: the options ask for one and the trainer's datamodule has no ``calibration_images``, or
                the training data has fewer images than asked for.
        """
        wanted = calibration_size(model, self.method, self.options)
        if not wanted:
            return None
        datamodule = getattr(trainer, "datamodule", None)
        read = getattr(datamodule, "calibration_images", None)
        if read is None:
            raise ConfigError(f"these options ask for a calibration batch of {wanted} images and the trainer has no "
                              "datamodule with calibration_images(n) (impulsevit's ImageDataModule has one)")
        images = read(wanted) if trainer.global_rank == 0 else None
        return trainer.strategy.broadcast(images, src=0)

    def _load_weights(self, pl_module: L.LightningModule) -> None:
        """``pl_module.load_weights()`` (``ImageClassifier``: loads ``model.pretrained`` unless the CLI already did)."""
        load = getattr(pl_module, "load_weights", None)
        if load is None:
            raise TypeError(f"Initializer(pretrained={self.pretrained!r}): {type(pl_module).__name__} has no "
                            f"load_weights(); start from weights with ImageClassifier(pretrained=...)")
        report = load()
        self.applied, self.report = True, report
        rank_zero_info(f"Initializer: started from weights {self.pretrained!r} (sha256 "
                       f"{report.options.get('sha256', '?')[:12]}…); init {self.method!r} not run")
        self._pending_log = (getattr(pl_module, "backbone", pl_module), report)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log the init (deferred to here: strategies that restore after ``on_fit_start`` are known to resume only now).

        Under FSDP2 / ModelParallel Lightning sets ``trainer.ckpt_path`` only after ``on_fit_start`` when the run was
        started with ``fit(ckpt_path=...)``: the init then ran, but the checkpoint's weights (and this callback's
        state) were restored over it. That case is recorded in ``skipped_reason`` and nothing is logged. Setting
        ``trainer.ckpt_path = path`` before ``fit`` lets the callback skip the computation as well.
        """
        pending, self._pending_log = self._pending_log, None
        if pending is None:
            return
        if trainer.ckpt_path is not None:
            self.skipped_reason = (f"resumed from {trainer.ckpt_path} (restored after on_fit_start; the checkpoint's "
                                   "weights replaced the init)")
            rank_zero_info(f"Initializer: {self.skipped_reason}")
            return
        self._log(trainer, *pending)

    def _log(self, trainer: L.Trainer, model: nn.Module, report: InitReport) -> None:
        if self.log_attention:
            log_attention(trainer, model, "init/attention", trainer.global_step, offsets=report.offsets or None)
        if trainer.global_rank != 0:
            return
        from impulsevit.training.trackers import log_hyperparams, log_text

        log_hyperparams(trainer.loggers, {"init": {"method": report.method, "seed": self.seed, "family": report.family,
                                                   "options": report.options}})
        log_text(trainer.loggers, "init/report", "```\n" + report.table() + "\n```", 0)
