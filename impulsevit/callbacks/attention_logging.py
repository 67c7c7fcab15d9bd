"""Attention-map diagnostics: render per-head attention as an image grid and log it (plus per-head numbers) to
TensorBoard.

Pure functions first (:func:`grid_shape`, :func:`default_queries`, :func:`attention_grid`, :func:`summary_scalars`),
then :func:`log_attention` (used by the ``Initializer`` at step 0) and the :class:`AttentionMapLogger` callback
(the same, every ``every_n_epochs`` validation epochs).

The maps come from ``impulsevit.init.diagnostics.attention_maps(model)``: per layer a ``(heads, n, n)`` tensor of
softmax attention on the pseudo-input (query rows, key columns); ``n`` tokens on an ``H x W`` grid (ViT: the patch
grid), with ``summarize`` giving target mass / hit rate / entropy / distance per head. Not supported: models
``attention_maps`` does not handle (ConvNeXt, ResNet, ...) — nothing is logged for them.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch import nn
from torchvision.utils import make_grid

from impulsevit.training.trackers import log_image, log_text

__all__ = [
    "grid_shape",
    "default_queries",
    "attention_grid",
    "summary_scalars",
    "full_parameters",
    "compute_attention",
    "log_attention",
    "AttentionMapLogger",
]


def grid_shape(n: int, model: nn.Module | None = None) -> tuple[int, int, int] | None:
    """``(prefix, H, W)``: how ``n`` tokens split into leading prefix tokens and an ``H x W`` grid, or ``None``.

    Uses the model's ``patch_embed.grid_size`` when it accounts for the tokens (with 0–8 prefix tokens), otherwise a
    square grid.
    """
    pe = getattr(model, "patch_embed", None) if model is not None else None
    gs = getattr(pe, "grid_size", None)
    if gs is not None:
        h, w = int(gs[0]), int(gs[1])
        if 0 <= n - h * w <= 8:
            return n - h * w, h, w
    side = math.isqrt(n)
    if side * side == n:
        return 0, side, side
    return None


def default_queries(h: int, w: int, count: int = 4) -> list[tuple[int, int]]:
    """Up to ``count`` distinct interior query cells ``(row, col)``: centre, then near the four corners."""
    cands = [(h // 2, w // 2), (min(1, h - 1), min(1, w - 1)), (min(1, h - 1), max(w - 2, 0)),
             (max(h - 2, 0), min(1, w - 1)), (max(h - 2, 0), max(w - 2, 0))]
    out: list[tuple[int, int]] = []
    for c in cands:
        if c not in out:
            out.append(c)
    return out[:count]


def attention_grid(
    maps: torch.Tensor, hw: tuple[int, int], queries: list[tuple[int, int]], prefix: int = 0, cell: int = 48
) -> torch.Tensor:
    """An RGB image of one layer's attention: one row per query, one column per head.

    Args:
        maps: ``(heads, n, n)`` attention (rows = queries, columns = keys; rows sum to 1), ``n = prefix + H*W``.
        hw: the token grid ``(H, W)``.
        queries: query cells ``(row, col)`` on that grid.
        prefix: leading non-grid tokens (class / register tokens), dropped.
        cell: approximate size of one head's panel in pixels (nearest-neighbour upscaling by an integer factor).

    Returns:
        ``(3, rows * (H*s + 1) + 1, heads * (W*s + 1) + 1)`` float in ``[0, 1]``: attention in grey, each panel scaled
        by its own maximum, the query cell outlined in red, 1-px white separators (laid out by
        ``torchvision.utils.make_grid``).
    """
    heads, (h, w), nq = maps.shape[0], hw, len(queries)
    s = max(1, cell // max(h, w))
    a = maps.detach().float().cpu()[:, prefix:, prefix:]
    rows = a[:, [r * w + c for r, c in queries]].transpose(0, 1).reshape(nq, heads, h, w)  # (query, head, H, W)
    rows = rows / rows.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    panels = rows.repeat_interleave(s, -2).repeat_interleave(s, -1).unsqueeze(2).repeat(1, 1, 3, 1, 1)
    for qi, (r, c) in enumerate(queries):  # outline the query cell in red, in every head's panel of its row
        box = panels[qi, :, :, r * s : (r + 1) * s, c * s : (c + 1) * s]
        box[:, 0] = 1.0
        if s > 2:
            box[:, 1:, 1:-1, 1:-1] *= 0.5
        for edge in (box[:, 1:, 0, :], box[:, 1:, -1, :], box[:, 1:, :, 0], box[:, 1:, :, -1]):
            edge.zero_()
    return make_grid(panels.flatten(0, 1), nrow=heads, padding=1, pad_value=1.0)


def summary_scalars(summary: list[Any], tag: str) -> dict[str, float]:
    """Finite per-head statistics as scalars ``{tag}/{stat}/layer_{i:02d}/head_{j:02d}``.

    ``summary`` items are ``impulsevit.init.diagnostics.HeadSummary``-like objects (``layer``, ``head`` and float
    fields such as ``target_mass``, ``hit_rate``, ``entropy``, ``distance``).
    """
    out: dict[str, float] = {}
    for s in summary:
        for k, v in vars(s).items():
            if k in ("layer", "head") or not isinstance(v, int | float) or not math.isfinite(float(v)):
                continue
            out[f"{tag}/{k}/layer_{s.layer:02d}/head_{s.head:02d}"] = float(v)
    return out


@contextlib.contextmanager
def full_parameters(model: nn.Module) -> Iterator[None]:
    """Inside the block every FSDP2 unit of ``model`` holds its full (unsharded) parameters; no-op otherwise.

    Collective under FSDP2: every rank must enter it.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        yield
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for u in units:
        u.unshard()
    try:
        yield
    finally:
        for u in units:
            u.reshard()


