"""Public entry point of the initializer library: ``initialize``, ``InitReport`` and the method registry.

An initializer is a pure function over ``(model, generator, options)``; it mutates parameters in place (``copy_`` on
``.data``) so optimizer references stay valid, draws every random number from the given ``torch.Generator`` (never
the global torch / numpy RNG), and validates everything it needs *before* writing anything, so a model it cannot
handle is left untouched.

Families register handlers per method, each with the frozen dataclass of its options::

    @register("impulse", family="vit", matches=is_vit, options=VitImpulseOptions)
    def _impulse_vit(model, generator, options: VitImpulseOptions) -> InitResult: ...

``initialize`` picks the first registered handler of ``method`` whose ``matches(model)`` is true. The registry itself
(``register``, ``methods``, ``supports``, :class:`InitResult`) lives in :mod:`impulsevit.init.registry`, below both this
module and :mod:`impulsevit.init.plugins`; it is re-exported here. A method from outside the package is registered the
same way, by a module the user imports (or names with ``--plugins``); the one lookup here is ``find``, and only a name
nothing registered goes on to the deprecated routes of :mod:`impulsevit.init.plugins` (removed in 0.3.0).

Parameters may be FSDP2 ``DTensor`` shards: handlers read with :func:`read_full` (the full tensor, identical on every
rank) and write with :func:`write_full_` (each rank copies its own shard of the full value). The caller must give every
rank a generator with the same seed.

A method may ask for a calibration batch of real images (impulse's ``pseudo_input='calibration'``): its options then
have a ``calibration_size()`` above 0 (:func:`calibration_size`), ``initialize`` takes the images as
``calibration=`` and the handler reads them with :func:`calibration_batch`; the result stays a pure function of
model, generator, options and images.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from impulsevit.init.options import parse_options
from impulsevit.init.plugins import resolve_method
from impulsevit.init.registry import InitResult, find, methods, register, supports

__all__ = [
    "InitReport",
    "InitResult",
    "initialize",
    "register",
    "methods",
    "read_full",
    "write_full_",
    "make_generator",
    "supports",
    "check_options_for",
    "calibration_size",
    "calibration_batch",
]

_CALIBRATION: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("calibration", default=None)


def calibration_batch() -> torch.Tensor | None:
    """The calibration images of the :func:`initialize` call running now (``(n, 3, H, W)`` float32, normalised as the
    model's inputs, CPU), or ``None``: for handlers whose options have a ``calibration_size()``."""
    return _CALIBRATION.get()


def _wanted_calibration(parsed: Any) -> int:
    size = getattr(parsed, "calibration_size", None)
    return int(size()) if callable(size) else 0


def calibration_size(model: nn.Module, method: str, options: Mapping[str, Any]) -> int:
    """How many calibration images ``initialize(model, method, **options)`` needs (0: none), from the method's
    parsed options; 0 also for a method name nothing registered (``initialize`` reports that)."""
    entry = find(method, model) if method in methods() else None
    if entry is None:
        return 0
    return _wanted_calibration(parse_options(entry.options, options, method=method, family=entry.family))


def _digest(images: torch.Tensor) -> str:
    """sha256 of the images' float32 bytes (C order): their identity in the report."""
    return hashlib.sha256(images.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


@dataclasses.dataclass
class InitReport:
    """Summary of one ``initialize`` call.

    Attributes:
        method: method name as registered (``impulse``, ``mimetic``, ``timm``, ``torch``, ``weight_selection``, ...).
        family: the model family adapter that handled it (``vit``, ``swin``, ``mixer``, ``convmixer``, ``any``).
        model: the model's class name.
        options: the fully resolved options (defaults filled in), JSON-serialisable.
        offsets: per layer, per head ``(dy, dx)``; ``dy > 0`` = down, ``dx > 0`` = right. Empty if not applicable.
        seconds: wall-clock time of the handler.
        notes: remarks from the handler.
    """

    method: str
    family: str
    model: str
    options: dict[str, Any]
    offsets: list[list[tuple[int, int]]]
    seconds: float
    notes: list[str]

    def table(self) -> str:
        """A small plain-text table: header line, options, then one row per layer with its heads' offsets."""
        lines = [f"init={self.method} family={self.family} model={self.model} ({self.seconds * 1000:.1f} ms)"]
        for key in sorted(self.options):
            lines.append(f"  {key:<22} {self.options[key]!r}")
        if self.offsets:
            lines.append("  layer  offsets per head (dy,dx)")
            for i, row in enumerate(self.offsets):
                lines.append(f"  {i:>5}  " + " ".join(f"({dy:+d},{dx:+d})" for dy, dx in row))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FAMILY_NEEDS: dict[str, str] = {
    "vit": "a top-level `blocks` whose blocks hold timm fused-qkv `attn` (ViT, DeiT, EVA, ...)",
    "swin": "timm SwinTransformer v1 (a `relative_position_bias_table` per block; v2's continuous bias has none)",
    "mixer": "timm MlpMixer",
    "convmixer": "timm ConvMixer",
}
"""What a model must be for each family adapter to match — quoted when no adapter of a method matches."""


def make_generator(seed: int | torch.Generator | None) -> torch.Generator:
    """A CPU ``torch.Generator``: passed through if already one, seeded with ``seed`` (default 0) otherwise."""
    if isinstance(seed, torch.Generator):
        return seed
    g = torch.Generator(device="cpu")
    g.manual_seed(0 if seed is None else int(seed))
    return g


def initialize(
    model: nn.Module,
    method: str,
    *,
    generator: torch.Generator | int | None = None,
    calibration: torch.Tensor | None = None,
    **options: Any,
) -> InitReport:
    """Initialize ``model`` in place with ``method``.

    Args:
        model: a bare timm model (or an FSDP2-sharded one). Not wrapped in DDP: pass ``ddp.module``.
        method: a registered method name (see :func:`methods`): a built-in one, or one a module you imported
            registered with ``@impulsevit.init.register``. Deprecated, removed in 0.3.0 (``DeprecationWarning``): an
            import path ``module:function`` or the name of a function entry point (:mod:`impulsevit.init.plugins`).
        generator: a CPU ``torch.Generator`` or an int seed; the only source of randomness. ``None`` means seed 0.
        calibration: real images ``(n, 3, H, W)`` (normalised as the model's inputs) for a method that asks for a
            calibration batch (impulse with ``pseudo_input='calibration'``; its first ``calibration_images`` are
            used); refused for any other. Their count, shape and sha256 go into the report's options.
        **options: method options (see each method's docstring / ``impulsevit/init/README.md``), checked against the
            handler's options schema (:func:`impulsevit.init.options.parse_options`) before anything is written.

    Returns:
        An :class:`InitReport`.

    Raises:
        ValueError: unknown method, a plugin that does not import / resolve, or the method's requirements are not
            met by this model (the message names the model class and what is missing; the model is left unmodified).
        TypeError: unknown (with the closest valid name) or mistyped option.
    """
    known = methods()
    if method not in known:
        resolve_method(method)  # deprecated routes: a function registered for any model (ValueError when none fits)
    entry = find(method, model)
    if entry is None:
        needs = "; ".join(f"{f}: {FAMILY_NEEDS[f]}" for f in known[method] if f in FAMILY_NEEDS)
        raise ValueError(
            f"init method {method!r} cannot be applied to {type(model).__name__}: it supports the families "
            f"{known[method]} ({needs}; applicability tables: impulsevit/init/README.md and "
            "impulsevit/init/FAMILIES.md)"
        )
    parsed = parse_options(entry.options, options, method=method, family=entry.family)
    wanted = _wanted_calibration(parsed)
    images = _check_calibration(calibration, wanted, method, type(model).__name__)
    gen = make_generator(generator)
    t0 = time.perf_counter()
    token = _CALIBRATION.set(images)
    try:
        with torch.no_grad():
            result = entry.handler(model, gen, parsed)
    finally:
        _CALIBRATION.reset(token)
    seconds = time.perf_counter() - t0
    resolved = dict(result.options)
    if images is not None and not images.is_meta:
        resolved["calibration"] = {"images": int(images.shape[0]), "shape": list(images.shape),
                                   "sha256": _digest(images)}
    return InitReport(
        method=method,
        family=entry.family,
        model=type(model).__name__,
        options=_jsonable(resolved),
        offsets=[[(int(dy), int(dx)) for dy, dx in row] for row in result.offsets],
        seconds=seconds,
        notes=list(result.notes),
    )


def _check_calibration(images: torch.Tensor | None, wanted: int, method: str, model: str) -> torch.Tensor | None:
    """The first ``wanted`` of ``images`` (float32, CPU), or ``None`` when the options want none.

    Raises:
        ValueError: images given that the options do not ask for, too few, none, or not ``(n, 3, H, W)`` finite.
    """
    if wanted == 0:
        if images is not None:
            raise ValueError(f"init method {method!r} on {model} takes no calibration batch with these options "
                             "(impulse takes one with pseudo_input='calibration')")
        return None
    if images is None:
        raise ValueError(f"init method {method!r} on {model} needs a calibration batch of {wanted} images "
                         "(initialize(..., calibration=images); the Initializer callback takes them from the training "
                         "data)")
    if images.dim() != 4 or images.shape[0] < wanted:
        raise ValueError(f"calibration batch for {method!r} on {model}: expected at least {wanted} images "
                         f"(n, C, H, W), got shape {tuple(images.shape)}")
    if images.is_meta:  # a dry run on the meta device (impulsevit.run.preflight)
        return images[:wanted]
    if not torch.isfinite(images).all():
        raise ValueError(f"calibration batch for {method!r} on {model}: the images are not all finite")
    return images[:wanted].detach().float().cpu()


def check_options_for(model: nn.Module, method: str, options: Mapping[str, Any]) -> None:
    """Check ``options`` against the options schema of the handler ``initialize`` would run for ``method`` on
    ``model`` (touches no weight; ``model`` may be on the meta device). A method that does not apply is not an error
    here (:func:`initialize` says so).

    Raises:
        TypeError, ValueError: as :func:`impulsevit.init.options.parse_options`.
    """
    entry = find(method, model)
    if entry is not None:
        parse_options(entry.options, options, method=method, family=entry.family)


def is_dtensor(t: torch.Tensor) -> bool:
    """Whether ``t`` (a tensor, or a parameter's ``.data``) is a ``DTensor`` (e.g. an FSDP2 shard)."""
    return hasattr(t, "device_mesh") and hasattr(t, "placements")


def read_full(t: torch.Tensor) -> torch.Tensor:
    """The full value of a parameter / buffer, as a plain tensor (gathers FSDP2 ``DTensor`` shards)."""
    t = t.data if isinstance(t, nn.Parameter) else t
    if hasattr(t, "full_tensor"):
        return t.full_tensor()
    return t


def write_full_(t: torch.Tensor, value: torch.Tensor) -> None:
    """Copy the full ``value`` into parameter ``t`` in place; for a ``DTensor`` each rank writes its own shard.

    ``value`` must have ``t``'s full (global) shape; it is cast to ``t``'s dtype and device. Every rank must pass the
    same ``value`` (the handlers compute it from the same generator): each rank then takes its own chunk of it locally
    (``distribute_tensor(..., src_data_rank=None)``, ``torch.chunk`` semantics as FSDP2 shards), with no collective —
    so writes may be issued from worker threads, in any order, on any number of ranks.
    """
    data = t.data if isinstance(t, nn.Parameter) else t
    if tuple(value.shape) != tuple(data.shape):
        raise ValueError(f"shape mismatch writing parameter: expected {tuple(data.shape)}, got {tuple(value.shape)}")
    if is_dtensor(data):
        from torch.distributed.tensor import distribute_tensor

        target = data.to_local()
        local = distribute_tensor(
            value.to(device=target.device, dtype=data.dtype), data.device_mesh, data.placements, src_data_rank=None
        ).to_local()
        target.copy_(local)
    else:
        data.copy_(value.to(device=data.device, dtype=data.dtype))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bool | int | float | str) or obj is None:
        return obj
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return obj.item()
    return repr(obj)
