"""Baseline initializers for any ``nn.Module``: ``torch`` (PyTorch constructor defaults) and ``timm`` (timm's own init).

Both decide every new value first (on CPU, from the given ``torch.Generator``) and then write with
:func:`write_values`, so a failure leaves the model untouched and FSDP2 ``DTensor`` parameters get the same full value
on every rank. Neither touches the global torch / numpy RNG state.

The ``torch`` baseline's i.i.d. tensors are :class:`~impulsevit.init.rng.RandomFill` specs (shape, distribution, a
62-bit seed drawn from the generator): :func:`write_values` generates them straight into the parameter memory, several
tensors at a time, from their own numpy ``SFC64`` streams — the bulk of a ViT's 86 M values costs one pass over memory
instead of a serial Mersenne-Twister draw, a fresh allocation and a copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from impulsevit._compat.timm import module_init_fn
from impulsevit._compat.torch import fan_in_and_fan_out, tensors_replaced
from impulsevit.init.api import InitResult, is_dtensor, read_full, register, write_full_
from impulsevit.init.options import NoOptions, as_dict
from impulsevit.init.rng import RandomFill, seed_from

__all__ = ["TimmOptions", "RandomFill", "torch_default_fills", "torch_defaults", "timm_defaults", "write_values",
           "base_values", "TOKEN_PARAMS"]

TOKEN_PARAMS = ("cls_token", "reg_token", "dist_token", "mask_token")
"""Prefix / mask token parameters: zero under the ``torch`` baseline (timm 1.0.22's ``weight_init='skip'`` value)."""

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_RUNNING_STATS_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LazyBatchNorm1d,
                       nn.LazyBatchNorm2d, nn.LazyBatchNorm3d, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
                       nn.LazyInstanceNorm1d, nn.LazyInstanceNorm2d, nn.LazyInstanceNorm3d)
"""torch's norms with (optional) running statistics: every ``torch.nn`` subclass of its private ``_NormBase``
(``tests/house/test_compat.py`` checks the list against the installed torch; quantized ``torch.ao`` norms are not
included)."""
_NORM = (nn.LayerNorm, nn.GroupNorm, *_RUNNING_STATS_NORM, nn.RMSNorm)


Value = torch.Tensor | RandomFill
"""A computed value: a tensor, or a :class:`RandomFill` generated when it is written."""


def as_tensor(value: Value) -> torch.Tensor:
    """``value`` as a tensor (materialises a :class:`RandomFill`)."""
    return value.materialize() if isinstance(value, RandomFill) else value


def _uniform(shape: torch.Size, bound: float, generator: torch.Generator) -> RandomFill:
    return RandomFill(tuple(shape), "uniform", float(bound), seed_from(generator))


def _fan_in(weight_shape: torch.Size) -> int:
    return fan_in_and_fan_out(weight_shape)[0]


