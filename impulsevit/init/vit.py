"""timm VisionTransformer adapter and the ``impulse`` / ``mimetic`` handlers for family ``vit``.

Applies to timm's ``VisionTransformer`` family (ViT, DeiT incl. distilled, register tokens, with or without class
token) and any model with a top-level ``blocks`` sequence whose blocks hold timm's fused-qkv ``Attention`` (``attn.qkv``
``3A × D``, ``attn.proj``); ``impulse`` additionally needs an absolute ``pos_embed`` ``(1, L, D)`` and a known patch
grid (``patch_embed.grid_size``). Not supported: separate q/k/v projections, ``qk_norm`` (it would undo the designed
logits), relative / rotary position encodings (ROPE ViTs, Swin — see the ``swin`` family), an attention width
``A ≠ D`` for the mimetic value/proj.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import torch
from torch import nn

from impulsevit.init import impulse as imp
from impulsevit.init.api import InitResult, check_options, read_full, register
from impulsevit.init.baselines import Value, as_tensor, torch_default_fills, write_values

__all__ = ["VitLayout", "vit_layout", "is_vit", "IMPULSE_DEFAULTS", "MIMETIC_DEFAULTS", "patch_pseudo_input"]


@dataclasses.dataclass
class VitLayout:
    """Where the pieces of a ViT are.

    Attributes:
        model: class name (for messages).
        attn_names: module path of each block's attention (``blocks.3.attn``), in depth order.
        attns: the attention modules.
        dim: embedding width ``D``; ``num_heads`` ``h``; ``head_dim`` ``d``.
        grid: ``(H, W)`` patch grid, or ``None`` if unknown.
        pos_name: ``'pos_embed'`` or ``None`` if the model has no absolute position embedding.
        patch_rows: rows of ``pos_embed[0]`` that belong to patch tokens (the prefix rows are skipped when
            ``no_embed_class`` is false).
        num_prefix: prefix tokens in the sequence (class + register + distillation).
    """

    model: str
    attn_names: list[str]
    attns: list[nn.Module]
    dim: int
    num_heads: int
    head_dim: int
    grid: tuple[int, int] | None
    pos_name: str | None
    patch_rows: slice | None
    num_prefix: int


def _is_fused_attention(m: nn.Module) -> bool:
    qkv, proj = getattr(m, "qkv", None), getattr(m, "proj", None)
    return (
        isinstance(qkv, nn.Linear)
        and isinstance(proj, nn.Linear)
        and isinstance(getattr(m, "num_heads", None), int)
        and isinstance(getattr(m, "head_dim", None), int)
        and qkv.out_features == 3 * m.num_heads * m.head_dim
    )


def is_vit(model: nn.Module) -> bool:
    """True for models with a top-level ``blocks`` container whose blocks have an ``attn`` with a ``qkv`` projection
    (the dispatch test; :func:`vit_layout` then checks every detail and raises with the missing piece)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        return False
    return any(hasattr(getattr(b, "attn", None), "qkv") for b in blocks.children())


