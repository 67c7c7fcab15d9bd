"""Typed init options: each registered handler declares a frozen dataclass of its options, and :func:`parse_options`
is the one place that checks a user's ``model.init.options`` against it.

A schema is a ``@dataclasses.dataclass(frozen=True)`` whose fields carry a type and a default; its ``__post_init__``
may check ranges (raising ``ValueError``). :func:`parse_options` checks, in this order and before any weight is
written:

1. unknown keys — ``TypeError`` naming them, the closest valid key (``did you mean 'gain_qk'?``) and the valid keys;
2. each value's type against the field's annotation: ``bool``, ``int``, ``float`` (an ``int`` is accepted), ``str``,
   ``None``, ``Literal[...]`` (a ``ValueError`` listing the choices), ``X | None``, ``list[...]`` / ``tuple[...]``
   (a YAML list is accepted for either) and ``Any`` — ``TypeError`` naming the option and the expected type;
3. the schema's own ``__post_init__`` range checks.

Every message is one line and names the method and family, e.g. ``option 'kernel_size' of init method 'impulse'
(vit) must be one of (3, 5), got 7``. Values are kept as given (an ``int`` stays an ``int`` in the report).

A plugin function ``fn(model, generator, *, scale: float = 1.0)`` gets its schema from its signature
(:func:`schema_from_signature`); one with ``**options`` takes any keys (:data:`OPEN`). Written by hand because no
library the project already depends on validates a dataclass from a plain mapping with these messages
(jsonargparse does, but only inside a parser, and the initializer library must run without it).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

__all__ = ["OPEN", "NoOptions", "BaseOptions", "OffsetOptions", "TargetMassOptions", "BiasImpulseOptions",
           "MimeticOptions", "parse_options", "schema_from_signature", "known_keys", "unknown_keys_message", "as_dict",
           "check_range"]


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The schema of a handler without options (``torch``)."""


@dataclasses.dataclass(frozen=True)
class BaseOptions:
    """The one ``base`` option of every structured initializer: what each parameter the structure does not set starts
    as. ``"torch"``: PyTorch's constructor init, drawn from the init generator exactly as the ``torch`` method draws it
    (so ``impulse`` with ``base='torch'`` and ``torch`` agree on every untouched tensor for the same seed: the paired
    comparison is like for like); ``"keep"``: the model's own init as built (timm's ``init_weights`` for timm models).
    Implemented once, :func:`impulsevit.init.baselines.base_values`; each family states its default and why."""

    base: Literal["torch", "keep"] = "torch"


@dataclasses.dataclass(frozen=True)
class OffsetOptions:
    """The options every one-tap construction shares: the kernel its offsets come from and how they are drawn.

    Attributes:
        kernel_size: 3 (the released offset order) or 5.
        offsets: ``"fixed"`` (the released order, cyclic over heads) or ``"random"`` (drawn from the generator).
    """

    kernel_size: Literal[3, 5] = 3
    offsets: Literal["fixed", "random"] = "fixed"


@dataclasses.dataclass(frozen=True)
class TargetMassOptions(BaseOptions, OffsetOptions):
    """One-tap constructions that set a bias (relative-position tables, rotary phases): ``target_mass``, the softmax
    share of the target key for an interior query when content is ignored, in (0, 1)."""

    target_mass: float = 0.75

    def __post_init__(self) -> None:
        check_range("target_mass", self.target_mass, 0.0, 1.0, open_low=True, open_high=True)


@dataclasses.dataclass(frozen=True)
class BiasImpulseOptions(TargetMassOptions):
    """``impulse`` on a relative-position bias (Swin v1; BEiT / relpos ViT / Swin v2 extend it): ``bias``, if
    given, the constant ``c`` of every block (a finite float; ``target_mass`` is then only reported)."""

    bias: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bias is not None and not math.isfinite(float(self.bias)):
            raise ValueError(f"option 'bias' must be a finite float, got {self.bias!r}")


@dataclasses.dataclass(frozen=True)
class MimeticOptions:
    """Mimetic Q/K per head and V/proj per block (ViT and Swin).

    Attributes:
        qk_alpha, qk_beta: ``W_qᵀ W_k ≈ qk_alpha·Z + qk_beta·I`` per head (>= 0).
        value: ``"mimetic"``: ``W_v W_o ≈ value_alpha·Z − value_beta·I`` per block; ``"default"``: V/proj untouched.
        value_alpha, value_beta: (>= 0).
    """

    qk_alpha: float = 0.7
    qk_beta: float = 0.7
    value: Literal["mimetic", "default"] = "mimetic"
    value_alpha: float = 0.4
    value_beta: float = 0.4

    def __post_init__(self) -> None:
        for name in ("qk_alpha", "qk_beta", "value_alpha", "value_beta"):
            check_range(name, getattr(self, name), 0.0)


def check_range(name: str, value: float | None, low: float | None = None, high: float | None = None, *,
                open_low: bool = False, open_high: bool = False) -> None:
    """``ValueError`` ``"NAME must be in (LOW, HIGH), got VALUE"`` unless ``low (<|<=) value (<|<=) high`` (``None``
    bounds are not checked; a ``None`` value passes; NaN never does). For schemas' ``__post_init__``."""
    if value is None:
        return
    v = float(value)
    ok = v == v and (low is None or (v > low if open_low else v >= low)) and \
        (high is None or (v < high if open_high else v <= high))
    if not ok:
        left = "(" if open_low else "["
        right = ")" if open_high else "]"
        if high is None:
            bound = f"{'>' if open_low else '>='} {low:g}"
        elif low is None:
            bound = f"{'<' if open_high else '<='} {high:g}"
        else:
            bound = f"in {left}{low:g}, {high:g}{right}"
        raise ValueError(f"option {name!r} must be {bound}, got {value!r}")