def torch_default_fills(
    model: nn.Module, generator: torch.Generator, skip: set[str] | frozenset[str] = frozenset()
) -> tuple[dict[str, Value], list[str]]:
    """PyTorch constructor defaults for every parameter / buffer of ``model``, decided, not written.

    Rules (in ``named_modules`` order, each module's own tensors in declaration order; every random tensor takes one
    seed from ``generator`` and becomes a :class:`RandomFill`):
    ``Linear``/``Conv*``: weight and bias ``U(±1/√fan_in)`` (= ``kaiming_uniform_(a=√5)``); ``LayerNorm``/``GroupNorm``/
    ``BatchNorm``/``RMSNorm``: weight 1, bias 0 (BatchNorm running stats reset); ``Embedding``: ``N(0, 1)``; a
    learnable ``pos_embed``: ``N(0, 0.02²)`` (timm 1.0.22's constructor value); ``cls/reg/dist/mask`` tokens: 0. Any
    other module with ``reset_parameters`` is reset on a CPU copy under ``torch.random.fork_rng`` seeded from the
    generator. Tensors matching none of these (e.g. LayerScale ``gamma``, a frozen ``pos_embed`` table) are kept and
    listed in the notes.

    Args:
        skip: full parameter names not to compute (the caller overwrites them); no random numbers are drawn for them.

    Returns:
        ``({name: value}, notes)``: values are float32 tensors (constants, generic ``reset_parameters`` results) or
        :class:`RandomFill` specs; :func:`write_values` takes both, :func:`torch_defaults` materialises them.
    """
    values: dict[str, Value] = {}
    kept: list[str] = []
    seen: set[int] = set()
    for mod_name, mod in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        own = [(n, p) for n, p in mod.named_parameters(recurse=False, remove_duplicate=False) if id(p) not in seen]
        for _, p in own:
            seen.add(id(p))
        if not own and not isinstance(mod, _RUNNING_STATS_NORM):
            continue
        todo = [(n, p) for n, p in own if prefix + n not in skip]
        if isinstance(mod, (nn.Linear, *_CONV)):
            w = mod.weight
            bound = 1.0 / math.sqrt(_fan_in(w.shape)) if _fan_in(w.shape) > 0 else 0.0
            for n, p in todo:
                values[prefix + n] = _uniform(p.shape, bound, generator)
        elif isinstance(mod, _NORM):
            for n, p in todo:
                values[prefix + n] = torch.ones(p.shape) if n == "weight" else torch.zeros(p.shape)
            if isinstance(mod, _RUNNING_STATS_NORM) and mod.track_running_stats:
                for n, b in mod.named_buffers(recurse=False, remove_duplicate=False):
                    values[prefix + n] = torch.ones(b.shape) if n == "running_var" else torch.zeros_like(b)
        elif isinstance(mod, nn.Embedding):
            for n, p in todo:
                v = RandomFill(tuple(p.shape), "normal", 1.0, seed_from(generator))
                if mod.padding_idx is not None:
                    v = v.materialize()
                    v[mod.padding_idx] = 0
                values[prefix + n] = v
        else:
            generic = []
            for n, p in todo:
                if n == "pos_embed" and p.requires_grad:
                    values[prefix + n] = RandomFill(tuple(p.shape), "normal", 0.02, seed_from(generator))
                elif n in TOKEN_PARAMS:
                    values[prefix + n] = torch.zeros(p.shape)
                else:
                    generic.append((n, p))
            if generic and hasattr(mod, "reset_parameters") and mod is not model:
                seed = seed_from(generator)
                with _plain_cpu_tensors(mod) as tmp, torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    tmp.reset_parameters()
                    for n, _ in generic:
                        values[prefix + n] = tmp.get_parameter(n).detach().float().clone()
            else:
                kept.extend(prefix + n for n, _ in generic)
    notes = [f"torch baseline kept as constructed (no PyTorch default known): {', '.join(kept)}"] if kept else []
    return values, notes


def base_values(
    model: nn.Module, generator: torch.Generator, base: str, structured: set[str] | frozenset[str] = frozenset()
) -> tuple[dict[str, Value], list[str]]:
    """The ``base`` option of every structured initializer (:class:`~impulsevit.init.options.BaseOptions`), decided,
    not written: the values every tensor outside the structure starts from, and the init report's notes.

    ``base='torch'``: :func:`torch_default_fills` of the WHOLE model, drawn first from ``generator`` exactly as the
    ``torch`` method draws them (one seed per tensor, structured tensors included), then the ``structured`` names are
    dropped. So for the same seed every tensor the structure does not set is bit-identical to the ``torch`` method's
    (the paired comparison impulse vs torch differs only in the structure), and the generator is left in the same
    state whatever ``structured`` is. ``base='keep'``: no values (the model keeps its own init).

    Args:
        base: ``"torch"`` or ``"keep"``.
        structured: full tensor names the caller overwrites entirely (their base values are not returned).

    Returns:
        ``({name: value}, notes)``; the first note is the one line naming the base.
    """
    if base == "keep":
        return {}, ["base: keep (every tensor outside the structure keeps the model's own init)"]
    if base != "torch":
        raise ValueError(f"option 'base' must be one of ('torch', 'keep'), got {base!r}")
    values, notes = torch_default_fills(model, generator)
    for name in structured:
        values.pop(name, None)
    return values, ["base: torch (every tensor outside the structure at PyTorch's constructor init, the torch "
                    "method's values for this seed)", *notes]