def vit_layout(model: nn.Module, *, need_pos_embed: bool, grid: Sequence[int] | None = None) -> VitLayout:
    """Locate blocks, attention, prefix tokens, pos_embed rows and the token grid of a timm ViT.

    Args:
        need_pos_embed: require an absolute ``pos_embed`` and a grid (``impulse``); ``mimetic`` does not.
        grid: ``(H, W)`` override when ``patch_embed.grid_size`` is absent.

    Raises:
        ValueError: naming the model class and the missing / unsupported piece.
    """
    name = type(model).__name__
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module) or len(list(blocks.children())) == 0:
        raise ValueError(f"{name} has no transformer `blocks`: not a timm VisionTransformer")
    if getattr(model, "rope", None) is not None:
        raise ValueError(
            f"{name} uses rotary position embeddings (`rope`), which rotate Q and K per token: the designed Q/K "
            "logits would not hold; not supported (build it without rope, or use init 'torch' / 'timm')"
        )
    for shared in ("rel_pos_bias", "shared_rel_pos"):
        if getattr(model, shared, None) is not None:
            raise ValueError(
                f"{name} uses a shared relative position bias (`{shared}`) added to the attention logits; not "
                "supported by the ViT adapter (it needs an absolute `pos_embed` as pseudo-input and plain logits)"
            )
    attns, names = [], []
    for i, blk in enumerate(blocks.children()):
        attn = getattr(blk, "attn", None)
        for rel in ("relative_position_bias_table", "rel_pos"):
            if getattr(attn, rel, None) is not None:
                raise ValueError(
                    f"{name}: block {i} attention has a relative position bias (`{rel}`) added to its logits; not "
                    "supported by the ViT adapter (it needs an absolute `pos_embed` as pseudo-input and plain logits)"
                )
        if attn is None or not _is_fused_attention(attn):
            raise ValueError(
                f"{name}: block {i} has no timm-style attention with a fused `qkv` Linear (3·heads·head_dim outputs), "
                "`proj`, `num_heads`, `head_dim` — separate q/k/v projections are not supported"
            )
        for norm in ("q_norm", "k_norm"):
            if not isinstance(getattr(attn, norm, nn.Identity()), nn.Identity):
                raise ValueError(f"{name}: block {i} uses {norm} (qk_norm=True), which would undo the designed Q/K")
        attns.append(attn)
        names.append(f"blocks.{i}.attn")
    h, d = attns[0].num_heads, attns[0].head_dim
    dim = attns[0].qkv.in_features
    if any((a.num_heads, a.head_dim, a.qkv.in_features) != (h, d, dim) for a in attns):
        raise ValueError(f"{name}: blocks differ in heads / head_dim / width; not supported")
    num_prefix = int(getattr(model, "num_prefix_tokens", 1 if getattr(model, "cls_token", None) is not None else 0))
    if grid is None:
        gs = getattr(getattr(model, "patch_embed", None), "grid_size", None)
        grid_t = (int(gs[0]), int(gs[1])) if gs is not None and len(gs) == 2 else None
    else:
        if len(grid) != 2 or min(grid) < 1:
            raise ValueError(f"grid must be (H, W) with positive ints, got {grid!r}")
        grid_t = (int(grid[0]), int(grid[1]))
    pos = getattr(model, "pos_embed", None)
    pos_name, rows = None, None
    if isinstance(pos, torch.Tensor):
        pos_name = "pos_embed"
    if need_pos_embed:
        if pos_name is None:
            raise ValueError(
                f"{name} has no absolute position embedding (`pos_embed` is None / pos_embed='none'); impulse init "
                "uses it as the pseudo-input"
            )
        if grid_t is None:
            raise ValueError(f"{name}: unknown token grid (no `patch_embed.grid_size`); pass the option grid=(H, W)")
        if pos.dim() != 3 or pos.shape[0] != 1 or pos.shape[2] != dim:
            raise ValueError(f"{name}.pos_embed must be (1, L, {dim}), got {tuple(pos.shape)}")
        n = grid_t[0] * grid_t[1]
        embed_prefix = 0 if getattr(model, "no_embed_class", False) else num_prefix
        if pos.shape[1] != n + embed_prefix:
            raise ValueError(
                f"{name}.pos_embed has {pos.shape[1]} rows, expected {n} patch tokens of the {grid_t[0]}x{grid_t[1]} "
                f"grid + {embed_prefix} prefix rows"
            )
        rows = slice(embed_prefix, embed_prefix + n)
    return VitLayout(name, names, attns, dim, h, d, grid_t, pos_name, rows, num_prefix)


IMPULSE_DEFAULTS: dict[str, Any] = {
    "kernel_size": 3,
    "offsets": "fixed",
    "replacement": True,
    "offsets_per_layer": False,
    "boundary": "zero",
    "gain_pos": 18.0,
    "gain_qk": 7.0,
    "gain_v": 1.0,
    "value": "mimetic",
    "value_alpha": 0.4,
    "value_beta": 0.4,
    "on_value": 1000.0,
    "noise_scale": 3.0,
    "noise_std": 0.6,
    "noise_clip": 2.0,
    "rank_rtol": 1e-5,
    "qk_normalize": "frobenius",
    "target_logit": 10.0,
    "base": "torch",
    "grid": None,
}
"""Defaults of ``impulse`` = the released algorithm (``docs/method.md`` §2); see ``impulsevit/init/README.md``."""

MIMETIC_DEFAULTS: dict[str, Any] = {
    "qk_alpha": 0.7,
    "qk_beta": 0.7,
    "value": "mimetic",
    "value_alpha": 0.4,
    "value_beta": 0.4,
    "value_layout": "released",
    "base": "torch",
}
"""Defaults of ``mimetic`` (``docs/method.md`` §5.1)."""

_CHOICES = {
    "offsets": ("fixed", "random"),
    "boundary": ("zero", "circular"),
    "value": ("mimetic", "default"),
    "value_layout": ("row", "released"),
    "qk_normalize": ("frobenius", "logit"),
    "base": ("torch", "keep"),
    "kernel_size": (3, 5),
}


