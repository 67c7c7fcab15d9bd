"""Lightning's checkpoint layout (see :mod:`impulsevit._compat`): the dictionary keys and file names of a Lightning
checkpoint that impulsevit reads but Lightning documents no accessor for. Plain dictionary and path reading: this
module imports neither Lightning nor anything of impulsevit, so the run checks (``run/preflight.py``), export and the
loaders (``tools/export.py``, ``safe_load.py``, ``training/checkpointing.py``) use it without importing Lightning.

An AST check cannot see a private layout (it is a string key, not a name), so each entry here is exercised on a
checkpoint the installed Lightning writes (``tests/house/test_compat.py``), and the layout is read nowhere else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["callback_state", "distributed_meta_file", "epochs_done"]

_DCP_META = "meta.pt"


def epochs_done(checkpoint: dict[str, Any]) -> int:
    """How many training epochs a checkpoint records as done: an epoch counts once its training batches were
    processed (the fit loop's epoch progress; validation may still be pending).

    Raises:
        KeyError / TypeError: the checkpoint has no fit-loop state (not a Lightning training checkpoint).

    Reaches: ``checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"]`` (the loops' private
        state)
    Checked on: lightning>=2.6,<2.7
    Waits for: a documented epoch counter in the checkpoint (the top-level ``epoch`` is the epoch being run).
    """
    return int(checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"])


def callback_state(checkpoint: dict[str, Any], callback: type | str) -> dict[str, Any] | None:
    """The state a callback of class ``callback`` (or of that class name) saved in a checkpoint, or None. A callback
    whose instances differ by arguments is keyed ``Name{...}``
    (:func:`impulsevit._compat.lightning.callback_state_key`); the first matching state is returned.

    Reaches: ``checkpoint["callbacks"]`` keyed by Lightning's ``Callback.state_key`` format (class qualname, then
        ``repr`` of the distinguishing arguments)
    Checked on: lightning>=2.6,<2.7
    Waits for: a public reader of a callback's state in a saved checkpoint.
    """
    name = callback if isinstance(callback, str) else callback.__qualname__
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if (key == name or str(key).startswith(name + "{")) and isinstance(state, dict):
            return state
    return None


def distributed_meta_file(folder: str | os.PathLike) -> Path:
    """The file of a distributed (DCP) checkpoint folder in which Lightning keeps everything but the tensors
    (hyperparameters, loop and callback states), written last by rank 0.

    Reaches: ``lightning.fabric.utilities.load._METADATA_FILENAME`` (``meta.pt``, the file's name as Lightning's
        strategies write and read it)
    Checked on: lightning>=2.6,<2.7
    Waits for: a public constant or loader for a distributed checkpoint's metadata.
    """
    return Path(folder) / _DCP_META