def torch_defaults(
    model: nn.Module, generator: torch.Generator, skip: set[str] | frozenset[str] = frozenset()
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """:func:`torch_default_fills` with every value materialised as a float32 tensor (``({name: value}, notes)``)."""
    values, notes = torch_default_fills(model, generator, skip)
    return {k: as_tensor(v) for k, v in values.items()}, notes


@contextlib.contextmanager
def _plain_cpu_tensors(module: nn.Module) -> Iterator[nn.Module]:
    """Temporarily replace every parameter / buffer of ``module`` by a plain full CPU copy (gathers DTensors), so
    in-place init code can run on it without touching the real tensors; the originals are put back on exit, also
    on error. Works where ``copy.deepcopy`` does not (FSDP2 modules refuse it)."""
    with tensors_replaced(module, lambda t: read_full(t).detach().cpu().clone()) as tmp:
        yield tmp


def timm_defaults(model: nn.Module, generator: torch.Generator, mode: str = "") -> dict[str, torch.Tensor]:
    """timm's own init of ``model`` (its ``init_weights``), computed, not written.

    With every tensor temporarily swapped for a plain CPU copy, runs ``init_weights(mode=mode)`` (or
    ``init_weights()`` / ``apply(_init_weights)`` when that is what the model has) inside
    ``torch.random.fork_rng(devices=[])`` with ``torch.manual_seed`` drawn from ``generator``: the global RNG state is
    unchanged afterwards and the values are the same on every device and rank (FSDP2 shards included). A ViT built with
    ``weight_init='skip'`` remembers mode ``'reset'`` (PyTorch defaults only); ``mode=''`` forces timm's trunc-normal
    init instead.

    Raises:
        ValueError: the model has neither ``init_weights`` nor ``_init_weights``.
    """
    fn = getattr(model, "init_weights", None)
    if not callable(fn) and module_init_fn(model) is None:
        raise ValueError(
            f"init method 'timm' cannot be applied to {type(model).__name__}: it has no timm `init_weights` or "
            "`_init_weights` method (use method 'torch' for PyTorch defaults)"
        )
    seed = seed_from(generator)
    saved_mode = getattr(model, "weight_init_mode", None)
    with _plain_cpu_tensors(model) as tmp, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            if callable(getattr(tmp, "init_weights", None)):
                if saved_mode == "reset" and not mode:
                    tmp.weight_init_mode = ""
                if "mode" in inspect.signature(tmp.init_weights).parameters:
                    tmp.init_weights(mode=mode)
                else:
                    tmp.init_weights()
            else:
                tmp.apply(module_init_fn(tmp))
        finally:
            if saved_mode is not None:
                tmp.weight_init_mode = saved_mode
        out = {n: p.detach() for n, p in tmp.named_parameters()}
        out.update({n: b for n, b in tmp.named_buffers()})
    return out


def _fill_in_place(target: torch.Tensor, fill: RandomFill) -> None:
    data = target.data if isinstance(target, nn.Parameter) else target
    if data.device.type == "cpu" and data.dtype == torch.float32 and data.is_contiguous() and not is_dtensor(data):
        fill.fill_(data)
    else:
        write_full_(target, fill.materialize())


def write_values(model: nn.Module, values: Mapping[str, Value]) -> None:
    """Write ``{name: full value}`` into ``model``'s parameters / buffers (in place, DTensor-aware).

    Tensors are copied (cast to the target's dtype / device); :class:`RandomFill` values are generated straight into
    plain contiguous float32 CPU targets, up to ``torch.get_num_threads()`` at a time, and materialised first for
    anything else (other dtypes, GPU, ``DTensor`` shards).

    Raises:
        ValueError: a name that is not a parameter / buffer of ``model``, or a shape mismatch (checked for all names
            before anything is written).
    """
    tensors = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    for name, v in values.items():
        if name not in tensors:
            raise ValueError(f"{type(model).__name__} has no parameter or buffer {name!r}")
        if tuple(tensors[name].shape) != tuple(v.shape):
            raise ValueError(
                f"{type(model).__name__}.{name}: computed shape {tuple(v.shape)} != {tuple(tensors[name].shape)}"
            )
    fills = [(tensors[name], v) for name, v in values.items() if isinstance(v, RandomFill)]
    for name, v in values.items():
        if not isinstance(v, RandomFill):
            write_full_(tensors[name], v)
    fills.sort(key=lambda tf: -math.prod(tf[1].shape))
    workers = max(1, min(torch.get_num_threads(), len(fills)))
    if workers == 1:
        for t, f in fills:
            _fill_in_place(t, f)
    else:  # numpy releases the GIL while it generates: tensors fill in parallel, largest first
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(_fill_in_place, t, f) for t, f in fills]:
                future.result()


@dataclasses.dataclass(frozen=True)
class TimmOptions:
    """Options of ``timm``: ``mode``, the model's ``init_weights`` mode (``""`` = its default; ViT: ``"jax"``,
    ``"jax_nlhb"``, ``"moco"``)."""

    mode: str = ""


@register("torch", family="any", matches=lambda m: isinstance(m, nn.Module), options=NoOptions)
def _torch_any(model: nn.Module, generator: torch.Generator, options: NoOptions) -> InitResult:
    """The paper's "default" baseline: PyTorch constructor defaults (timm ``weight_init='skip'``), see
    :func:`torch_defaults`."""
    values, notes = torch_default_fills(model, generator)
    write_values(model, values)
    return InitResult(options={}, notes=notes)


@register("timm", family="any", matches=lambda m: isinstance(m, nn.Module), options=TimmOptions)
def _timm_any(model: nn.Module, generator: torch.Generator, options: TimmOptions) -> InitResult:
    """timm's own init (``init_weights``), seeded from the generator; see :func:`timm_defaults`."""
    values = timm_defaults(model, generator, mode=options.mode)
    write_values(model, values)
    return InitResult(options=as_dict(options))
