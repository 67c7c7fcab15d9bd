"""ConvMixer (timm ``ConvMixer``, e.g. ``impulsevit.models`` ``convmixer_cifar_*``): spatial-filter initializers.

Only the depthwise spatial convs (``groups == channels``, kernel ``k × k``, one per block) are written; the stem,
1×1 channel-mixing convs, BatchNorms and head keep whatever they hold. Scaling follows the earlier release
(docs/method.md §4.4):

* ``random``: weight and bias i.i.d. ``U(−1/k, 1/k)`` (the same distribution as PyTorch's constructor default for a
  depthwise conv, redrawn from the generator).
* ``impulse``: per channel one tap set to ``scale`` (default ``√(1/k)``) at a position drawn uniformly *with
  replacement* (``randint(k²)``); all other taps 0. A tap at kernel position ``(i, j)`` makes the output at ``(y, x)``
  read the input at ``(y + dy, x + dx)``, ``(dy, dx) = (i − pad, j − pad)`` (``pad = (k − 1)//2`` for ``"same"``).
* ``box``: per channel ``taps`` positions drawn without replacement set to ``scale`` (default
  ``√(1/(k·taps))``); the default ``taps = k²`` is the full box (every channel identical, all taps equal).

All three set the bias ``U(−1/k, 1/k)``. Option ``trainable``: ``False`` freezes the spatial weight and bias
(``requires_grad=False``, applied here by the initializer), ``True`` makes them trainable, ``None`` (default) leaves
``requires_grad`` as the model was built — so a model built frozen (``spatial_trainable=False`` in
:mod:`impulsevit.models.convmixer`, which survives a resume) stays frozen. Every random number comes from the generator.

Not supported: non-square kernels, dilated depthwise convs, models other than timm's ``ConvMixer``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from impulsevit.init.api import InitResult, read_full, register, write_full_
from impulsevit.init.baselines import base_values, write_values
from impulsevit.init.options import BaseOptions, as_dict
from impulsevit.models.convmixer import depthwise_convs, set_spatial_trainable

__all__ = ["is_convmixer", "spatial_convs", "convmixer_filter_taps", "convmixer_filter_summary"]


def is_convmixer(model: nn.Module) -> bool:
    """True for timm's ``ConvMixer`` (and the ``convmixer_cifar_*`` models, which are instances of it)."""
    from timm.models.convmixer import ConvMixer

    return isinstance(model, ConvMixer)


def spatial_convs(model: nn.Module) -> list[tuple[str, nn.Conv2d, int, int]]:
    """``(name, conv, k, pad)`` for every depthwise spatial conv, validated (square, undilated kernel).

    Raises:
        ValueError: naming the model class and the conv that cannot be handled, or when there is none.
    """
    convs = depthwise_convs(model)
    if not convs:
        raise ValueError(f"{type(model).__name__} has no depthwise spatial conv (groups == channels, kernel > 1)")
    out = []
    for name, conv in convs:
        kh, kw = conv.kernel_size
        if kh != kw or conv.dilation != (1, 1):
            raise ValueError(f"{type(model).__name__}: {name} has kernel {conv.kernel_size}, dilation "
                             f"{conv.dilation}; only square undilated kernels are supported")
        pad = (kh - 1) // 2 if conv.padding == "same" else int(conv.padding[0])
        out.append((name, conv, kh, pad))
    return out


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=generator, dtype=torch.float64) * 2.0 - 1.0) * bound


@dataclasses.dataclass(frozen=True)
class RandomOptions(BaseOptions):
    """Options of ``random`` on ConvMixer: ``trainable`` — ``None`` keeps the filters' ``requires_grad``, ``True`` /
    ``False`` sets it (the paper's frozen-filter ablation) — and ``base`` (:class:`BaseOptions`; timm's ConvMixer
    has no init of its own, so ``"keep"`` is the constructor init as built, ``"torch"`` the same distribution drawn
    from the init generator, paired with the ``torch`` method)."""

    trainable: bool | None = None


@dataclasses.dataclass(frozen=True)
class ImpulseOptions(RandomOptions):
    """Options of ``impulse`` on ConvMixer: ``trainable`` and ``scale``, the one tap's value (default ``√(1/k)``)."""

    scale: float | None = None


@dataclasses.dataclass(frozen=True)
class BoxOptions(ImpulseOptions):
    """Options of ``box`` on ConvMixer: ``trainable``, ``taps`` equal taps per channel (default all ``k²``) and their
    ``scale`` (default ``√(1/(k·taps))``)."""

    taps: int | None = None