OPEN: Any = None
"""The schema of a handler that takes any keys (a plugin ``fn(model, generator, **options)``): the options reach it as
the mapping given, unchecked."""


def known_keys(schema: type | None) -> list[str] | None:
    """The option names of ``schema`` in declaration order (``None`` for :data:`OPEN`)."""
    if schema is None:
        return None
    return [f.name for f in dataclasses.fields(schema) if f.init]


def unknown_keys_message(given: Mapping[str, Any], valid: list[str], where: str) -> str | None:
    """``unknown option(s) [...] for init method ...; did you mean ...? valid: [...]`` or ``None`` when every key of
    ``given`` is in ``valid``."""
    unknown = sorted(set(given) - set(valid))
    if not unknown:
        return None
    hints = [(k, difflib.get_close_matches(k, valid, n=1, cutoff=0.6)) for k in unknown]
    close = [f"{best[0]!r}" + (f" for {k!r}" if len(unknown) > 1 else "") for k, best in hints if best]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"unknown option(s) {unknown} for init method {where}{hint}; valid: {sorted(valid)}"


def parse_options(schema: type | None, given: Mapping[str, Any], *, method: str, family: str) -> Any:
    """``given`` checked against ``schema`` (module docstring) and returned as a ``schema`` instance (the mapping as
    a ``dict`` for :data:`OPEN`).

    Raises:
        TypeError: an unknown key or a value of the wrong type (one line, with a hint for a misspelt key).
        ValueError: a value outside a ``Literal``'s choices or the schema's range checks (one line).
        ValueError: a required option (a field without default) missing.
    """
    where = f"{method!r} ({family})"
    if not isinstance(given, Mapping):
        raise TypeError(f"options of init method {where} must be a mapping of option names to values, got "
                        f"{type(given).__name__}")
    if schema is None:
        return dict(given)
    valid = known_keys(schema) or []
    message = unknown_keys_message(given, valid, where)
    if message:
        raise TypeError(message)
    hints = _type_hints(schema)
    for key, value in given.items():
        _check_value(value, hints.get(key, Any), f"option {key!r} of init method {where}")
    required = [f.name for f in dataclasses.fields(schema)
                if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    missing = [k for k in required if k not in given]
    if missing:
        raise ValueError(f"init method {where} needs the option(s) {missing}")
    try:
        return schema(**given)
    except (TypeError, ValueError) as e:
        text = " ".join(str(e).split())
        match = re.match(r"option ('\w+') (.*)", text)
        text = f"option {match[1]} of init method {where} {match[2]}" if match else f"init method {where}: {text}"
        raise type(e)(text) from None


def as_dict(options: Any) -> dict[str, Any]:
    """A parsed options object as a plain ``dict`` (field order) — what a handler reports as its resolved options."""
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    return dict(options)


def schema_from_signature(fn: Callable[..., Any], name: str) -> type | None:
    """The options schema of a plugin ``fn(model, generator, ...)``: one field per parameter after the first two
    (its annotation — ``Any`` when none or unresolvable — and its default; no default = required); :data:`OPEN`
    when ``fn`` takes ``**options`` or has no introspectable signature."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return OPEN
    params = list(sig.parameters.values())[2:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return OPEN
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a user's annotations that do not evaluate: checked as Any
        hints = {}
    fields: list[tuple[str, Any, Any]] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY):
            continue
        annotation = hints.get(p.name, Any)
        field = dataclasses.field() if p.default is p.empty else dataclasses.field(default=p.default)
        fields.append((p.name, annotation, field))
    safe = "".join(c if c.isalnum() else "_" for c in name)
    return dataclasses.make_dataclass(f"Options_{safe}", fields, frozen=True)


def _type_hints(schema: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - unresolvable annotations are checked as Any
        return {}


def _describe(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _check_value(value: Any, tp: Any, what: str) -> None:
    """Raise ``TypeError`` / ``ValueError`` when ``value`` is not of the annotated type ``tp`` (module docstring)."""
    if not _matches(value, tp):
        choices = _literal_choices(tp)
        if choices is not None and not isinstance(value, list | tuple | dict):
            raise ValueError(f"{what} must be one of {choices}, got {value!r}")
        raise TypeError(f"{what} must be {_describe(tp)}, got {value!r}")


def _literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The choices of a ``Literal`` (also inside ``X | None``), else ``None``."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            choices = _literal_choices(arg)
            if choices is not None:
                return choices
    return None


def _matches(value: Any, tp: Any) -> bool:
    if tp is Any or tp is object:
        return True
    if tp is type(None) or tp is None:
        return value is None
    origin = typing.get_origin(tp)
    if origin is Literal:
        return any(value == c and type(value) is type(c) for c in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(tp))
    if origin in (list, tuple, typing.Sequence, Mapping) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if origin is tuple and args and len(args) != len(value) and Ellipsis not in typing.get_args(tp):
            return False
        item = args[0] if len(set(map(str, args))) == 1 else Any
        return all(_matches(v, item) for v in value) if args else True
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True
