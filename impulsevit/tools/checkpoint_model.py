"""Reading a run's checkpoint into a timm model: :func:`load_checkpoint_file` (a Lightning ``.ckpt`` or an FSDP2
distributed-checkpoint folder, through :mod:`impulsevit.safe_load`), :func:`build_model` (the backbone the run built,
its weights or the EMA copy's loaded), :func:`data_config` (the run's evaluation transform in timm's terms) and
:func:`run_record`. Used by ``impulsevit predict`` (:mod:`impulsevit.tools.predict`) and by ``impulsevit export``
(:mod:`impulsevit.tools.export`, which writes folders, cards and hub pushes from what this reads). Writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from impulsevit._compat.checkpoint import callback_state
from impulsevit.safe_load import UntrustedFileError, load_checkpoint, load_distributed_checkpoint
from impulsevit.training.checkpointing import load_weights

__all__ = ["backbone_state_dict", "build_model", "data_config", "init_state", "load_checkpoint_file", "run_record",
           "timm_create_kwargs"]


def load_checkpoint_file(path: str | os.PathLike, trust: bool | None = None) -> dict[str, Any]:
    """The checkpoint as one dict (``state_dict``, ``hyper_parameters``, ``callbacks``, ...), on CPU, read through
    :mod:`impulsevit.safe_load` (``trust``: see :func:`impulsevit.safe_load.load_checkpoint`).

    A distributed-checkpoint folder (FSDP2) is converted to a single in-memory dict; its ``meta.pt`` supplies the
    hyperparameters and callback states.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        UntrustedFileError: the file (or the folder's metadata) would run code when loaded; nothing of it ran.
        ValueError: ``path`` cannot be read (truncated, corrupt, not a torch file) or is not a Lightning checkpoint
            (no ``state_dict``); the message names the file.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir() and not (path / ".metadata").is_file():
        raise ValueError(f"{path} is a folder but not a checkpoint (expected a .ckpt file, or a distributed "
                         f"checkpoint folder holding .metadata)")
    try:
        if path.is_dir():
            ckpt = load_distributed_checkpoint(path, trust=trust)
        else:
            ckpt = load_checkpoint(path, trust=trust)
    except UntrustedFileError:
        raise
    except Exception as e:  # noqa: BLE001 - torch.load raises RuntimeError / UnpicklingError / EOFError / ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"checkpoint {str(path)!r} cannot be read (truncated or not a torch checkpoint?): "
                         f"{first}") from e
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise ValueError(f"{str(path)!r} is not a Lightning checkpoint: it has no 'state_dict'")
    return ckpt


def backbone_state_dict(ckpt: dict[str, Any], ema: bool = False) -> dict[str, torch.Tensor]:
    """The backbone's (or with ``ema`` the EMA copy's) tensors from a checkpoint dict, prefix removed.

    Raises:
        KeyError: no tensors under the prefix (with ``ema``: the run had no EMA, ``model.ema_decay`` was null).
    """
    prefix = "ema.module." if ema else "backbone."
    out = {k[len(prefix):]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    if not out:
        what = "EMA weights (the run had model.ema_decay: null)" if ema else "backbone weights"
        found = sorted({k.split(".", 1)[0] for k in ckpt["state_dict"]})
        raise KeyError(f"checkpoint has no {what}: no '{prefix}*' keys (top-level keys: {found})")
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def run_record(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The ``RunRecord`` callback's state (:mod:`impulsevit.callbacks.run_record`), ``{}`` for older checkpoints."""
    return dict(callback_state(ckpt, "RunRecord") or {})


def init_state(ckpt: dict[str, Any]) -> dict[str, Any] | None:
    """The ``Initializer`` callback's state (its report), ``None`` when the checkpoint has none."""
    return callback_state(ckpt, "Initializer")


def data_config(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The run's evaluation transform in timm's terms (``input_size``, ``mean``, ``std``, ``interpolation``,
    ``crop_pct``, ``crop_mode``): the ``RunRecord``'s, else rebuilt from the datamodule's saved hyperparameters.

    Raises:
        ValueError: neither is in the checkpoint (names what is missing).
    """
    recorded = run_record(ckpt).get("data_config")
    if recorded:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()}
    dm = ckpt.get("datamodule_hyper_parameters") or {}
    if "dataset" in dm and "image_size" in dm:
        from impulsevit.data.sources.registry import get_dataset

        info = get_dataset(dm["dataset"])
        size = int(dm["image_size"])
        return {"input_size": (3, size, size), "mean": tuple(dm.get("mean") or info.mean),
                "std": tuple(dm.get("std") or info.std), "interpolation": dm.get("interpolation", "bicubic"),
                "crop_pct": float(dm.get("crop_pct", 0.875)), "crop_mode": "center"}
    raise ValueError("the checkpoint records no data config (no RunRecord state, no datamodule hyperparameters): "
                     "it predates impulsevit's run records; export it with --format state-dict")


def timm_create_kwargs(hp: dict[str, Any]) -> dict[str, Any]:
    """The ``timm.create_model`` keyword arguments (without ``num_classes``) of a checkpoint's hyperparameters: its
    ``backbone_kwargs`` with the linked ``img_size`` folded in (:func:`impulsevit.training.backbone.timm_kwargs`)."""
    from impulsevit.training.backbone import timm_kwargs

    if not hp.get("backbone"):
        return dict(hp.get("backbone_kwargs") or {})
    return timm_kwargs(hp["backbone"], hp.get("backbone_kwargs"), img_size=hp.get("img_size"))


def build_model(ckpt: dict[str, Any], ema: bool = False, source: str = "the checkpoint") -> nn.Module:
    """The timm backbone the run built (``timm.create_model(backbone, num_classes=..., **backbone_kwargs)``) with the
    checkpoint's (or EMA) weights loaded strictly (:func:`impulsevit.training.checkpointing.load_weights`), in eval
    mode, on CPU. ``source`` names the checkpoint in the error messages.

    Raises:
        KeyError: see :func:`backbone_state_dict`. ValueError: the checkpoint has no ``hyper_parameters`` or timm
            cannot build the model (names it). ConfigError: the weights do not fit the model timm built (one line
            naming ``source`` and the first tensors that differ).
    """
    import timm

    import impulsevit.models  # noqa: F401  (registers impulsevit's own architectures with timm)

    hp = ckpt.get("hyper_parameters") or {}
    if not hp.get("backbone"):
        raise ValueError("the checkpoint has no hyper_parameters.backbone: it was not written by ImageClassifier")
    state = backbone_state_dict(ckpt, ema=ema)
    kwargs = timm_create_kwargs(hp)
    head = state.get("head.weight")
    num_classes = hp.get("num_classes") or (int(head.shape[0]) if head is not None else None)
    if num_classes is not None:
        kwargs["num_classes"] = int(num_classes)
    try:
        model = timm.create_model(hp["backbone"], **kwargs)
    except (RuntimeError, TypeError, ValueError, AssertionError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"cannot rebuild timm model {hp['backbone']!r} with kwargs {kwargs} from {source}: "
                         f"{first}") from e
    load_weights(model, state, source=f"{source} ({'EMA' if ema else 'backbone'} weights)")
    return model.eval()
