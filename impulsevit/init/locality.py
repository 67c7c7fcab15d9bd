"""How local and how convolution-like attention is, per layer and head: the numbers that say whether the structure an
initialization imposed survives training.

Pure functions on attention maps (``impulsevit.init.attention_maps``: per layer ``(h, T, T)``, rows = queries summing
to 1 over keys, ``num_prefix`` class/register tokens first, then the ``H x W`` patch grid in row-major order):

- :func:`offset_masses`: for every one-tap offset ``(dy, dx)`` with ``|dy|, |dx| <= radius``, the mean attention a
  patch query puts on the patch at that offset, over the interior queries for which every such offset stays on the
  grid. Shape ``(h, (2r+1)^2)``, offsets in :func:`offsets_within` order.
- :func:`locality`: one :class:`HeadLocality` per head: mean attention distance (in patches, the ViT paper's measure on
  the patch grid), entropy, the share of attention on prefix tokens, the mass on a reference offset (the head's initial
  impulse offset, or any offset the caller names), the best-matching one-tap offset now and its mass, and how far
  (Euclidean, in patches) the best offset has moved from the reference.

Not supported: maps whose tokens do not form a grid (Mixer's token kernel does; pooled / hierarchical token sets
other than one Swin window do not).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

__all__ = ["HeadLocality", "locality", "offset_masses", "offsets_within"]


def offsets_within(radius: int) -> list[tuple[int, int]]:
    """All ``(dy, dx)`` with ``|dy|, |dx| <= radius``, row-major from ``(-radius, -radius)``."""
    return [(dy, dx) for dy in range(-radius, radius + 1) for dx in range(-radius, radius + 1)]


def _fit_radius(grid: tuple[int, int], radius: int) -> int:
    """The largest radius ``<= radius`` that leaves at least one interior query on the grid."""
    return max(0, min(radius, (grid[0] - 1) // 2, (grid[1] - 1) // 2))


def offset_masses(maps: torch.Tensor, grid: tuple[int, int], num_prefix: int = 0, radius: int = 2) -> torch.Tensor:
    """Mean attention on each one-tap offset, per head.

    Args:
        maps: ``(h, T, T)`` attention of one layer, ``T = num_prefix + H*W``.
        grid: ``(H, W)``.
        radius: offsets with ``|dy|, |dx| <= radius`` (reduced to fit the grid: see the module docstring).

    Returns:
        ``(h, K)`` float32 in :func:`offsets_within` order, ``K = (2r+1)^2`` for the radius ``r`` actually used
        (``radius`` reduced to fit the grid).
    """
    H, W = grid
    r = _fit_radius(grid, radius)
    rows = torch.arange(r, H - r)
    cols = torch.arange(r, W - r)
    qr, qc = torch.meshgrid(rows, cols, indexing="ij")
    queries = (qr * W + qc).reshape(-1)  # interior patch queries, (Q,)
    offs = torch.tensor(offsets_within(r))  # (K, 2)
    keys = (qr.reshape(-1, 1) + offs[:, 0]) * W + (qc.reshape(-1, 1) + offs[:, 1])  # (Q, K)
    patch = maps.float()[:, num_prefix:, num_prefix:]  # (h, N, N)
    picked = patch[:, queries.unsqueeze(1), keys]  # (h, Q, K)
    return picked.mean(1)


@dataclasses.dataclass
class HeadLocality:
    """One head's locality numbers (means over patch queries unless said otherwise).

    Attributes:
        distance: mean attention distance in patches, ``sum_k p(k) * |pos_q - pos_k|`` over patch keys.
        entropy: mean row entropy in nats over all keys (uniform over ``T`` keys = ``ln T``).
        prefix_share: mean attention on the prefix (class / register) tokens; 0 without prefix tokens.
        reference: the offset ``offset_mass`` and ``offset_shift`` refer to, or ``None``.
        offset_mass: mean attention on ``reference`` over the interior queries of :func:`offset_masses` (``nan``
            without a reference or when it lies outside the radius).
        best_offset: the one-tap offset with the largest mean mass (within the radius).
        best_mass: that mass.
        offset_shift: Euclidean distance in patches from ``reference`` to ``best_offset`` (``nan`` without one).
    """

    layer: int
    head: int
    distance: float
    entropy: float
    prefix_share: float
    reference: tuple[int, int] | None
    offset_mass: float
    best_offset: tuple[int, int]
    best_mass: float
    offset_shift: float

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["reference"] = list(self.reference) if self.reference is not None else None
        d["best_offset"] = list(self.best_offset)
        return d


def locality(
    maps: Sequence[torch.Tensor],
    grid: tuple[int, int],
    num_prefix: int = 0,
    references: Sequence[Sequence[Sequence[int]] | None] | None = None,
    radius: int = 2,
) -> list[list[HeadLocality]]:
    """Per layer, per head :class:`HeadLocality` of attention maps.

    Args:
        maps: per layer ``(h, T, T)`` (e.g. ``impulsevit.init.attention_maps(model, images)``).
        grid: the patch grid ``(H, W)``; ``T = num_prefix + H*W``.
        references: per layer, per head ``(dy, dx)`` (an ``InitReport.offsets`` table), a layer may be ``None``;
            ``None`` → no reference. The radius grows to cover every reference offset.
        radius: the one-tap search radius in patches (reduced to fit the grid).

    Raises:
        ValueError: a layer's token count is not ``num_prefix + H*W``, or ``references`` has the wrong length.
    """
    H, W = grid
    n = H * W
    if references is not None and len(references) != len(maps):
        raise ValueError(f"references has {len(references)} layers, maps has {len(maps)}")
    needed = max((max(abs(int(o[0])), abs(int(o[1]))) for layer in (references or []) if layer for o in layer),
                 default=0)
    r = _fit_radius(grid, max(radius, needed))
    table = offsets_within(r)
    pos = torch.stack(torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij"), -1).reshape(n, 2).float()
    dist = torch.cdist(pos, pos)  # (N, N) patch distance
    out: list[list[HeadLocality]] = []
    for li, layer_maps in enumerate(maps):
        a = layer_maps.float()
        if a.shape[-1] != num_prefix + n:
            raise ValueError(f"layer {li}: maps have {a.shape[-1]} tokens, expected {num_prefix} prefix + {H}x{W}")
        rows = a[:, num_prefix:]  # patch queries over all keys, (h, N, T)
        entropy = -(rows * rows.clamp_min(1e-30).log()).sum(-1).mean(-1)
        distance = (rows[:, :, num_prefix:] * dist).sum(-1).mean(-1)
        prefix_share = rows[:, :, :num_prefix].sum(-1).mean(-1)
        masses = offset_masses(a, grid, num_prefix, r)  # (h, K)
        best = masses.argmax(-1)
        refs = references[li] if references is not None else None
        heads = []
        for h in range(a.shape[0]):
            ref = tuple(int(v) for v in refs[h]) if refs is not None else None
            best_off = table[int(best[h])]
            mass = shift = math.nan
            if ref is not None:
                if ref in table:
                    mass = float(masses[h, table.index(ref)])
                shift = math.dist(ref, best_off)
            heads.append(HeadLocality(li, h, float(distance[h]), float(entropy[h]), float(prefix_share[h]), ref,
                                      mass, best_off, float(masses[h, best[h]]), shift))
        out.append(heads)
    return out