def _apply(
    model: nn.Module, generator: torch.Generator, opts: RandomOptions, kind: str
) -> InitResult:
    trainable = opts.trainable
    convs = spatial_convs(model)
    structured = {f"{name}.{p}" for name, conv, _, _ in convs for p in ("weight", "bias")}
    base, notes = base_values(model, generator, opts.base, structured)
    writes, offsets = [], []
    resolved: dict[str, Any] = as_dict(opts)
    for name, conv, k, pad in convs:
        channels = conv.out_channels
        if kind == "random":
            w = _uniform((channels, 1, k, k), 1.0 / k, generator)
        else:
            taps = 1 if not isinstance(opts, BoxOptions) else (k * k if opts.taps is None else int(opts.taps))
            if not 1 <= taps <= k * k:
                raise ValueError(f"box (convmixer): taps must be in [1, {k * k}] for kernel {k}, got {taps}")
            assert isinstance(opts, ImpulseOptions)
            scale = math.sqrt(1.0 / (k * taps)) if opts.scale is None else float(opts.scale)
            if taps == k * k:
                pos = torch.arange(k * k).expand(channels, -1)
            elif taps == 1:
                pos = torch.randint(0, k * k, (channels, 1), generator=generator)
            else:
                pos = torch.argsort(torch.rand(channels, k * k, generator=generator), dim=1)[:, :taps]
            w = torch.zeros(channels, k * k, dtype=torch.float64)
            w.scatter_(1, pos, scale)
            w = w.view(channels, 1, k, k)
            if kind == "impulse":
                flat = pos[:, 0]
                offsets.append([(int(p) // k - pad, int(p) % k - pad) for p in flat])
                counts = torch.bincount(flat, minlength=k * k).view(k, k).tolist()
                notes.append(f"{name}: k={k}, one-hot positions per kernel tap {counts}")
            resolved["scale"] = scale  # every ConvMixer block has the same k
            if kind == "box":
                resolved["taps"] = taps
        if tuple(w.shape) != tuple(conv.weight.shape):
            raise ValueError(f"{type(model).__name__}: {name} weight has shape {tuple(conv.weight.shape)}, "
                             f"expected {tuple(w.shape)}")
        b = _uniform((channels,), 1.0 / k, generator) if conv.bias is not None else None
        writes.append((conv, w, b))
    write_values(model, base)
    for conv, w, b in writes:
        write_full_(conv.weight, w)
        if b is not None:
            write_full_(conv.bias, b)
    if trainable is not None:
        set_spatial_trainable(model, trainable)
    frozen = not any(p.requires_grad for _, conv, _, _ in convs for p in conv.parameters())
    notes.append(f"{len(convs)} depthwise convs, spatial filters {'frozen' if frozen else 'trainable'}")
    return InitResult(options=resolved, offsets=offsets, notes=notes)


@register("random", family="convmixer", matches=is_convmixer, options=RandomOptions)
def random_convmixer(model: nn.Module, generator: torch.Generator, options: RandomOptions) -> InitResult:
    """Spatial filters and biases ``U(−1/k, 1/k)`` (:class:`RandomOptions`)."""
    return _apply(model, generator, options, "random")


@register("impulse", family="convmixer", matches=is_convmixer, options=ImpulseOptions)
def impulse_convmixer(model: nn.Module, generator: torch.Generator, options: ImpulseOptions) -> InitResult:
    """One-hot spatial filters at a random tap per channel (:class:`ImpulseOptions`)."""
    return _apply(model, generator, options, "impulse")


@register("box", family="convmixer", matches=is_convmixer, options=BoxOptions)
def box_convmixer(model: nn.Module, generator: torch.Generator, options: BoxOptions) -> InitResult:
    """Box spatial filters: ``taps`` equal taps per channel (:class:`BoxOptions`)."""
    return _apply(model, generator, options, "box")


# ---------------------------------------------------------------------------------------------------- diagnostics


def convmixer_filter_taps(model: nn.Module) -> list[torch.Tensor]:
    """Per block, the depthwise spatial filters ``(channels, k, k)`` (a float32 copy)."""
    return [read_full(conv.weight).detach().float().cpu()[:, 0].clone() for _, conv, _, _ in spatial_convs(model)]


def convmixer_filter_summary(taps: list[torch.Tensor]) -> list[dict[str, float]]:
    """Per block: ``one_hot`` = share of channels with ≥ 99 % of their ``|w|`` on one tap, ``peak_share`` = mean
    share of ``|w|`` on the largest tap, ``entropy`` (nats) of the normalised ``|w|`` over taps, ``distinct`` = number
    of distinct argmax taps used, ``distance`` = mean distance (in pixels) of the taps' ``|w|`` mass from the centre."""
    out = []
    for filters in taps:
        channels, k, _ = filters.shape
        magnitude = filters.abs().reshape(channels, k * k)
        share = magnitude / magnitude.sum(-1, keepdim=True).clamp_min(1e-12)
        peak = share.max(-1).values
        ys, xs = torch.meshgrid(torch.arange(k), torch.arange(k), indexing="ij")
        dist = ((ys - (k - 1) / 2) ** 2 + (xs - (k - 1) / 2) ** 2).float().sqrt().flatten()
        out.append({
            "one_hot": float((peak >= 0.99).float().mean()),
            "peak_share": float(peak.mean()),
            "entropy": float(-(share * share.clamp_min(1e-12).log()).sum(-1).mean()) + 0.0,
            "distinct": float(share.argmax(-1).unique().numel()),
            "distance": float((share * dist).sum(-1).mean()),
        })
    return out
