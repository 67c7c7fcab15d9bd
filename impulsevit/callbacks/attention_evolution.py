"""Attention locality over training, on real images: :class:`AttentionEvolution` (a standard callback).

At the end of the sanity check of a fresh run (the initial weights), every ``every_n_epochs`` validation epochs and at
the last epoch, it runs the backbone on a fixed probe batch (the first ``num_images`` images of the first validation
batch, taken once: the validation order is fixed, so they are the same images every time and on every resume) and on
the pseudo-input, and records per layer and head the numbers of :func:`impulsevit.init.locality.locality`: mean
attention distance, entropy, the prefix (CLS) share, the mass on the reference offset and the best one-tap offset with
its shift from the reference. The reference is the head's initial impulse offset from the ``Initializer``'s report; a
method without offsets (torch, mimetic, …) takes the best one-tap offset of the first probe instead, kept in the
checkpoint so a resumed run measures against the same one.

For a ViT (the ``vit`` family with a LayerNorm pre-norm) every record also holds ``logit_terms``: per layer the split
of the attention logits on the probe batch into position and content terms, with the mass on the reference offset on
the images, with the position–position term alone and on a zero image (:mod:`impulsevit.init.logit_terms`; one more
forward of the probe batch and three of one zero image) — at the ``init`` point it says why the structure on real images
is weaker than on the pseudo-input, layer by layer.

Written from global rank 0: TensorBoard scalars ``attention_evolution/<source>/<metric>/layer_<i>`` (means over
heads) and ``attention_evolution/logit_terms/<field>/layer_<i>``, one image grid per layer and logging point
(``attention_evolution/images/layer_<i>``), and the raw per-head numbers as one JSON file per logging point,
``<run dir>/attention/step_<step>.json`` (the run directory of
:func:`impulsevit.training.trackers.run_directory`, whatever loggers are added; atomic; a resumed run rewrites a point
it reaches again with the same numbers, and removes a record of the same point that an earlier life of the run left
at another step, so a run directory holds exactly one record per point). Every logger gets the scalars; the image
grids go to TensorBoard and to the loggers with a ``log_image`` (W&B). Every rank computes (FSDP2 gathers its shards
collectively); the work happens at validation epoch ends, never inside a training step.

Families: whatever ``impulsevit.init.attention_maps`` handles with images (ViT / DeiT: real attention; Swin: one
window as the grid) and without (Mixer: the token-mixing kernel as an attention matrix, images ignored). For a model it
cannot handle, or one whose maps are not on a grid, it says so once in the log and records nothing else.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from impulsevit.callbacks.attention_logging import attention_grid, default_queries, full_parameters
from impulsevit.io import atomic_write_json, read_json
from impulsevit.training.trackers import log_image, run_directory

__all__ = ["AttentionEvolution", "layer_means", "probe_maps", "same_point_records"]

METRICS = ("distance", "entropy", "prefix_share", "offset_mass", "best_mass", "offset_shift")


def layer_means(heads: list[list[Any]]) -> dict[str, list[float]]:
    """Per metric, the per-layer mean over heads of :class:`~impulsevit.init.locality.HeadLocality` rows (``nan``
    where every head is ``nan``)."""
    out: dict[str, list[float]] = {}
    for metric in METRICS:
        col = []
        for layer in heads:
            vals = [getattr(h, metric) for h in layer if not math.isnan(getattr(h, metric))]
            col.append(sum(vals) / len(vals) if vals else math.nan)
        out[metric] = col
    return out


def same_point_records(folder: Path, point: str, keep: Path) -> list[Path]:
    """The ``step_*.json`` records in ``folder`` other than ``keep`` whose ``point`` is ``point`` (``"init"``,
    ``"epoch_<N>"``): what an earlier life of a resumed run wrote for that point at another step. Unreadable files
    are left alone (not listed)."""
    out = []
    for f in sorted(folder.glob("step_*.json")):
        if f.name == keep.name:
            continue
        try:
            record = read_json(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("point") == point:
            out.append(f)
    return out


def probe_maps(model: torch.nn.Module, images: torch.Tensor | None) -> dict[str, Any]:
    """``{"images": maps, "pseudo_input": maps}`` of ``impulsevit.init.attention_maps`` (``images`` ``(B, 3, S, S)``
    normalised, or ``None`` for the pseudo-input only), without gradients and with FSDP2 parameters unsharded
    (collective: call on every rank).

    Raises:
        ValueError / TypeError / NotImplementedError: the model family has no attention maps, or they carry no grid.
    """
    from impulsevit.init.diagnostics import attention_maps

    out: dict[str, Any] = {}
    for source, batch in (("images", images), ("pseudo_input", None)):
        if source == "images" and batch is None:
            continue
        with torch.no_grad(), full_parameters(model):
            out[source] = attention_maps(model, batch)
        if getattr(out[source], "grid", None) is None:
            raise ValueError("its attention maps carry no token grid")
    return out


class AttentionEvolution(L.Callback):
    """Attention locality on a fixed probe batch and on the pseudo-input over training (see the module docstring).

    Args:
        every_n_epochs: log every this many validation epochs (and at the last epoch, and at init).
        num_images: probe images (from the first validation batch).
        radius: one-tap search radius in patches (:func:`impulsevit.init.locality.locality`).
        max_image_layers: image grids for at most this many layers.
    """

    def __init__(self, every_n_epochs: int = 1, num_images: int = 16, radius: int = 2,
                 max_image_layers: int = 12) -> None:
        if every_n_epochs < 1 or num_images < 1 or radius < 0:
            raise ValueError(f"AttentionEvolution: every_n_epochs ({every_n_epochs}) and num_images ({num_images}) "
                             f"must be >= 1 and radius ({radius}) >= 0")
        self.every_n_epochs, self.num_images, self.radius = every_n_epochs, num_images, radius
        self.max_image_layers = max_image_layers
        self.probe: torch.Tensor | None = None
        self.references: dict[str, list | None] = {}  # source -> per layer, per head offsets
        self.reference_kind: str | None = None
        self._unsupported: str | None = None

    # state: the references (so a resumed run measures the same offsets)
    def state_dict(self) -> dict[str, Any]:
        return {"references": self.references, "reference_kind": self.reference_kind}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.references = dict(state_dict.get("references") or {})
        self.reference_kind = state_dict.get("reference_kind")

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.probe is None and batch_idx == 0 and dataloader_idx == 0:
            images = batch[0] if isinstance(batch, list | tuple) else batch
            self.probe = images[: self.num_images].detach().clone()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            if trainer.global_step != 0 or self.references:  # a resumed run: its init point is already recorded
                return
            point = "init"
        else:
            epoch = trainer.current_epoch + 1
            last = trainer.max_epochs is not None and epoch >= trainer.max_epochs
            if epoch % self.every_n_epochs and not last:
                return
            point = f"epoch_{epoch}"
        self.record(trainer, pl_module, point)

    def _initial_offsets(self, trainer: L.Trainer) -> list | None:
        from impulsevit.callbacks.initializer import Initializer

        init = next((c for c in trainer.callbacks if isinstance(c, Initializer)), None)
        report = getattr(init, "report", None)
        offsets = getattr(report, "offsets", None)
        return [[list(o) for o in layer] for layer in offsets] if offsets else None

    def record(self, trainer: L.Trainer, pl_module: L.LightningModule, point: str) -> dict | None:
        """Measure now and write from rank 0; returns the record (every rank), or ``None`` when unsupported."""
        from impulsevit.init.locality import locality

        if self._unsupported is not None:
            return None
        model = getattr(pl_module, "backbone", pl_module)
        try:
            maps_of = probe_maps(model, self.probe)
        except (ValueError, TypeError, NotImplementedError) as exc:
            self._unsupported = f"{type(model).__name__}: {exc}"
            rank_zero_info(f"AttentionEvolution: attention locality not recorded for {self._unsupported}")
            return None

        def heads_of(maps: Any, refs: list | None) -> list:
            return locality(maps, tuple(maps.grid), int(maps.num_prefix), refs, self.radius)

        if not self.references:
            initial = self._initial_offsets(trainer)
            self.reference_kind = "init_offsets" if initial else "first_probe_best"
            for source, maps in maps_of.items():
                best = [[list(h.best_offset) for h in layer] for layer in heads_of(maps, None)]
                self.references[source] = initial if initial and len(initial) == len(maps) else best
        record: dict[str, Any] = {"point": point, "epoch": trainer.current_epoch, "step": trainer.global_step,
                                  "reference_kind": self.reference_kind, "sources": {}}
        for source, maps in maps_of.items():
            refs = self.references.get(source)
            heads = heads_of(maps, refs if refs is not None and len(refs) == len(maps) else None)
            record["sources"][source] = {"grid": list(maps.grid), "num_prefix": int(maps.num_prefix),
                                         "kind": getattr(maps, "source", source),
                                         "layers": [[h.to_dict() for h in layer] for layer in heads],
                                         "means": layer_means(heads)}
        terms = self._logit_terms(model)
        if terms is not None:
            record["logit_terms"] = terms
        # collective for a plain Trainer (broadcast from rank 0): every rank calls it; without a logger or the CLI there
        # is no run directory, and nothing is written (Lightning's log_dir would be the default root, usually the
        # working directory)
        log_dir = run_directory(trainer)
        if trainer.is_global_zero:
            self._write(trainer, record, maps_of.get("images"), log_dir)
        return record

    def _logit_terms(self, model: torch.nn.Module) -> list[dict[str, float]] | None:
        """Per layer, :func:`impulsevit.init.logit_terms.logit_terms` on the probe batch against the image
        references (``None`` without a probe, or for a model the split does not apply to: Swin, Mixer, RMSNorm).
        Collective under FSDP2 (every rank calls it)."""
        from impulsevit.init.logit_terms import logit_terms

        refs = self.references.get("images")
        if self.probe is None or not refs:
            return None
        try:
            with torch.no_grad(), full_parameters(model):
                return logit_terms(model, self.probe, [[tuple(o) for o in layer] for layer in refs]).to_dict()
        except (ValueError, TypeError, NotImplementedError):
            return None

    def _write(self, trainer: L.Trainer, record: dict, image_maps: Any, log_dir: Path | None) -> None:
        step = record["step"]
        scalars = {}
        for source, data in record["sources"].items():
            for metric, per_layer in data["means"].items():
                for li, v in enumerate(per_layer):
                    if math.isfinite(v):
                        scalars[f"attention_evolution/{source}/{metric}/layer_{li:02d}"] = v
        for row in record.get("logit_terms", []):
            for key, v in row.items():
                if key != "layer" and math.isfinite(v):
                    scalars[f"attention_evolution/logit_terms/{key}/layer_{row['layer']:02d}"] = v
        for lg in trainer.loggers:
            lg.log_metrics(scalars, step=step)
        if trainer.loggers and image_maps is not None:
            maps = image_maps
            h, w = maps.grid
            queries = default_queries(h, w)
            for li, amap in enumerate(list(maps)[: self.max_image_layers]):
                img = attention_grid(amap, (h, w), queries, prefix=int(maps.num_prefix))
                log_image(trainer.loggers, f"attention_evolution/images/layer_{li:02d}", img, step)
        if log_dir is not None:
            path = Path(log_dir) / "attention" / f"step_{step:08d}.json"
            atomic_write_json(path, record)
            for stale in same_point_records(path.parent, record["point"], path):
                stale.unlink(missing_ok=True)
