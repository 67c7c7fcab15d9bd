"""``impulsevit export CKPT OUT.pth [--ema]``: a Lightning checkpoint of ``ImageClassifier`` → a plain timm state dict.

The output is the backbone's ``state_dict`` (``backbone.*`` keys with the prefix removed; ``ema.module.*`` with
``--ema``), saved with ``torch.save`` atomically, so that::

    timm.create_model(backbone, checkpoint_path="OUT.pth", num_classes=C, **backbone_kwargs)

loads it strictly (``backbone``, ``num_classes`` and ``backbone_kwargs`` are printed, read from the checkpoint's
hyperparameters). Accepts single-file checkpoints and FSDP2 distributed-checkpoint folders (converted with
``torch.distributed.checkpoint.format_utils.dcp_to_torch_save``). No optimizer state, no Lightning metadata.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from impulsevit.checkpointing import atomic_torch_save

__all__ = ["load_checkpoint_file", "backbone_state_dict", "export_checkpoint", "main"]


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint as one dict (``state_dict``, ``hyper_parameters``, ...), on CPU.

    A distributed-checkpoint folder (FSDP2) is converted to a single in-memory dict; its ``meta.pt`` supplies the
    hyperparameters.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: ``path`` is not a Lightning checkpoint (no ``state_dict``).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            merged = Path(tmp) / "merged.pt"
            dcp_to_torch_save(path, merged)
            ckpt = torch.load(merged, map_location="cpu", weights_only=True)
        meta = path / "meta.pt"
        if meta.is_file():
            ckpt = {**torch.load(meta, map_location="cpu", weights_only=True), **ckpt}
    else:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
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


def export_checkpoint(ckpt_path: str | os.PathLike, out_path: str | os.PathLike, ema: bool = False) -> dict[str, Any]:
    """Write the plain timm state dict of ``ckpt_path`` to ``out_path`` (atomically).

    Returns ``{"backbone", "num_classes", "backbone_kwargs", "tensors", "params"}`` (what ``timm.create_model`` needs
    to load it; ``backbone``/``backbone_kwargs`` are ``None``/``{}`` when the checkpoint has no hyperparameters).
    """
    ckpt = load_checkpoint_file(ckpt_path)
    state = backbone_state_dict(ckpt, ema=ema)
    atomic_torch_save(state, out_path)
    hp = ckpt.get("hyper_parameters") or {}
    head = state.get("head.weight")
    return {
        "backbone": hp.get("backbone"),
        "num_classes": int(head.shape[0]) if head is not None else hp.get("num_classes"),
        "backbone_kwargs": dict(hp.get("backbone_kwargs") or {}),
        "tensors": len(state),
        "params": int(sum(v.numel() for v in state.values())),
    }


def main(argv: list[str] | None = None) -> int:
    """``impulsevit export CKPT OUT.pth [--ema]``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="impulsevit export", description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", help="Lightning checkpoint file or FSDP2 checkpoint folder")
    parser.add_argument("out", help="output .pth (a plain state dict)")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights instead of the raw ones")
    args = parser.parse_args(argv)
    try:
        info = export_checkpoint(args.ckpt, args.out, ema=args.ema)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"impulsevit export: error: {e}", file=sys.stderr)
        return 2
    kwargs = "".join(f", {k}={v!r}" for k, v in info["backbone_kwargs"].items())
    print(f"wrote {info['tensors']} tensors ({info['params']:,} parameters) to {args.out}\n"
          f"load with: timm.create_model({info['backbone']!r}, num_classes={info['num_classes']}{kwargs}, "
          f"checkpoint_path={args.out!r})")
    return 0