def compute_attention(
    model: nn.Module, offsets: list[list[tuple[int, int]]] | None = None
) -> tuple[list[torch.Tensor], list[Any], tuple[int, int, int] | None] | None:
    """``(maps, summary, (prefix, H, W))`` on the pseudo-input from ``impulsevit.init``, or ``None`` when the model
    family has no attention-map diagnostics.

    Under FSDP2 the parameters are unsharded for the computation: call it on every rank.
    """
    from impulsevit.init.diagnostics import attention_maps, summarize

    try:
        with torch.no_grad(), full_parameters(model):
            maps = attention_maps(model)
            grid = getattr(maps, "grid", None)
            shape = (int(getattr(maps, "num_prefix", 0)), *grid) if grid is not None else None
            if shape is None and maps:
                shape = grid_shape(maps[0].shape[-1], model)
            summary = summarize(maps, offsets or None, grid=shape[1:], num_prefix=shape[0]) if shape else []
            maps = [m.detach().float().cpu() for m in maps]
    except (ValueError, TypeError, NotImplementedError):
        return None
    return maps, summary, shape


def log_attention(
    trainer: L.Trainer,
    model: nn.Module,
    tag: str,
    step: int,
    offsets: list[list[tuple[int, int]]] | None = None,
    max_layers: int = 12,
) -> bool:
    """Compute attention maps + per-head summary and write them to the trainer's loggers.

    TensorBoard (and W&B) get images ``{tag}/layer_{i:02d}`` (query rows x head columns, see :func:`attention_grid`)
    and the text ``{tag}/summary`` (the summary table; MLflow too, :func:`impulsevit.training.trackers.log_text`);
    every logger gets the scalars of :func:`summary_scalars`. Call on every
    rank; only global rank 0 writes. Returns whether the model had attention maps.
    """
    result = compute_attention(model, offsets)
    if result is None or trainer.global_rank != 0:
        return result is not None
    maps, summary, shape = result
    if shape is not None:
        prefix, h, w = shape
        queries = default_queries(h, w)
        for li, amap in enumerate(maps[:max_layers]):
            img = attention_grid(amap, (h, w), queries, prefix=prefix)
            log_image(trainer.loggers, f"{tag}/layer_{li:02d}", img, step)
    table = summary.table() if hasattr(summary, "table") else "\n".join(map(str, summary))
    queries_txt = ", ".join(f"({r},{c})" for r, c in (default_queries(*shape[1:]) if shape else []))
    log_text(trainer.loggers, f"{tag}/summary",
             f"query cells (row, col), one image row each: {queries_txt}\n\n```\n{table}\n```", step)
    metrics = summary_scalars(summary, tag)
    if metrics:
        for lg in trainer.loggers:
            lg.log_metrics(metrics, step=step)
    return True


class AttentionMapLogger(L.Callback):
    """Log attention maps and per-head statistics of ``pl_module.backbone`` every ``every_n_epochs`` epochs.

    Runs at ``on_validation_epoch_end`` (not during the sanity check), on every rank (FSDP2 gathers shards), writes
    from global rank 0 under the tag ``attention``. The step-0 maps are logged by the ``Initializer`` (tag
    ``init/attention``). Not supported: models without ``attention_maps`` support (silently skipped).
    """

    def __init__(self, every_n_epochs: int = 10) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        self.every_n_epochs = every_n_epochs

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        model = getattr(pl_module, "backbone", pl_module)
        log_attention(trainer, model, "attention", trainer.global_step)