def _validate(method: str, opts: dict[str, Any], defaults: dict[str, Any]) -> None:
    for key, value in opts.items():
        if key == "grid":
            continue
        expected = type(defaults[key])
        ok = isinstance(value, expected) or (expected is float and isinstance(value, int))
        if isinstance(value, bool) and expected is not bool:
            ok = False
        if not ok:
            raise TypeError(f"option {key!r} of init method {method!r} must be {expected.__name__}, got {value!r}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ValueError(f"option {key!r} of init method {method!r} must be one of {_CHOICES[key]}, got {value!r}")
        if expected is float and float(value) < 0:
            raise ValueError(f"option {key!r} of init method {method!r} must be >= 0, got {value!r}")


def patch_pseudo_input(pos_embed: torch.Tensor, rows: slice, eps: float = 1e-5) -> torch.Tensor:
    """``P = LN0(pe)``: the patch rows of a ``(1, L, D)`` position embedding, layer-normed, float64 ``(N, D)``."""
    return imp.layer_norm_rows(pos_embed[0, rows].to(torch.float64), eps)


def _base_values(model: nn.Module, g: torch.Generator, base: str, skip: set[str]) -> tuple[dict[str, Value], list]:
    if base == "keep":
        return {}, []
    return torch_default_fills(model, g, skip=skip)


def _current(model: nn.Module, values: dict[str, Value], name: str) -> torch.Tensor:
    if name in values:
        values[name] = as_tensor(values[name])
        return values[name]
    return read_full(model.get_parameter(name)).detach().float().cpu()


def _check_value_width(lay: VitLayout) -> None:
    if lay.num_heads * lay.head_dim != lay.dim:
        raise ValueError(
            f"{lay.model}: attention width {lay.num_heads * lay.head_dim} != embed dim {lay.dim}; the mimetic "
            "value/proj needs them equal (use value='default')"
        )


def _value_proj(c: torch.Tensor, gain: float) -> tuple[torch.Tensor, torch.Tensor]:
    # float32 factorisation: the product is stored in float32 anyway (error ~1e-6), at half the cost of float64
    wv, wp = imp.value_proj_from(c.float(), dtype=torch.float32)
    return gain * wv, gain * wp


_T = TypeVar("_T")
Submit = Callable[[Callable[[], Any]], Future[Any]]
"""``submit(task) -> Future``: starts a pure, generator-free task (see :func:`solver_threads`)."""


def _run_inline(task: Callable[[], _T]) -> Future[_T]:
    """Run ``task`` now, on this thread; its result or exception in a done ``Future`` (as from a worker)."""
    done: Future[_T] = Future()
    try:
        done.set_result(task())
    except BaseException as exc:  # re-raised by .result(), as from a worker
        done.set_exception(exc)
    return done


@contextlib.contextmanager
def solver_threads() -> Iterator[Submit]:
    """Worker threads for the solves: yields ``submit(task) -> Future``, which runs pure, generator-free tasks on
    ``torch.get_num_threads()`` worker threads while the caller keeps drawing random numbers on its own thread
    (LAPACK / BLAS release the GIL).

    Inside the ``with`` block torch uses one intra-op thread (the tasks are the parallelism, no oversubscription); the
    caller's setting is restored on exit, also on error. With one thread, tasks run at ``submit``, on the caller's
    thread. Results never depend on the thread count: every draw happens on the calling thread, in program order.
    """
    threads = torch.get_num_threads()
    # each worker sets its own intra-op count (OpenMP's is per thread: left at the default, every worker ran
    # BLAS/LAPACK on all cores and the impulse solve differed from run to run by ~1e-5)
    pool = ThreadPoolExecutor(threads, initializer=torch.set_num_threads, initargs=(1,)) if threads > 1 else None
    try:
        if pool is not None:
            torch.set_num_threads(1)
        yield pool.submit if pool is not None else _run_inline
    finally:
        try:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        finally:
            torch.set_num_threads(threads)


def _run_parallel(tasks: Sequence[Callable[[], _T]]) -> list[_T]:
    """All ``tasks`` on :func:`solver_threads`; results in task order."""
    with solver_threads() as submit:
        futures = [submit(t) for t in tasks]
        return [f.result() for f in futures]


@register("impulse", family="vit", matches=is_vit)
def impulse_vit(model: nn.Module, generator: torch.Generator, options: dict[str, Any]) -> InitResult:
    """Impulse init of a timm ViT (``docs/method.md`` §2 by default; options for §3 variants, see the README card).

    Order of random draws (all from ``generator``): ``torch`` baseline of every tensor not fully overwritten
    (``base='torch'``), random offsets (once, or per layer), then per layer: the target noise ``(h, N, N)``, then the
    value/proj matrix ``Z``.
    """
    opts = check_options("impulse", options, IMPULSE_DEFAULTS)
    _validate("impulse", opts, IMPULSE_DEFAULTS)
    lay = vit_layout(model, need_pos_embed=True, grid=opts["grid"])
    H, W = lay.grid
    n, d = H * W, lay.head_dim
    notes: list[str] = []
    if opts["kernel_size"] > min(H, W):
        raise ValueError(f"{lay.model}: kernel_size {opts['kernel_size']} larger than the {H}x{W} token grid")
    full = set()  # tensors overwritten entirely: the base init draws nothing for them
    if opts["value"] == "mimetic":
        full = {f"{a}.{w}.weight" for a in lay.attn_names for w in ("qkv", "proj")}
    values, base_notes = _base_values(model, generator, opts["base"], full)
    notes += base_notes

    pos_param = model.get_parameter(lay.pos_name)
    pos = _current(model, values, lay.pos_name)
    if pos_param.requires_grad:
        pos = pos * opts["gain_pos"]
    else:
        notes.append("pos_embed is frozen (a fixed table): used as is, gain_pos not applied")
    if not torch.isfinite(pos).all():
        raise ValueError(f"{lay.model}.pos_embed is not finite (uninitialized?); use base='torch'")
    pi = imp.factor_pseudo_input(patch_pseudo_input(pos, lay.patch_rows), d, rtol=opts["rank_rtol"])
    if pi.rank < d:
        if pi.numerical_rank >= n:  # full row rank, just fewer tokens than head dims: the released math, exactly
            notes.append(
                f"rank {pi.rank} < head_dim {d}: solved at rank {pi.rank} (N = {n} tokens; rows beyond stay 0)"
            )
        else:
            notes.append(
                f"rank-deficient pseudo-input (numerical rank {pi.numerical_rank} < min(N={n}, head_dim={d}) at rtol "
                f"{opts['rank_rtol']:g}, e.g. a sin-cos table): solved at rank {pi.rank}"
            )
    normalize = opts["qk_normalize"]
    if normalize == "frobenius" and pi.numerical_rank < min(n, d):
        notes.append(
            "the released Frobenius scale collapses the logits on a numerically rank-deficient pseudo-input (near-"
            "uniform attention); qk_normalize='logit' is the opt-in alternative (see the method card)"
        )
    if normalize == "logit":
        notes.append(f"Q/K scaled so the mean target logit is {opts['target_logit']:g} (not ‖W‖_F = gain_qk)")

    def draw_offsets() -> list[tuple[int, int]]:
        return imp.impulse_offsets(
            lay.num_heads, opts["kernel_size"], opts["offsets"], generator=generator, replacement=opts["replacement"]
        )

    mimetic_value = opts["value"] == "mimetic"
    if mimetic_value:
        _check_value_width(lay)
    def solve(li: int) -> imp.QKSolution:
        return imp.solve_qk(
            pi, H, W, per_layer[li], noises[li], d,
            on_value=opts["on_value"], noise_scale=opts["noise_scale"], boundary=opts["boundary"],
            gain=opts["gain_qk"], normalize=normalize, target_logit=opts["target_logit"], dtype=torch.float32,
        )  # fmt: skip

    # every random draw in the documented order on this thread; each layer's Q/K solve and V/proj eigensolve (pure
    # functions of its draws) start on the worker threads as soon as the layer is drawn
    shared = draw_offsets()
    per_layer: list[list[tuple[int, int]]] = []
    noises: list[torch.Tensor] = []
    redraw = opts["offsets_per_layer"] and opts["offsets"] == "random"
    with solver_threads() as submit:
        vp_futures, qk_futures = [], []
        for li in range(len(lay.attn_names)):
            per_layer.append(draw_offsets() if (redraw and li) else shared)
            noises.append(imp.draw_noise(lay.num_heads, n, generator, std=opts["noise_std"], clip=opts["noise_clip"]))
            if mimetic_value:
                c = imp.draw_value_matrix(lay.dim, generator, opts["value_alpha"], opts["value_beta"])
                vp_futures.append(submit(functools.partial(_value_proj, c, opts["gain_v"])))
            qk_futures.append(submit(functools.partial(solve, li)))
        vps = [f.result() for f in vp_futures]
        sols = [f.result() for f in qk_futures]

    # 3) assemble
    dim, ad = lay.dim, lay.num_heads * d
    for li, attn_name in enumerate(lay.attn_names):
        sol = sols[li]
        key = f"{attn_name}.qkv.weight"
        qkv = torch.empty(3 * ad, dim) if mimetic_value else _current(model, values, key).clone()
        qkv[:ad] = sol.wq.reshape(ad, dim)
        qkv[ad : 2 * ad] = sol.wk.reshape(ad, dim)
        if mimetic_value:
            wv, wp = vps[li]
            qkv[2 * ad :] = wv
            values[f"{attn_name}.proj.weight"] = wp
        values[key] = qkv
    values[lay.pos_name] = pos
    write_values(model, values)
    resolved = {**opts, "grid": [H, W], "rank": pi.rank, "qk_normalize_used": normalize}
    return InitResult(options=resolved, offsets=per_layer, notes=notes)


@register("mimetic", family="vit", matches=is_vit)
def mimetic_vit(model: nn.Module, generator: torch.Generator, options: dict[str, Any]) -> InitResult:
    """Mimetic init of a timm ViT (``docs/method.md`` §5.1): per head ``W_qᵀW_k`` = best rank-``d`` approx of
    ``α1 Z + β1 I``; per layer the balanced factors of ``C = α2 Z − β2 I`` written as the released mimetic mode
    writes them (``value_layout='released'``: untransposed, realising ``x ↦ x (R L)ᵀ``; it beat the row-convention
    ``x ↦ x C`` of ``value_layout='row'`` in training, see the README card). pos_embed is not scaled.

    Order of random draws: ``torch`` baseline (``base='torch'``), then per layer: the ``h`` Q/K matrices ``Z``, then
    the value/proj ``Z``.
    """
    opts = check_options("mimetic", options, MIMETIC_DEFAULTS)
    _validate("mimetic", opts, MIMETIC_DEFAULTS)
    lay = vit_layout(model, need_pos_embed=False)
    if lay.head_dim > lay.dim:
        raise ValueError(f"{lay.model}: head_dim {lay.head_dim} > embed dim {lay.dim}; mimetic Q/K not defined")
    full = set()  # tensors overwritten entirely: the base init draws nothing for them
    if opts["value"] == "mimetic":
        full = {f"{a}.{w}.weight" for a in lay.attn_names for w in ("qkv", "proj")}
    values, notes = _base_values(model, generator, opts["base"], full)
    ad, dim, h, d = lay.num_heads * lay.head_dim, lay.dim, lay.num_heads, lay.head_dim
    mimetic_value = opts["value"] == "mimetic"
    if mimetic_value:
        _check_value_width(lay)
    # draws on this thread (per layer: the h Q/K matrices, then the value matrix), then the factorisations in parallel
    qk_targets, cs = [], []
    for _ in lay.attn_names:
        qk_targets.append(imp.draw_mimetic_qk_targets(dim, h, generator, opts["qk_alpha"], opts["qk_beta"]))
        if mimetic_value:
            cs.append(imp.draw_value_matrix(dim, generator, opts["value_alpha"], opts["value_beta"]))

    def qk_task(a: torch.Tensor, i: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        # float32 eigensolve: the factors are stored in float32 anyway (best rank-d approximation to ~1e-6)
        return lambda: imp.balanced_factors(a[i].float(), rank=d, dtype=torch.float32)

    def vp_task(c: torch.Tensor) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        return lambda: _value_proj(c, 1.0)

    results = _run_parallel([qk_task(a, i) for a in qk_targets for i in range(h)] + [vp_task(c) for c in cs])
    for li, attn_name in enumerate(lay.attn_names):
        key = f"{attn_name}.qkv.weight"
        qkv = torch.empty(3 * ad, dim) if mimetic_value else _current(model, values, key).clone()
        for i in range(h):
            lf, rf = results[li * h + i]
            qkv[i * d : (i + 1) * d] = lf.T
            qkv[ad + i * d : ad + (i + 1) * d] = rf
        if mimetic_value:
            wv, wp = results[len(lay.attn_names) * h + li]
            if opts["value_layout"] == "released":  # the released mimetic mode writes the factors untransposed
                wv, wp = wv.T.contiguous(), wp.T.contiguous()
            qkv[2 * ad :] = wv
            values[f"{attn_name}.proj.weight"] = wp
        values[key] = qkv
    write_values(model, values)
    return InitResult(options=opts, notes=notes)
