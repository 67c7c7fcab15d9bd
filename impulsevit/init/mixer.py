"""MLP-Mixer (timm ``MlpMixer`` with ``MixerBlock``): impulse (convolutional) token-mixing init and its diagnostics.

The token-mixing MLP of a block maps each channel's token vector ``x ∈ R^N`` (``N = H·W`` patches, row-major) through
``fc2 · GELU · fc1`` with ``fc1 ∈ R^{S×N}``, ``fc2 ∈ R^{N×S}``; it is shared by all channels. There is no softmax and no
pseudo-input, so the structure is written directly into the weights (docs/method.md §4.3; the paper's exact
mechanics are unknown — this is our reading, flagged unverified).

``layout="blocks"`` (default, docs/method.md §4.3 reading (a)): the hidden units are split into ``K = S // N`` blocks of
``N``; block ``b`` gets offset ``o_b = impulse_offsets(K)[b]`` (docs/method.md §2.1, cyclic beyond 9) and ``fc1`` row
``b·N + t`` is ``gain_in · e_{t+o_b}`` (hidden unit = the neighbour of token ``t``; zero row when the neighbour is off
the grid — zero padding, no wrap). ``fc2[t, b·N + t] = gain_out`` routes every block back to its token, so

    y_t = gain_out · Σ_b GELU(gain_in · x_{t+o_b})   ≈   0.5 · gain_in · gain_out · Σ_b x_{t+o_b}   (small x)

i.e. the composite token-mixing map is a sum of impulse responses at the chosen offsets. ``gain_out`` defaults to
``1/√K``. The ``S − K·N`` remainder hidden units keep their ``fc1`` rows and get zero ``fc2`` columns: they contribute
nothing at init but still receive gradients. Both biases are zeroed (timm's own init puts them at ≈ 1e-6).

``layout="fc1_only"`` (reading (b)): write the ``fc1`` shift blocks only, leave ``fc2`` and the biases as they are.

``layout="factored"`` (ours, for ``N ≤ S < 2N`` where "blocks" degenerates to the identity — e.g. Mixer-S/16 at 224
has ``S = 256``, ``N = 196``): ``fc1`` passes the tokens through on the first ``N`` hidden units and ``fc2`` is the
full ``num_offsets``-tap convolution ``gain_out · Σ_o S_o`` (default all 9 offsets of the 3×3 kernel); the linear part
is the same sum of impulse responses.

Not supported: ResMLP / gMLP / GLU token MLPs (``ResBlock``, ``SpatialGatingBlock``, ``GluMlp``), ``S < N`` (blocks,
factored), models with a class token. Errors name the model class and block.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch
from torch import nn

from impulsevit.init.api import InitResult, read_full, register
from impulsevit.init.baselines import as_tensor, base_values, write_values
from impulsevit.init.capture import module_calls
from impulsevit.init.diagnostics import AttentionMaps, register_attention_maps
from impulsevit.init.impulse import impulse_indicator, impulse_offsets
from impulsevit.init.options import BaseOptions, OffsetOptions, as_dict, check_range

__all__ = ["is_mixer", "mixer_token_mlps", "mixer_token_kernel", "mixer_token_jacobians", "mixer_kernel_summary"]


def is_mixer(model: nn.Module) -> bool:
    """True for timm's ``MlpMixer`` (ResMLP and gMLP are ``MlpMixer`` too; they fail validation with a clear error)."""
    from timm.models.mlp_mixer import MlpMixer

    return isinstance(model, MlpMixer)


def _grid(model: nn.Module) -> tuple[int, int]:
    stem = getattr(model, "stem", None)
    grid = getattr(stem, "grid_size", None)
    if grid is None:
        raise ValueError(f"{type(model).__name__} has no stem.grid_size; cannot place tokens on a grid")
    return int(grid[0]), int(grid[1])


