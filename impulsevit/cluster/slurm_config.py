"""Per-user cluster defaults for ``impulsevit submit``: ``~/.config/impulsevit/slurm.yaml``.

The file is a YAML mapping whose keys are :class:`~impulsevit.cluster.sbatch.SlurmOptions` fields (dashes or
underscores) plus ``launcher``; command-line flags override it. Example::

    partition: gpu
    account: my-project
    gpus_per_node: 8
    cpus_per_task: 12
    mem: 0                 # all of the node's memory
    time: "2-00:00:00"
    signal_lead_s: 300
    setup: ["module load cuda/12.4", "source ~/venvs/impulsevit/bin/activate"]
    extra_sbatch: ["--mail-type=END"]

Location: ``$IMPULSEVIT_SLURM_CONFIG`` if set, else ``$XDG_CONFIG_HOME/impulsevit/slurm.yaml`` (``~/.config`` when
``XDG_CONFIG_HOME`` is unset). A missing file means no defaults; an unknown key or a wrong type raises ``ValueError``
naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from impulsevit.cluster.sbatch import SlurmOptions

_INT = {"nodes", "gpus_per_node", "tasks_per_node", "cpus_per_task", "signal_lead_s"}
_BOOL = {"exclusive"}
_LIST = {"setup", "extra_sbatch"}
_STR = {f.name for f in dataclasses.fields(SlurmOptions)} - _INT - _BOOL - _LIST | {"launcher"}
KEYS = _INT | _BOOL | _LIST | _STR


def config_path() -> Path:
    """Where the user's defaults are read from (see the module docstring)."""
    if os.environ.get("IMPULSEVIT_SLURM_CONFIG"):
        return Path(os.environ["IMPULSEVIT_SLURM_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "impulsevit" / "slurm.yaml"


def load_defaults(path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The validated defaults from ``path`` (default :func:`config_path`) as ``{field: value}``; ``{}`` if absent."""
    path = Path(path) if path is not None else config_path()
    if not path.exists():
        return {}
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from e
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of option: value, got {type(raw).__name__}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in KEYS:
            raise ValueError(f"{path}: unknown key {key!r}; expected one of {', '.join(sorted(KEYS))}")
        if value is None:
            continue
        if name in _INT:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{path}: {key} must be an integer, got {value!r}")
        elif name in _BOOL:
            if not isinstance(value, bool):
                raise ValueError(f"{path}: {key} must be true or false, got {value!r}")
        elif name in _LIST:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{path}: {key} must be a list of strings, got {value!r}")
            value = tuple(value)
        else:
            if isinstance(value, (dict, list, bool)):
                raise ValueError(f"{path}: {key} must be a string, got {value!r}")
            value = str(value)
        out[name] = value
    return out
