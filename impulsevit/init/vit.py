"""The ``impulse`` / ``mimetic`` handlers for family ``vit`` (the layout they read: :mod:`impulsevit.init.vit_layout`,
re-exported here; the worker threads of their solves: :mod:`impulsevit.init.solver_pool`).

Applies to timm's ``VisionTransformer`` family (ViT, DeiT incl. distilled, register tokens, with or without class
token) and any model with a top-level ``blocks`` sequence whose blocks hold timm's fused-qkv ``Attention`` (``attn.qkv``
``3A × D``, ``attn.proj``); ``impulse`` additionally needs an absolute ``pos_embed`` ``(1, L, D)`` and a known patch
grid (``patch_embed.grid_size``). Not supported: separate q/k/v projections, ``qk_norm`` (it would undo the designed
logits), relative / rotary position encodings (ROPE ViTs, Swin — see the ``swin`` family), an attention width
``A ≠ D`` for the mimetic value/proj.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from impulsevit.init import impulse
from impulsevit.init.api import InitResult, calibration_batch, read_full, register
from impulsevit.init.baselines import Value, as_tensor, base_values, write_values
from impulsevit.init.options import BaseOptions, MimeticOptions, OffsetOptions, as_dict, check_range
from impulsevit.init.solver_pool import run_parallel as _run_parallel
from impulsevit.init.solver_pool import solver_threads
from impulsevit.init.vit_layout import VitLayout, is_vit, patch_pseudo_input, vit_layout

__all__ = ["VitLayout", "vit_layout", "is_vit", "VitImpulseOptions", "VitMimeticOptions", "patch_pseudo_input"]


@dataclasses.dataclass(frozen=True)
class VitImpulseOptions(BaseOptions, OffsetOptions):
    """Options of ``impulse`` on a ViT; the defaults are the released algorithm (``impulsevit/init/README.md`` has
    the card: what each option changes and which were measured). Every float is >= 0.

    ``pseudo_input``: ``"pos_embed"`` (released) solves every block's Q/K for ``LN0(pe)``; ``"propagated"`` (opt-in;
    behind the released solve in the paired studies of docs/results.md) solves block ``l``'s Q/K for ``LN0`` of the
    pseudo-input carried through blocks ``0..l-1`` as they are initialised (:func:`_propagated_solves`);
    ``"calibration"`` (opt-in) solves block ``l``'s Q/K for the normed tokens that ``calibration_images`` real images
    give it through the blocks initialised before (:func:`_calibrated_solves`, a ridge of ``calibration_ridge``).
    Only ``timm``'s ``VisionTransformer`` with its plain pre-norm ``Block`` for the last two.
    """

    replacement: bool = True
    offsets_per_layer: bool = False
    boundary: Literal["zero", "circular"] = "zero"
    gain_pos: float = 18.0
    gain_qk: float = 7.0
    gain_v: float = 1.0
    value: Literal["mimetic", "default"] = "mimetic"
    value_alpha: float = 0.4
    value_beta: float = 0.4
    on_value: float = 1000.0
    noise_scale: float = 3.0
    noise_std: float = 0.6
    noise_clip: float = 2.0
    rank_rtol: float = 1e-5
    qk_normalize: Literal["frobenius", "logit"] = "frobenius"
    target_logit: float = 10.0
    grid: tuple[int, int] | None = None
    pseudo_input: Literal["pos_embed", "propagated", "calibration"] = "pos_embed"
    calibration_images: int = 64
    calibration_ridge: float = 0.1

    def __post_init__(self) -> None:
        _non_negative_floats(self)
        if self.calibration_images < 1:
            raise ValueError(f"calibration_images must be >= 1, got {self.calibration_images}")

    def calibration_size(self) -> int:
        """Images of the calibration batch these options need (:func:`impulsevit.init.api.calibration_size`)."""
        return self.calibration_images if self.pseudo_input == "calibration" else 0


@dataclasses.dataclass(frozen=True)
class VitMimeticOptions(BaseOptions, MimeticOptions):
    """Options of ``mimetic`` on a ViT: the shared mimetic ones plus ``value_layout`` (how the value/proj factors
    are written: ``"released"`` as the released mimetic mode, ``"row"`` the row convention) and ``base``."""

    value_layout: Literal["row", "released"] = "released"


def _non_negative_floats(options: object) -> None:
    """Every ``float`` field of ``options`` >= 0 (``ValueError`` naming the first that is not)."""
    for field in dataclasses.fields(options):  # type: ignore[arg-type]
        if field.type in (float, "float"):
            check_range(field.name, getattr(options, field.name), 0.0)


def _base_values(
    model: nn.Module, generator: torch.Generator, base: str, skip: set[str]
) -> tuple[dict[str, Value], list[str]]:
    """The ``base`` init's values of every tensor not named in ``skip`` and its notes
    (:func:`~impulsevit.init.baselines.base_values`: the ``torch`` method's draws, whatever ``skip`` is)."""
    return base_values(model, generator, base, skip)


def _current(model: nn.Module, values: dict[str, Value], name: str) -> torch.Tensor:
    """The value of ``name`` before this initializer's own writes: its base value if it has one (materialised in
    ``values``), else the model's tensor (float32, CPU)."""
    if name in values:
        values[name] = as_tensor(values[name])
        return values[name]
    return read_full(model.get_parameter(name)).detach().float().cpu()


def _attention_weight_names(layout: VitLayout) -> set[str]:
    """Every block's ``qkv.weight`` and ``proj.weight``: what a mimetic value/proj overwrites entirely (the base init
    then draws nothing for them)."""
    return {f"{attn_name}.{linear}.weight" for attn_name in layout.attn_names for linear in ("qkv", "proj")}


def _check_value_width(layout: VitLayout) -> None:
    """The mimetic value/proj needs the attention width ``A = h·d`` equal to the embedding width ``D``."""
    if layout.attn_width != layout.dim:
        raise ValueError(
            f"{layout.model}: attention width {layout.attn_width} != embed dim {layout.dim}; the mimetic "
            "value/proj needs them equal (use value='default')"
        )


def _value_proj(value_matrix: torch.Tensor, gain: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gain·w_v, gain·w_proj)``, float32: the balanced factors of a drawn value matrix ``C``
    (:func:`impulsevit.init.impulse.value_proj_from`). Pure: runs on a worker thread."""
    # float32 factorisation: the product is stored in float32 anyway (error ~1e-6), at half the cost of float64
    wv, wp = impulse.value_proj_from(value_matrix.float(), dtype=torch.float32)
    return gain * wv, gain * wp


def _set_attention_values(
    model: nn.Module,
    layout: VitLayout,
    values: dict[str, Value],
    attn_name: str,
    wq: torch.Tensor,
    wk: torch.Tensor,
    value_proj: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    """Put one block's new ``qkv.weight`` into ``values``: its Q rows ``wq`` and K rows ``wk`` (``A × D`` each); with
    ``value_proj = (w_v, w_proj)`` also its V rows and ``proj.weight``, else the V rows keep their base (or current)
    value."""
    width = layout.attn_width
    key = f"{attn_name}.qkv.weight"
    qkv = torch.empty(3 * width, layout.dim) if value_proj is not None else _current(model, values, key).clone()
    qkv[:width] = wq
    qkv[width : 2 * width] = wk
    if value_proj is not None:
        wv, wp = value_proj
        qkv[2 * width :] = wv
        values[f"{attn_name}.proj.weight"] = wp
    values[key] = qkv


def _impulse_pos_embed(
    model: nn.Module, layout: VitLayout, values: dict[str, Value], gain_pos: float
) -> tuple[torch.Tensor, list[str]]:
    """The ``pos_embed`` the impulse init writes (its base or current value times ``gain_pos``; a frozen table is used
    as is) and a note when it is frozen.

    Raises:
        ValueError: the position embedding is not finite (e.g. left uninitialized with ``base='keep'``).
    """
    notes = []
    pos = _current(model, values, layout.pos_name)
    if model.get_parameter(layout.pos_name).requires_grad:
        pos = pos * gain_pos
    else:
        notes.append("pos_embed is frozen (a fixed table): used as is, gain_pos not applied")
    if not torch.isfinite(pos).all():
        raise ValueError(f"{layout.model}.pos_embed is not finite (uninitialized?); use base='torch'")
    return pos, notes


def _pseudo_input_notes(pseudo: impulse.PseudoInput, num_tokens: int, head_dim: int,
                        opts: VitImpulseOptions) -> list[str]:
    """Notes on the rank the Q/K solve runs at (below ``head_dim``: too few tokens, or a rank-deficient pseudo-input)
    and on the Q/K scale rule (the Frobenius rule on a rank-deficient pseudo-input; the logit rule)."""
    n, d = num_tokens, head_dim
    notes = []
    if pseudo.rank < d:
        if pseudo.numerical_rank >= n:  # full row rank, just fewer tokens than head dims: the released math, exactly
            notes.append(
                f"rank {pseudo.rank} < head_dim {d}: solved at rank {pseudo.rank} (N = {n} tokens; rows beyond stay 0)"
            )
        else:
            notes.append(
                f"rank-deficient pseudo-input (numerical rank {pseudo.numerical_rank} < min(N={n}, head_dim={d}) at "
                f"rtol {opts.rank_rtol:g}, e.g. a sin-cos table): solved at rank {pseudo.rank}"
            )
    if opts.qk_normalize == "frobenius" and pseudo.numerical_rank < min(n, d):
        notes.append(
            "the released Frobenius scale collapses the logits on a numerically rank-deficient pseudo-input (near-"
            "uniform attention); qk_normalize='logit' is the opt-in alternative (see the method card)"
        )
    if opts.qk_normalize == "logit":
        notes.append(f"Q/K scaled so the mean target logit is {opts.target_logit:g} (not ‖W‖_F = gain_qk)")
    return notes


def _draw_and_solve_layers(
    layout: VitLayout, generator: torch.Generator, pseudo: impulse.PseudoInput, opts: VitImpulseOptions
) -> tuple[list[list[impulse.Offset]], list[impulse.QKSolution], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every random draw of the layers, on this thread in the documented order, and their solves on
    :func:`solver_threads`.

    Draws the offsets (once; again for every layer after the first with ``offsets_per_layer`` and random offsets),
    then per layer the target noise ``(h, N, N)`` and, with ``value='mimetic'``, the value matrix ``C``. Each layer's
    Q/K solve (:func:`impulsevit.init.impulse.solve_qk`) and V/proj factorisation (:func:`_value_proj`), pure
    functions of its draws, start on the worker threads as soon as the layer is drawn.

    Returns:
        Per layer: the heads' offsets, the Q/K solution and — only with ``value='mimetic'``, else an empty list — the
        ``(w_v, w_proj)`` pair.
    """
    H, W = layout.grid

    def draw_offsets() -> list[impulse.Offset]:
        return impulse.impulse_offsets(
            layout.num_heads, opts.kernel_size, opts.offsets, generator=generator, replacement=opts.replacement
        )

    def solve(offsets: list[impulse.Offset], noise: torch.Tensor) -> impulse.QKSolution:
        return impulse.solve_qk(
            pseudo, H, W, offsets, noise, layout.head_dim,
            **_solve_options(opts))

    shared = draw_offsets()
    redraw = opts.offsets_per_layer and opts.offsets == "random"
    layer_offsets: list[list[impulse.Offset]] = []
    with solver_threads() as submit:
        value_futures, qk_futures = [], []
        for layer in range(len(layout.attn_names)):
            offsets = draw_offsets() if (redraw and layer) else shared
            layer_offsets.append(offsets)
            noise = impulse.draw_noise(
                layout.num_heads, H * W, generator, std=opts.noise_std, clip=opts.noise_clip
            )
            if opts.value == "mimetic":
                value_matrix = impulse.draw_value_matrix(layout.dim, generator, opts.value_alpha, opts.value_beta)
                value_futures.append(submit(functools.partial(_value_proj, value_matrix, opts.gain_v)))
            qk_futures.append(submit(functools.partial(solve, offsets, noise)))
        value_projs = [f.result() for f in value_futures]
        qk_solutions = [f.result() for f in qk_futures]
    return layer_offsets, qk_solutions, value_projs


def _call_part(model: nn.Module, values: dict[str, Value], index: int, part: str, t: torch.Tensor) -> torch.Tensor:
    """``blocks[index].<part>`` applied to ``t`` with the values decided so far, in eval mode
    (``torch.func.functional_call`` on full float32 CPU tensors; see :func:`_block_forward`)."""
    sub = getattr(model.blocks[index], part)
    names = [n for n, _ in [*sub.named_parameters(), *sub.named_buffers()]]
    state = {n: _current(model, values, f"blocks.{index}.{part}.{n}") for n in names}
    was_training = sub.training
    sub.eval()
    try:
        return torch.func.functional_call(sub, state, (t,))
    finally:
        sub.train(was_training)


def _block_forward(model: nn.Module, values: dict[str, Value], index: int, x: torch.Tensor) -> torch.Tensor:
    """Block ``index`` of ``model`` applied to tokens ``x`` ``(1, N, D)`` with the values this initializer has decided
    so far (:func:`_current`: base or written values, else the model's own), in eval semantics (no dropout / drop path):
    ``x + ls1(attn(norm1(x)))`` then ``+ ls2(mlp(norm2(·)))``, timm ``Block``'s forward, each part through
    ``torch.func.functional_call`` on full float32 CPU tensors (so it also runs on FSDP2 ``DTensor`` parameters: the
    sharded block's own hooks are not called).

    Raises:
        ValueError: the block is not a timm ``vision_transformer.Block`` (a residual-post or parallel block would need
            its own forward).
    """
    from timm.models.vision_transformer import Block

    block = model.blocks[index]
    if not isinstance(block, Block):
        raise ValueError(f"{type(model).__name__}.blocks.{index} is {type(block).__name__}, not timm's Block: "
                         "pseudo_input='propagated' / 'calibration' need the plain pre-norm block")

    def call(part: str, t: torch.Tensor) -> torch.Tensor:
        return _call_part(model, values, index, part, t)

    x = x + call("ls1", call("attn", call("norm1", x)))
    return x + call("ls2", call("mlp", call("norm2", x)))


def _solve_options(opts: VitImpulseOptions) -> dict:
    """The target and scale options every Q/K solve of a layer takes (:func:`impulse.solve_qk`,
    :func:`impulse.solve_qk_calibrated`), float32 factors."""
    return dict(on_value=opts.on_value, noise_scale=opts.noise_scale, boundary=opts.boundary, gain=opts.gain_qk,
                normalize=opts.qk_normalize, target_logit=opts.target_logit, dtype=torch.float32)


def _write_block(
    model: nn.Module, layout: VitLayout, values: dict[str, Value], attn_name: str, qk: impulse.QKSolution,
    value_matrix: torch.Tensor | None, gain_v: float, value_projs: list[tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """One block of a sequential solve decided: its V/proj factored from ``value_matrix`` (appended to
    ``value_projs``; none without one) and its new Q/K/V/proj put into ``values``, so the next block's forward sees
    them."""
    value_proj = _value_proj(value_matrix, gain_v) if value_matrix is not None else None
    if value_proj is not None:
        value_projs.append(value_proj)
    width, dim = layout.attn_width, layout.dim
    _set_attention_values(model, layout, values, attn_name, qk.wq.reshape(width, dim), qk.wk.reshape(width, dim),
                          value_proj)


def _layer_draws(
    layout: VitLayout, generator: torch.Generator, opts: VitImpulseOptions
) -> tuple[list[list[impulse.Offset]], list[torch.Tensor], list[torch.Tensor]]:
    """Every layer's draws in :func:`_draw_and_solve_layers`' order, from the same ``generator``: the offsets (once,
    or per layer), then per layer the target noise ``(h, N, N)`` and, with ``value='mimetic'``, the value matrix
    (else that list is empty). For the sequential solves, which need all draws before the first block is solved."""
    H, W = layout.grid
    shared = impulse.impulse_offsets(layout.num_heads, opts.kernel_size, opts.offsets, generator=generator,
                                     replacement=opts.replacement)
    redraw = opts.offsets_per_layer and opts.offsets == "random"
    layer_offsets, noises, value_matrices = [], [], []
    for layer in range(len(layout.attn_names)):
        layer_offsets.append(
            impulse.impulse_offsets(layout.num_heads, opts.kernel_size, opts.offsets, generator=generator,
                                    replacement=opts.replacement) if (redraw and layer) else shared
        )
        noises.append(impulse.draw_noise(layout.num_heads, H * W, generator, std=opts.noise_std, clip=opts.noise_clip))
        if opts.value == "mimetic":
            value_matrices.append(impulse.draw_value_matrix(layout.dim, generator, opts.value_alpha, opts.value_beta))
    return layer_offsets, noises, value_matrices


class _Stem(nn.Module):
    """timm ``VisionTransformer``'s forward up to its first block (patch embedding, prefix tokens, position embedding,
    patch dropout, ``norm_pre``), as a module around the model so that ``torch.func.functional_call`` can run it with
    the values an initializer has decided (names ``vit.<parameter>``)."""

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        from impulsevit._compat.timm import vit_tokens_before_blocks

        return vit_tokens_before_blocks(self.vit, images)


def _stem_forward(model: nn.Module, values: dict[str, Value], images: torch.Tensor) -> torch.Tensor:
    """The tokens entering block 0 on ``images`` ``(n, 3, H, W)`` → ``(n, L, D)`` float32, with the values decided so
    far (:func:`_current`) and in eval semantics (no dropout, no patch dropout).

    Raises:
        ValueError: ``model`` is not timm's ``VisionTransformer`` (its stem is what this runs).
    """
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise ValueError(f"{type(model).__name__} is not timm's VisionTransformer: pseudo_input='calibration' runs its "
                         "stem (patch_embed, _pos_embed, norm_pre)")
    skip = ("blocks.", "norm.", "fc_norm.", "head", "attn_pool.")
    names = [n for n, _ in [*model.named_parameters(), *model.named_buffers()] if not n.startswith(skip)]
    state = {f"vit.{n}": _current(model, values, n) for n in names}
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        return torch.func.functional_call(_Stem(model), state, (images.float(),))
    finally:
        for m, mode in modes.items():
            m.training = mode


def _calibrated_solves(
    model: nn.Module,
    layout: VitLayout,
    values: dict[str, Value],
    generator: torch.Generator,
    images: torch.Tensor,
    opts: VitImpulseOptions,
) -> tuple[list[list[impulse.Offset]], list[impulse.QKSolution], list[tuple[torch.Tensor, torch.Tensor]]]:
    """``pseudo_input='calibration'``: the draws of :func:`_draw_and_solve_layers` (same order, same generator), then
    block by block: block ``l``'s Q/K solved (:func:`impulse.solve_qk_calibrated`) for its ``norm1`` output on the
    patch tokens of the calibration ``images``, which the stem (with the scaled position embedding) and blocks
    ``0..l-1`` (already given their new Q/K/V/proj) produce — prefix tokens included in the forward, as in training.

    Why: the released solve designs every block for ``LN0(pe)``; on real images the content in the residual stream
    and the blocks before dilute that design with depth (the logit-term split, :mod:`impulsevit.init.logit_terms`).
    A pure function of the model, the generator and the images; on one intra-op thread.
    """
    H, W = layout.grid
    layer_offsets, noises, value_matrices = _layer_draws(layout, generator, opts)
    qk_solutions, value_projs = [], []
    with solver_threads():
        x = _stem_forward(model, values, images)
        for layer, attn_name in enumerate(layout.attn_names):
            rows = _call_part(model, values, layer, "norm1", x)[:, layout.num_prefix:]
            qk = impulse.solve_qk_calibrated(
                rows, H, W, layer_offsets[layer], noises[layer], layout.head_dim,
                ridge=opts.calibration_ridge, rtol=opts.rank_rtol, **_solve_options(opts))
            qk_solutions.append(qk)
            _write_block(model, layout, values, attn_name, qk,
                         value_matrices[layer] if value_matrices else None, opts.gain_v, value_projs)
            if layer + 1 < len(layout.attn_names):
                x = _block_forward(model, values, layer, x)
    return layer_offsets, qk_solutions, value_projs


def _propagated_solves(
    model: nn.Module,
    layout: VitLayout,
    values: dict[str, Value],
    generator: torch.Generator,
    pos: torch.Tensor,
    pseudo0: impulse.PseudoInput,
    opts: VitImpulseOptions,
) -> tuple[list[list[impulse.Offset]], list[impulse.QKSolution], list[tuple[torch.Tensor, torch.Tensor]], list[int]]:
    """``pseudo_input='propagated'``: the draws of :func:`_draw_and_solve_layers`, in its order and from the same
    ``generator`` (so the offsets, noise and value matrices are the default's), then block by block: solve block
    ``l``'s Q/K for ``P_l = LN0(x_l)``, where ``x_0`` are the patch rows of the (scaled) ``pos_embed`` — so block 0 is
    the default's — and ``x_{l+1}`` is block ``l`` applied to ``x_l`` with its new Q/K/V/proj and its base values of
    everything else (:func:`_block_forward`; biases included, no patch content, no prefix tokens).

    Why: the released solve designs every block for ``LN0(pe)``, but block ``l`` sees the position embedding only
    after the blocks before it have transformed it; the logit-term split (:mod:`impulsevit.init.logit_terms`) measures
    the structure on the positional stream alone (a zero image) falling from 1.00 (block 0) to about 0.4 (block 1) on
    ``cpu_fmnist_vit_smallimg``'s model. Sequential (each block needs the previous ones), on one intra-op thread as
    every solve here (bit-reproducible whatever the thread count). A pure function of the model and the generator.

    Returns:
        As :func:`_draw_and_solve_layers`, plus the solve rank of every block.
    """
    H, W = layout.grid
    num_layers = len(layout.attn_names)
    layer_offsets, noises, value_matrices = _layer_draws(layout, generator, opts)
    qk_solutions, value_projs, ranks = [], [], []
    x = pos[:, layout.patch_rows].float()
    with solver_threads():  # one intra-op thread on this thread too: the block forwards' bits do not follow the count
        for layer, attn_name in enumerate(layout.attn_names):
            pseudo = pseudo0 if layer == 0 else impulse.factor_pseudo_input(
                impulse.layer_norm_rows(x[0].to(torch.float64)), layout.head_dim, rtol=opts.rank_rtol
            )
            ranks.append(pseudo.rank)
            qk = impulse.solve_qk(
                pseudo, H, W, layer_offsets[layer], noises[layer], layout.head_dim,
                **_solve_options(opts))
            qk_solutions.append(qk)
            _write_block(model, layout, values, attn_name, qk,
                         value_matrices[layer] if value_matrices else None, opts.gain_v, value_projs)
            if layer + 1 < num_layers:
                x = _block_forward(model, values, layer, x)
    return layer_offsets, qk_solutions, value_projs, ranks


@register("impulse", family="vit", matches=is_vit, options=VitImpulseOptions)
def impulse_vit(model: nn.Module, generator: torch.Generator, options: VitImpulseOptions) -> InitResult:
    """Impulse init of a timm ViT (``docs/method.md`` §2 by default; options for §3 variants, see the README card).

    Order of random draws (all from ``generator``): ``torch`` baseline of every tensor not fully overwritten
    (``base='torch'``), random offsets (once, or per layer), then per layer: the target noise ``(h, N, N)``, then the
    value/proj matrix ``Z``.
    """
    opts = options
    layout = vit_layout(model, need_pos_embed=True, grid=opts.grid)
    H, W = layout.grid
    if opts.kernel_size > min(H, W):
        raise ValueError(f"{layout.model}: kernel_size {opts.kernel_size} larger than the {H}x{W} token grid")
    mimetic_value = opts.value == "mimetic"
    # 1) the base init of every tensor not overwritten entirely
    values, notes = _base_values(
        model, generator, opts.base, _attention_weight_names(layout) if mimetic_value else set()
    )
    # 2) the pseudo-input: the patch rows of the scaled pos_embed, layer-normed, factored
    pos, pos_notes = _impulse_pos_embed(model, layout, values, opts.gain_pos)
    rows = patch_pseudo_input(pos, layout.patch_rows)
    with solver_threads() as submit:  # one intra-op thread, as every solve: the SVD's bits must not follow the count
        pseudo = submit(lambda: impulse.factor_pseudo_input(rows, layout.head_dim, rtol=opts.rank_rtol)).result()
    notes += pos_notes + _pseudo_input_notes(pseudo, H * W, layout.head_dim, opts)
    if mimetic_value:
        _check_value_width(layout)
    # 3) per layer: offsets, noise and value matrix drawn, Q/K and V/proj solved
    if opts.pseudo_input == "calibration":
        images = calibration_batch()
        if images is None:  # initialize() checks this first; a direct call of the handler may not have
            raise ValueError(f"{layout.model}: pseudo_input='calibration' needs a calibration batch "
                             "(initialize(..., calibration=images))")
        values[layout.pos_name] = pos  # the stem adds the scaled position embedding
        layer_offsets, qk_solutions, value_projs = _calibrated_solves(model, layout, values, generator, images, opts)
        notes.append(f"pseudo_input='calibration': each block solved for its normed tokens on {images.shape[0]} real "
                     f"images through the blocks before it (ridge {opts.calibration_ridge:g})")
    elif opts.pseudo_input == "propagated":
        layer_offsets, qk_solutions, value_projs, ranks = _propagated_solves(
            model, layout, values, generator, pos, pseudo, opts
        )
        notes.append(f"pseudo_input='propagated': each block solved for LN0 of the pseudo-input carried through the "
                     f"blocks before it (ranks per block {ranks})")
    else:
        layer_offsets, qk_solutions, value_projs = _draw_and_solve_layers(layout, generator, pseudo, opts)
    # 4) assemble qkv / proj and write everything at once
    width, dim = layout.attn_width, layout.dim
    for layer, attn_name in enumerate(layout.attn_names):
        qk = qk_solutions[layer]
        value_proj = value_projs[layer] if mimetic_value else None
        _set_attention_values(
            model, layout, values, attn_name, qk.wq.reshape(width, dim), qk.wk.reshape(width, dim), value_proj
        )
    values[layout.pos_name] = pos
    write_values(model, values)
    resolved = {**as_dict(opts), "grid": [H, W], "rank": pseudo.rank, "qk_normalize_used": opts.qk_normalize}
    return InitResult(options=resolved, offsets=layer_offsets, notes=notes)


def _draw_mimetic_targets(
    layout: VitLayout, generator: torch.Generator, opts: VitMimeticOptions
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The random draws of ``mimetic``, per layer in this order: the ``h`` Q/K targets ``α1 Z + β1 I``
    (``(h, D, D)``), then — with ``value='mimetic'`` — the value matrix ``C = α2 Z − β2 I``.

    Returns:
        The Q/K targets and the value matrices (empty unless ``value='mimetic'``), one per layer.
    """
    qk_targets, value_matrices = [], []
    for _ in layout.attn_names:
        qk_targets.append(
            impulse.draw_mimetic_qk_targets(layout.dim, layout.num_heads, generator, opts.qk_alpha, opts.qk_beta)
        )
        if opts.value == "mimetic":
            value_matrices.append(
                impulse.draw_value_matrix(layout.dim, generator, opts.value_alpha, opts.value_beta)
            )
    return qk_targets, value_matrices


def _head_qk_factors(target: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The balanced rank-``d`` factors ``(L, R)`` of one head's Q/K target, float32 (``W_q = Lᵀ``, ``W_k = R``)."""
    # float32 eigensolve: the factors are stored in float32 anyway (best rank-d approximation to ~1e-6)
    return impulse.balanced_factors(target.float(), rank=head_dim, dtype=torch.float32)


def _mimetic_factors(
    qk_targets: list[torch.Tensor], value_matrices: list[torch.Tensor], head_dim: int
) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every head's Q/K factors and every layer's ``(w_v, w_proj)``, factorised in parallel (:func:`_run_parallel`).

    Returns:
        Per layer the heads' ``(L, R)``, and per layer the value/proj pair (empty without value matrices).
    """
    num_heads = qk_targets[0].shape[0]
    tasks: list[Callable[[], tuple[torch.Tensor, torch.Tensor]]] = [
        functools.partial(_head_qk_factors, target[head], head_dim)
        for target in qk_targets
        for head in range(num_heads)
    ]
    tasks += [functools.partial(_value_proj, value_matrix, 1.0) for value_matrix in value_matrices]
    results = _run_parallel(tasks)
    head_factors = [results[layer * num_heads : (layer + 1) * num_heads] for layer in range(len(qk_targets))]
    return head_factors, results[len(qk_targets) * num_heads :]


@register("mimetic", family="vit", matches=is_vit, options=VitMimeticOptions)
def mimetic_vit(model: nn.Module, generator: torch.Generator, options: VitMimeticOptions) -> InitResult:
    """Mimetic init of a timm ViT (``docs/method.md`` §5.1): per head ``W_qᵀW_k`` = best rank-``d`` approx of
    ``α1 Z + β1 I``; per layer the balanced factors of ``C = α2 Z − β2 I`` written as the released mimetic mode
    writes them (``value_layout='released'``: untransposed, realising ``x ↦ x (R L)ᵀ``; it beat the row-convention
    ``x ↦ x C`` of ``value_layout='row'`` in training, see the README card). pos_embed is not scaled.

    Order of random draws: ``torch`` baseline (``base='torch'``), then per layer: the ``h`` Q/K matrices ``Z``, then
    the value/proj ``Z``.
    """
    opts = options
    layout = vit_layout(model, need_pos_embed=False)
    if layout.head_dim > layout.dim:
        raise ValueError(
            f"{layout.model}: head_dim {layout.head_dim} > embed dim {layout.dim}; mimetic Q/K not defined"
        )
    mimetic_value = opts.value == "mimetic"
    values, notes = _base_values(
        model, generator, opts.base, _attention_weight_names(layout) if mimetic_value else set()
    )
    if mimetic_value:
        _check_value_width(layout)
    # draws on this thread, then the factorisations in parallel
    qk_targets, value_matrices = _draw_mimetic_targets(layout, generator, opts)
    head_factors, value_projs = _mimetic_factors(qk_targets, value_matrices, layout.head_dim)
    for layer, attn_name in enumerate(layout.attn_names):
        wq = torch.cat([lf.T for lf, _ in head_factors[layer]])  # head i's rows: L_iᵀ (d × D)
        wk = torch.cat([rf for _, rf in head_factors[layer]])  # R_i (d × D)
        value_proj = None
        if mimetic_value:
            wv, wp = value_projs[layer]
            if opts.value_layout == "released":  # the released mimetic mode writes the factors untransposed
                wv, wp = wv.T.contiguous(), wp.T.contiguous()
            value_proj = (wv, wp)
        _set_attention_values(model, layout, values, attn_name, wq, wk, value_proj)
    write_values(model, values)
    return InitResult(options=as_dict(opts), notes=notes)