def mixer_token_mlps(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, mlp_tokens)`` for every block, validated: a timm ``Mlp`` with ``fc1 (S, N)``, ``fc2 (N, S)``, GELU.

    Raises:
        ValueError: naming the model class and the block whose token mixer is not a plain two-layer MLP over N tokens.
    """
    from timm.layers import Mlp

    gh, gw = _grid(model)
    n = gh * gw
    out = []
    for i, blk in enumerate(getattr(model, "blocks", [])):
        mlp = getattr(blk, "mlp_tokens", None)
        if type(mlp) is not Mlp:
            raise ValueError(
                f"{type(model).__name__}: block {i} ({type(blk).__name__}) has no plain timm Mlp 'mlp_tokens' "
                f"(found {type(mlp).__name__}); impulse supports MixerBlock token MLPs only (not ResMLP/gMLP/GLU)"
            )
        fc1, fc2 = mlp.fc1, mlp.fc2
        if not (isinstance(fc1, nn.Linear) and isinstance(fc2, nn.Linear)):
            raise ValueError(f"{type(model).__name__}: block {i} token MLP fc1/fc2 are not nn.Linear")
        if fc1.in_features != n or fc2.out_features != n or fc2.in_features != fc1.out_features:
            raise ValueError(
                f"{type(model).__name__}: block {i} token MLP maps {fc1.in_features}->{fc1.out_features}->"
                f"{fc2.out_features}, expected {n} tokens ({gh}x{gw} grid) in and out"
            )
        if not isinstance(mlp.act, nn.GELU) or not isinstance(mlp.norm, nn.Identity):
            raise ValueError(f"{type(model).__name__}: block {i} token MLP must be Linear-GELU-Linear "
                             f"(found act={type(mlp.act).__name__}, norm={type(mlp.norm).__name__})")
        out.append((f"blocks.{i}.mlp_tokens", mlp))
    if not out:
        raise ValueError(f"{type(model).__name__} has no blocks with a token-mixing MLP")
    return out


@dataclasses.dataclass(frozen=True)
class MixerImpulseOptions(BaseOptions, OffsetOptions):
    """``impulse`` on MLP-Mixer (see :func:`impulse_mixer`)."""

    layout: Literal["blocks", "fc1_only", "factored", "one_tap"] = "blocks"
    num_offsets: int | None = None
    gain_in: float = 1.0
    gain_out: float | None = None
    combine: Literal["replace", "add"] = "replace"
    tap: Literal["shift", "permutation"] = "shift"

    def __post_init__(self) -> None:
        check_range("num_offsets", self.num_offsets, 1)
        if self.layout not in ("one_tap", "factored") and self.combine != "replace":
            raise ValueError(f"option 'combine' needs layout='one_tap' or 'factored' (layout is {self.layout!r})")
        if self.layout != "one_tap" and self.tap != "shift":
            raise ValueError(f"option 'tap' needs layout='one_tap' (layout is {self.layout!r})")


def one_tap_weights(
    grid: tuple[int, int], hidden: int, offset: tuple[int, int], generator: torch.Generator, *,
    gain_in: float = 1.0, gain_out: float = 1.0, rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fc1 (S, N)`` and ``fc2 (N, S)`` of a token MLP whose composite, at init, is ONE tap: ``y_t ≈ g·x_{t+o}``.

    Hidden unit ``j`` serves output token ``t = j mod N`` (every unit used, each token by ``n_t = ⌈(S−t)/N⌉`` units)
    through one path: ``fc1[j] = gain_in·σ_j·a_j·e_{t+o}`` (a zero row when ``t+o`` is off the grid: zero padding) and
    ``fc2[t, j] = 2·gain_out·σ_j / (n_t·a_j)``, with signs ``σ_j`` alternating over a token's units (+, −, +, …) and
    magnitudes ``a_j ~ U(0.5, 1.5)`` from ``generator``. Each path's linear part is ``gain_in·gain_out·x_{t+o}/n_t``
    (``GELU′(0) = ½``), so the token MLP's linear part is exactly ``g·S_o`` with ``g = gain_in·gain_out``; a ``+``/``−``
    pair of equal magnitude is exactly linear (``GELU(z) − GELU(−z) = z``), and the random magnitudes and signs make
    every unit different (no two units get the same gradient). Contrast the ``"blocks"`` / ``"factored"`` layouts,
    whose composite is the same sum of shifts (a box blur) in every block.

    Args:
        grid: ``(H, W)`` token grid, ``N = H·W``.
        hidden: ``S`` (any ``S ≥ 1``; tokens ``t ≥ S`` get no unit when ``S < N``).
        offset: ``(dy, dx)``: output token ``t`` reads input token ``t + dy·W + dx``.
        rows: ``(N, N)`` 0/1 matrix whose row ``t`` picks the input token output ``t`` reads, in place of the shift by
            ``offset`` (a random permutation: the no-locality control of ``tap='permutation'``).

    Returns:
        ``(fc1, fc2)`` float64.
    """
    n = grid[0] * grid[1]
    shift = impulse_indicator(grid[0], grid[1], offset) if rows is None else rows  # (N, N): row t = e_{t+o} or 0
    token = torch.arange(hidden) % n
    copy = torch.arange(hidden) // n
    count = torch.tensor([(hidden - t + n - 1) // n for t in range(n)], dtype=torch.float64)
    sign = torch.where(copy % 2 == 0, 1.0, -1.0).double()
    magnitude = 0.5 + torch.rand(hidden, generator=generator, dtype=torch.float64)
    fc1 = (gain_in * sign * magnitude)[:, None] * shift[token]
    fc2 = torch.zeros(n, hidden, dtype=torch.float64)
    fc2[token, torch.arange(hidden)] = 2.0 * gain_out * sign / (count[token] * magnitude)
    return fc1, fc2


@register("impulse", family="mixer", matches=is_mixer, options=MixerImpulseOptions)
def impulse_mixer(model: nn.Module, generator: torch.Generator, options: MixerImpulseOptions) -> InitResult:
    """Convolutional (impulse) token-mixing MLPs in every Mixer block, on the ``base`` init.

    Order of random draws (from ``generator``): the ``base`` (``'torch'``: every tensor, as the ``torch`` method), the
    offsets (``offsets='random'``), then per block the permutation (``tap='permutation'``) and the ``one_tap`` path
    magnitudes.

    Options:
        layout: ``"blocks"`` (default), ``"fc1_only"``, ``"factored"`` (sums of shifts: a blur) or ``"one_tap"`` (one
            offset per block, cycling over depth: :func:`one_tap_weights`) — see the module docstring.
        num_offsets: offsets used, taken from the §2.1 list (cyclic beyond 9). Default: ``S // N`` for
            blocks/fc1_only (all blocks), 9 for factored, the depth for one_tap (block ``b`` gets offset ``b``).
            Must be ≤ ``S // N`` for blocks/fc1_only.
        gain_in: value of the one-hot ``fc1`` entries (default 1.0).
        gain_out: value of the ``fc2`` routing / kernel taps (default ``1/√num_offsets``; one_tap: 1.0, the tap of
            the composite's linear part is ``gain_in·gain_out``).
        combine: ``"replace"`` (default: the token MLP is the structure alone, biases zero) or ``"add"`` (one_tap and
            factored: the layout's weights are added to the ``base``'s token MLP and its biases stay, so the composite
            is the base's random response plus the tap or kernel, with cross terms between the two).
        tap: ``"shift"`` (default) or ``"permutation"`` (one_tap only, a control, not a method: each block's output
            token reads one input token of a random permutation instead of its neighbour — the same sparsity, signs,
            magnitudes and gain with no spatial structure).
        kernel_size: 3 (default, §2.1 order) or 5 (``impulse.kernel_offsets(5)``); factored then defaults to k².
        offsets: ``"fixed"`` (default, deterministic) or ``"random"`` (drawn with replacement from the generator).
        base: ``"torch"`` (default) or ``"keep"`` (:class:`~impulsevit.init.options.BaseOptions`).
    """
    opts = options
    grid = _grid(model)
    n = grid[0] * grid[1]
    mlps = mixer_token_mlps(model)
    s = mlps[0][1].fc1.out_features
    if any(m.fc1.out_features != s for _, m in mlps):
        raise ValueError(f"{type(model).__name__}: token MLP hidden sizes differ between blocks")
    layout = opts.layout
    if s < n and layout != "one_tap":
        raise ValueError(f"{type(model).__name__}: token-mixing hidden size S={s} < N={n} tokens; impulse needs S >= N "
                         "(raise mlp_ratio[0])")
    kernel_size = int(opts.kernel_size)
    num_offsets = opts.num_offsets  # K
    if num_offsets is None:
        num_offsets = {"factored": kernel_size * kernel_size, "one_tap": len(mlps)}.get(layout, s // n)
    num_offsets = int(num_offsets)
    if num_offsets < 1 or (layout in ("blocks", "fc1_only") and num_offsets > s // n):
        raise ValueError(
            f"impulse (mixer): num_offsets={num_offsets} must be in [1, S//N={s // n}] for layout {layout!r}"
        )
    gain_in = float(opts.gain_in)
    default_out = 1.0 if layout == "one_tap" else 1.0 / math.sqrt(num_offsets)
    gain_out = default_out if opts.gain_out is None else float(opts.gain_out)
    add = opts.combine == "add"
    structured = set() if layout == "fc1_only" or add else {f"{name}.{p}" for name, _ in mlps
                                                             for p in ("fc1.weight", "fc2.weight")}
    values, notes = base_values(model, generator, opts.base, structured)
    offsets = impulse_offsets(num_offsets, kernel_size, opts.offsets, generator=generator)
    shifts = [impulse_indicator(grid[0], grid[1], o) for o in offsets]  # (M x)_t = x_{t+o}, zero padding
    eye = torch.eye(n, dtype=torch.float64)

    block_offsets = []
    for index, (name, mlp) in enumerate(mlps):
        def current(param: str, module: nn.Module = mlp, prefix: str = name) -> torch.Tensor:
            key = f"{prefix}.{param}"
            if key in values:
                return as_tensor(values[key]).to(torch.float64).clone()
            return read_full(module.get_parameter(param)).detach().to(torch.float64).clone()

        if layout == "one_tap":
            offset = offsets[index % num_offsets]
            rows = (torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=generator)]
                    if opts.tap == "permutation" else None)
            w1, w2 = one_tap_weights(grid, s, offset, generator, gain_in=gain_in, gain_out=gain_out, rows=rows)
            if add:  # on top of the base's token MLP: its random composite plus the tap
                w1, w2 = current("fc1.weight") + w1, current("fc2.weight") + w2
            block_offsets.append([offset])
        else:
            w1, w2 = current("fc1.weight"), current("fc2.weight")
            block_offsets.append(list(offsets))
            if layout == "factored" and add:  # on top of the base's token MLP: its random composite plus the kernel
                w1[:n] += gain_in * eye
                w2[:, :n] += gain_out * sum(shifts)
            elif layout == "factored":
                w1[:n] = gain_in * eye
                w2.zero_()
                w2[:, :n] = gain_out * sum(shifts)
            else:
                for block, shift in enumerate(shifts):
                    w1[block * n:(block + 1) * n] = gain_in * shift
                if layout == "blocks":
                    w2.zero_()
                    for block in range(num_offsets):
                        w2[:, block * n:(block + 1) * n] = gain_out * eye
        values[f"{name}.fc1.weight"] = w1
        if layout == "fc1_only":
            continue
        values[f"{name}.fc2.weight"] = w2
        if add:  # the base's biases stay
            continue
        for lin in ("fc1", "fc2"):
            if getattr(mlp, lin).bias is not None:
                values[f"{name}.{lin}.bias"] = torch.zeros(getattr(mlp, lin).bias.shape, dtype=torch.float64)
    write_values(model, values)
    note = f"grid {grid[0]}x{grid[1]} (N={n}), token hidden S={s}, {num_offsets} offsets, layout {layout}"
    if layout == "blocks":
        note += f"; {s - num_offsets * n} remainder hidden units (fc1 kept, fc2 columns zero)"
    if layout == "one_tap":
        where = ("a random token permutation per block (the no-locality control)" if opts.tap == "permutation"
                 else f"offsets over depth {[tuple(o[0]) for o in block_offsets]}")
        note += (f"; one tap per block (gain {gain_in * gain_out:g}), {where}; all {s} hidden units carry it (signs "
                 "alternate, magnitudes U(0.5, 1.5))")
    if add:
        note += f"; added to the base's token MLP ({opts.base}), whose biases stay"
    notes.append(note)
    notes.append(_centre_kernel_note(model, grid))
    if layout in ("blocks", "fc1_only") and num_offsets == 1:
        notes.append(f"only one offset (identity) fits S//N = {s // n}: token mixing starts as the identity; "
                     "layout='factored' or 'one_tap' give other taps")
    return InitResult(options={**as_dict(opts), "num_offsets": num_offsets, "gain_out": gain_out},
                      offsets=block_offsets, notes=notes)


def _centre_kernel_note(model: nn.Module, grid: tuple[int, int]) -> str:
    """One line of the init report: block 0's composite token-mixing kernel (linear part, one-hot probing) at the
    centre token, over its 3×3 neighbourhood, row by row."""
    kernel = mixer_token_kernel(model)[0]
    h, w = grid
    r, c = h // 2, w // 2
    rows = []
    for dy in (-1, 0, 1):
        taps = [kernel[r * w + c, (r + dy) * w + c + dx] if 0 <= r + dy < h and 0 <= c + dx < w else 0.0
                for dx in (-1, 0, 1)]
        rows.append(" ".join(f"{float(t):+.2f}" for t in taps))
    return f"block 0 composite kernel at the centre token (3x3, rows top to bottom): [{' | '.join(rows)}]"


# ---------------------------------------------------------------------------------------------------- diagnostics


def mixer_token_kernel(model: nn.Module, eps: float = 1e-3) -> list[torch.Tensor]:
    """Per block, the effective linear token-mixing kernel ``K (N, N)`` at the current weights, measured by probing
    the token MLP with one-hot token inputs: ``K[t, s] = (f(ε·e_s) − f(−ε·e_s))_t / 2ε`` (central difference; the
    GELU curvature cancels). Row ``t`` = how output token ``t`` depends on input token ``s``. float64."""
    mlps = mixer_token_mlps(model)
    n = mlps[0][1].fc1.in_features
    out = []
    with torch.no_grad():
        for _, mlp in mlps:
            p = next(mlp.parameters())
            probe = (eps * torch.eye(n, dtype=torch.float64)).to(device=p.device, dtype=p.dtype)
            diff = (mlp(probe) - mlp(-probe)).to(torch.float64).cpu() / (2 * eps)  # row s = response to e_s
            out.append(diff.T.contiguous())
    return out


def mixer_token_jacobians(model: nn.Module, images: torch.Tensor) -> list[torch.Tensor]:
    """Per block, the token-mixing MLP's composite response on real inputs: its Jacobian ``J[t, s] = ∂f_t/∂u_s`` at
    the input it receives in the eval-mode forward of ``images`` (each channel's ``N`` tokens after ``norm1``), one
    per image and channel, ``(B·C, N, N)`` float32 (``torch.func.jacrev`` through the module's own GELU). Their mean
    over images and channels is the mean response; :func:`mixer_token_kernel` is the same Jacobian at the zero input
    (the pseudo-input kernel), so the two compare directly with :func:`mixer_kernel_summary`. The model's mode is
    restored."""
    mlps = mixer_token_mlps(model)
    out = []
    for (_, mlp), call in zip(mlps, module_calls(model, [mlp for _, mlp in mlps], images), strict=True):
        u = call.args[0]
        rows = u.reshape(-1, u.shape[-1])  # (B·C, N): the token MLP acts on each channel's token vector
        out.append(torch.func.vmap(torch.func.jacrev(mlp))(rows).detach().float())
    return out


def mixer_kernel_summary(
    kernels: list[torch.Tensor], grid: tuple[int, int], offsets: list[tuple[int, int]]
) -> list[dict[str, float]]:
    """Per block: over interior tokens (every offset on the grid), ``offset_mass`` = share of ``Σ_s |K[t, s]|`` on
    the offsets' taps, ``hit_rate`` = share of tokens whose ``argmax_s |K[t, s]|`` is one of them, ``entropy`` (nats)
    of the row-normalised ``|K|``. Use ``grid = model.stem.grid_size``."""
    h, w = grid
    dys = [dy for dy, _ in offsets]
    dxs = [dx for _, dx in offsets]
    rows = [r * w + c for r in range(max(0, -min(dys)), h - max(0, max(dys)))
            for c in range(max(0, -min(dxs)), w - max(0, max(dxs)))]
    res = []
    for kernel in kernels:
        magnitude = kernel.abs()
        share = magnitude / magnitude.sum(-1, keepdim=True).clamp_min(1e-300)
        masses, hits = [], []
        for t in rows:
            taps = {t + dy * w + dx for dy, dx in offsets}
            tap_index = torch.tensor(sorted(taps))
            masses.append(float(share[t, tap_index].sum()))
            hits.append(float(int(magnitude[t].argmax()) in taps))
        entropy = (
            float(-(share[rows] * share[rows].clamp_min(1e-300).log()).sum(-1).mean()) if rows else float("nan")
        )
        res.append({"offset_mass": sum(masses) / max(1, len(masses)), "hit_rate": sum(hits) / max(1, len(hits)),
                    "entropy": entropy})
    return res


@register_attention_maps(matches=is_mixer)
def _mixer_maps(model: nn.Module, images: torch.Tensor | None) -> AttentionMaps:
    """``impulsevit.init.attention_maps`` for Mixer: per block one "head", the row-normalised ``|K|`` of
    :func:`mixer_token_kernel` ``(1, N, N)`` (a property of the weights; ``images`` are ignored). With several
    offsets per block, ``summarize`` scores only the first one — use :func:`mixer_kernel_summary` for the offset set.
    """
    del images
    maps = []
    for k in mixer_token_kernel(model):
        a = k.abs()
        maps.append((a / a.sum(-1, keepdim=True).clamp_min(1e-300)).float().unsqueeze(0))
    return AttentionMaps(maps, _grid(model), 0, "token-kernel")
