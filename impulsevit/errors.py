"""Errors a user fixes (a bad option, a run directory in use, a checkpoint that does not fit): ``impulsevit`` prints
them as one line and exits with :attr:`UserError.exit_status`, without a traceback (``--debug`` or
``IMPULSEVIT_DEBUG=1`` shows it). Everything else is a bug and keeps its traceback."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["OPTIONAL_EXTRAS", "ConfigError", "DataError", "MissingExtraError", "RunDirError", "StoreError",
           "TrainingDiverged", "UserError", "mismatch_text", "missing_extra", "state_dict_mismatch"]


class UserError(Exception):
    """Base of the user-fixable errors; exit status 1."""

    exit_status = 1


class ConfigError(UserError, ValueError):
    """The configuration cannot work (found before any work starts); exit status 2."""

    exit_status = 2


class RunDirError(UserError):
    """The run directory is in use by another process, or holds a run that would be overwritten; exit status 2."""

    exit_status = 2


class TrainingDiverged(UserError, FloatingPointError):
    """Training produced a non-finite loss, gradient or weight (:class:`~impulsevit.callbacks.NonFiniteLossGuard`);
    the message names the step and the last good checkpoint; exit status 1."""


class StoreError(UserError):
    """The object store holding the data cannot be used as configured (a missing bucket, missing or refused
    credentials, an unreachable endpoint, a shard that is not the size its manifest records); the message names the
    location and what to set. Exit status 2: found before training starts (a store that fails during training gives
    the same one line)."""

    exit_status = 2


class DataError(UserError):
    """The data cannot be read as configured, found while reading it (a file the dataset needs is missing, a folder
    holds no images, the files do not match the dataset); the message names the dataset and path. Exit status 1."""


def _first(keys: Sequence[str], shown: int = 3) -> str:
    return ", ".join(keys[:shown]) + (", ..." if len(keys) > shown else "")


def mismatch_text(missing: Sequence[str], unexpected: Sequence[str],
                  shapes: Sequence[tuple[str, Sequence[int], Sequence[int]]] = ()) -> str:
    """How a state dict differs from a model, in one phrase: ``N tensor(s) differ in shape (first: NAME: [theirs] in
    the weights, [ours] in the model); N tensor(s) missing from the weights (first: a, b, c, ...); N tensor(s)
    unexpected (first: ...)`` (the parts that apply, in that order; up to three names each, in the order given).
    ``shapes`` holds ``(name, shape in the weights, shape in the model)``. The one wording of every state-dict
    mismatch impulsevit reports (export, predict, resume, a pretrained source)."""
    parts = []
    if shapes:
        name, theirs, ours = shapes[0]
        parts.append(f"{len(shapes)} tensor(s) differ in shape (first: {name}: {list(theirs)} in the weights, "
                     f"{list(ours)} in the model)")
    if missing:
        parts.append(f"{len(missing)} tensor(s) missing from the weights (first: {_first(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensor(s) unexpected (first: {_first(unexpected)})")
    return "; ".join(parts)


OPTIONAL_EXTRAS: dict[str, str] = {"ffcv": "ffcv", "numba": "ffcv", "llvmlite": "ffcv", "cv2": "ffcv",
                                   "wandb": "wandb", "mlflow": "mlflow",
                                   "litdata": "litdata"}
"""Top-level module of an optional dependency -> the extra of setup.cfg that installs it (``impulsevit[EXTRA]``).
numba / llvmlite / OpenCV come with FFCV; the package imports without any of them."""


class MissingExtraError(ConfigError):
    """An optional dependency the command needs is not installed (:func:`missing_extra` words it: the package and
    the extra to install); exit status 2, like any command that cannot work as given."""


def missing_extra(module: str | None, needed_for: str = "") -> str | None:
    """``the 'numba' package is not installed (...): pip install 'impulsevit[ffcv]'`` when ``module`` (a dotted name,
    as ``ModuleNotFoundError.name`` gives it) belongs to an optional dependency of :data:`OPTIONAL_EXTRAS`; None for
    any other module (a required dependency or the user's own module: not a missing extra)."""
    top = (module or "").split(".", 1)[0]
    extra = OPTIONAL_EXTRAS.get(top)
    if extra is None:
        return None
    why = f", needed for {needed_for}" if needed_for else ""
    return f"the {top!r} package is not installed (part of the {extra} extra{why}): pip install 'impulsevit[{extra}]'"


_MISSING = re.compile(r"Missing key\(s\) in state_dict: (.*?)\.\s*$", re.M)
_UNEXPECTED = re.compile(r"Unexpected key\(s\) in state_dict: (.*?)\.\s*$", re.M)
_SHAPE = re.compile(r"size mismatch for ([^:]+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) from "
                    r"checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)")


def state_dict_mismatch(exc: BaseException) -> str | None:
    """``torch.nn.Module.load_state_dict``'s strict report (``Error(s) in loading state_dict for X: Missing key(s)
    ... size mismatch for ...``, often hundreds of lines) as one line naming the first tensors that differ; None for
    any other exception."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not text.startswith("Error(s) in loading state_dict for "):
        return None
    model = text.split("Error(s) in loading state_dict for ", 1)[1].split(":", 1)[0].strip()
    shapes = [(name, _dims(theirs), _dims(ours)) for name, theirs, ours in _SHAPE.findall(text)]
    keys = {}
    for what, pattern in (("missing", _MISSING), ("unexpected", _UNEXPECTED)):
        found = pattern.search(text)
        keys[what] = re.findall(r'"([^"]+)"', found.group(1)) if found else []
    detail = mismatch_text(keys["missing"], keys["unexpected"], shapes) or " ".join(text.split())[:300]
    return (f"the weights do not fit the model {model}: {detail} — build the model with the settings the weights "
            f"were trained with")


def _dims(text: str) -> list[int]:
    """``"3, 16"`` (inside torch's ``torch.Size([...])``) -> ``[3, 16]``."""
    return [int(d) for d in text.split(",") if d.strip()]
