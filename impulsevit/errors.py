"""Errors a user fixes (a bad option, a run directory in use, a checkpoint that does not fit): ``impulsevit`` prints
them as one line and exits with :attr:`UserError.exit_status`, without a traceback (``--debug`` or
``IMPULSEVIT_DEBUG=1`` shows it). Everything else is a bug and keeps its traceback."""

from __future__ import annotations

import re

__all__ = ["ConfigError", "DataError", "RunDirError", "StoreError", "TrainingDiverged", "UserError",
           "state_dict_mismatch"]


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
    parts = []
    shapes = _SHAPE.findall(text)
    if shapes:
        name, theirs, ours = shapes[0]
        parts.append(f"{len(shapes)} tensor(s) differ in shape (first: {name}: [{theirs}] in the weights, "
                     f"[{ours}] in the model)")
    for what, pattern in (("missing from the weights", _MISSING), ("unexpected", _UNEXPECTED)):
        found = pattern.search(text)
        keys = re.findall(r'"([^"]+)"', found.group(1)) if found else []
        if keys:
            shown = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
            parts.append(f"{len(keys)} tensor(s) {what} (first: {shown})")
    detail = "; ".join(parts) or " ".join(text.split())[:300]
    return (f"the weights do not fit the model {model}: {detail} — build the model with the settings the weights "
            f"were trained with")
