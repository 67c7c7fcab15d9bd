"""Random streams of the initializers: everything is derived from the caller's ``torch.Generator``.

A ``torch.Generator`` on CPU is a Mersenne Twister that draws one number at a time; filling tens of millions of
values from it is the slowest part of initialising a large model. Bulk draws therefore take one 62-bit seed from the
generator and run numpy's ``SFC64`` stream from it (a few times faster per value, and it releases the GIL, so
independent tensors fill in parallel threads). The result is a pure function of the generator's state: the same seed
gives bit-identical values in every process, on every rank, for any thread count. The global torch / numpy RNGs are
never touched.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import torch

__all__ = ["seed_from", "numpy_stream", "RandomFill", "truncated_normal"]


def seed_from(generator: torch.Generator) -> int:
    """One seed in ``[0, 2⁶²)`` drawn from ``generator`` (advances it by one draw)."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


def numpy_stream(generator: torch.Generator) -> np.random.Generator:
    """A numpy ``SFC64`` generator seeded from ``generator`` (one draw)."""
    return np.random.Generator(np.random.SFC64(seed_from(generator)))


def truncated_normal(
    shape: tuple[int, ...], generator: torch.Generator, std: float = 1.0, clip: float = 2.0
) -> torch.Tensor:
    """i.i.d. ``N(0, std²)`` conditioned on ``|x| ≤ clip`` (absolute bound), float32 ``shape``.

    Exact rejection sampling from one :func:`numpy_stream`: draw normals, redraw the ones outside the bound until none
    is left (at the defaults of the impulse target, ``clip / std = 3.3``, about 0.1 % are redrawn once).
    """
    rng = numpy_stream(generator)
    out = rng.standard_normal(int(np.prod(shape)), dtype=np.float32)
    out *= np.float32(std)
    bad = np.flatnonzero(np.abs(out) > clip)
    while bad.size:
        redo = rng.standard_normal(bad.size, dtype=np.float32) * np.float32(std)
        out[bad] = redo
        bad = bad[np.abs(redo) > clip]
    return torch.from_numpy(out).reshape(shape)


@dataclasses.dataclass(frozen=True)
class RandomFill:
    """A deferred i.i.d. float32 tensor: ``U(−scale, scale)`` (``dist='uniform'``) or ``N(0, scale²)`` (``'normal'``),
    drawn from numpy's ``SFC64`` stream seeded with ``seed`` — the same values in every process and on every rank.

    Attributes:
        shape: the tensor shape.
        dist: ``'uniform'`` or ``'normal'``.
        scale: the uniform bound or the normal standard deviation.
        seed: the stream's seed (from :func:`seed_from`).
    """

    shape: tuple[int, ...]
    dist: Literal["uniform", "normal"]
    scale: float
    seed: int

    def fill_(self, out: torch.Tensor) -> torch.Tensor:
        """Write the values into ``out`` (contiguous float32 CPU tensor of ``shape``) in place and return it."""
        if tuple(out.shape) != self.shape or out.dtype != torch.float32 or not out.is_contiguous():
            raise ValueError(f"RandomFill of {self.shape} needs a contiguous float32 tensor, got {tuple(out.shape)}")
        out = out.detach()
        flat = out.numpy().reshape(-1)  # shares memory with ``out``
        rng = np.random.Generator(np.random.SFC64(self.seed))
        if self.dist == "uniform":
            rng.random(out=flat, dtype=np.float32)  # [0, 1)
            out.mul_(2.0 * self.scale).sub_(self.scale)
        else:
            rng.standard_normal(out=flat, dtype=np.float32)
            out.mul_(self.scale)
        return out

    def materialize(self) -> torch.Tensor:
        """The values as a new float32 tensor."""
        return self.fill_(torch.empty(self.shape))
