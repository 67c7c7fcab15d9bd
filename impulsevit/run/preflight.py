"""Checks that run before any data preparation or write, so a configuration that cannot work fails in seconds with one
line (:class:`~impulsevit.errors.ConfigError`) instead of after a conversion, or with a traceback mid-run.

- :func:`check_classes`: the data has at least 2 classes.
- :func:`check_epochs`: ``fit``'s ``trainer.max_epochs`` is at least 1, or -1 with a finite ``max_steps``.
- :func:`check_init`: a builtin init method (which :func:`impulsevit.init.check_init_method` found to resolve,
  before any class was built) applies to the backbone:
  the registry's family match, then — for backbones up to ``META_DRY_RUN_PARAMS`` parameters — a dry run of the
  initializer on a copy built on the ``meta`` device (no memory, no values), which also
  catches method-specific limits (e.g. a kernel larger than the token grid). Larger backbones get the family check
  only; their remaining limits surface when the init runs at the start of fitting.
- :func:`check_resume`: a checkpoint matches the model (keys and shapes, and the model settings that define its
  function: the backbone, its keyword arguments and the class count, so ``num_heads`` 2 -> 4 with the same tensor
  shapes is refused too); a mismatch names the model settings that differ between the checkpoint's hyperparameters
  and the current ones (``backbone_kwargs.embed_dim: 32 in the checkpoint, 64 now``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from impulsevit._compat.checkpoint import epochs_done
from impulsevit.errors import ConfigError
from impulsevit.safe_load import UntrustedFileError, check_distributed_checkpoint, load_checkpoint
from impulsevit.training.backbone import TRAINING_ONLY_KWARGS
from impulsevit.training.checkpointing import config_diff, shapes_mismatch

__all__ = ["META_DRY_RUN_PARAMS", "check_classes", "check_epochs", "check_init", "check_resume", "config_diff"]

META_DRY_RUN_PARAMS = 30_000_000


def check_classes(num_classes: int | None, where: str) -> None:
    """Raise :class:`ConfigError` when ``num_classes`` (of the data described by ``where``) is below 2."""
    if num_classes is not None and int(num_classes) < 2:
        raise ConfigError(f"the data ({where}) has {num_classes} class(es); classification needs at least 2 — check "
                          f"data.root / the class folders")


def check_epochs(max_epochs: int | None, max_steps: int | None) -> None:
    """Raise :class:`ConfigError` unless ``trainer.max_epochs`` is None (Lightning's default), ``>= 1``, or ``-1``
    (Lightning: no epoch limit) together with ``trainer.max_steps >= 1``: the lr schedule is planned over a finite
    number of optimizer steps (:func:`impulsevit.training.optim.lr_plan`), so a run without any limit is not supported
    (set ``max_steps``; ``max_time`` alone does not give a plan)."""
    if max_epochs is None:
        return
    steps = -1 if max_steps is None else int(max_steps)
    if int(max_epochs) == -1:
        if steps < 1:
            raise ConfigError("trainer.max_epochs=-1 means no epoch limit (Lightning), but the lr schedule needs a "
                              "finite plan: set trainer.max_steps too, or give trainer.max_epochs >= 1")
        return
    if int(max_epochs) < 1:
        raise ConfigError(f"trainer.max_epochs must be >= 1 (or -1: no epoch limit, with trainer.max_steps), got "
                          f"{max_epochs}")


def check_init(build_backbone: Any, backbone_name: str, method: str, options: dict[str, Any], seed: int) -> None:
    """Fail when the built-in ``method`` does not apply to the backbone ``build_backbone()`` builds, or its options
    do not fit the options schema of the handler that would run (:func:`impulsevit.init.api.check_options_for`).

    ``method`` was checked to resolve already (:func:`impulsevit.init.check_init_method`, before any class was
    built); a plugin is not dry-run (it runs on the real model only). ``build_backbone`` is called under
    ``torch.device("meta")``. Errors of the initializer other than ``ValueError`` / ``TypeError`` (an operation the
    meta device lacks) are not the configuration's fault and are ignored here.
    """
    from impulsevit.init.registry import methods

    if method not in methods():
        return
    import random

    import numpy as np

    states = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):  # the check must not shift the run's random streams
        try:
            _check_init_on_meta(build_backbone, backbone_name, method, options, seed)
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])


def _check_init_on_meta(build_backbone: Any, backbone_name: str, method: str, options: dict[str, Any],
                        seed: int) -> None:
    from impulsevit.init import initialize

    with torch.device("meta"):
        model: nn.Module = build_backbone()
    n_params = sum(p.numel() for p in model.parameters())
    from impulsevit.init.registry import methods, supports

    families = methods().get(method)
    if families and not supports(model, method):
        raise ConfigError(f"init method {method!r} does not apply to backbone {backbone_name!r} "
                          f"({type(model).__name__}); it supports the families {families} — choose another "
                          f"model.init.method (impulsevit/init/README.md lists which fits which)")
    from impulsevit.init.api import check_options_for

    try:  # the handler's options schema, whatever the model's size (the one check: init/options.py)
        check_options_for(model, method, options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"model.init.options: {exc}") from exc
    if n_params > META_DRY_RUN_PARAMS:
        return
    from impulsevit.init.api import calibration_size

    wanted = calibration_size(model, method, options)
    calibration = None
    if wanted:  # a meta batch of the model's input size stands in for the images read at fit start
        size = getattr(getattr(model, "patch_embed", None), "img_size", None)
        if size is None:
            return
        calibration = torch.empty(wanted, getattr(model.patch_embed.proj, "in_channels", 3), *size, device="meta")
    try:
        initialize(model, method, generator=seed, calibration=calibration, **options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"init method {method!r} does not fit backbone {backbone_name!r}: {exc}") from exc
    except Exception:  # noqa: BLE001 - the meta device cannot run this method; it is checked when it runs
        return


_STRUCTURE_KEYS = ("backbone", "backbone_kwargs", "num_classes", "ema_decay")
_FUNCTION_KEYS = ("backbone", "backbone_kwargs", "num_classes")  # what the weights compute, beyond tensor shapes


def _model_settings(hparams: dict[str, Any], keys: tuple[str, ...] = _STRUCTURE_KEYS) -> dict[str, Any]:
    """``keys`` of ``hparams``, with ``backbone_kwargs`` as timm gets them (the linked ``img_size`` folded in, as
    :func:`impulsevit.training.backbone.timm_kwargs` does: a checkpoint from before the link, with
    ``backbone_kwargs.img_size``, compares equal to one with ``img_size``)."""
    from impulsevit.training.backbone import timm_kwargs

    out = {k: hparams.get(k) for k in keys if k in hparams}
    if "backbone_kwargs" in out or hparams.get("img_size") is not None:
        out["backbone_kwargs"] = timm_kwargs(str(hparams.get("backbone") or ""), hparams.get("backbone_kwargs"),
                                             img_size=hparams.get("img_size"))
    return out


def _function_settings(hparams: dict[str, Any]) -> dict[str, Any]:
    out = _model_settings(hparams, _FUNCTION_KEYS)
    kwargs = dict(out.get("backbone_kwargs") or {})
    out["backbone_kwargs"] = {k: v for k, v in kwargs.items() if k not in TRAINING_ONLY_KWARGS}
    return out


def _settings_text(diff: list[str]) -> str:
    """The differing settings as the user sets them: timm's ``img_size`` comes from ``data.image_size`` (linked to
    ``model.img_size``), not from ``backbone_kwargs``, so it is named that way."""
    linked = "backbone_kwargs.img_size"
    return "; ".join("data.image_size (model.img_size)" + d[len(linked):] if d.startswith(linked) else f"model.{d}"
                     for d in diff)


def check_resume(path: str | os.PathLike, model: nn.Module, hparams: dict[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` when the checkpoint at ``path`` cannot be loaded into ``model``.

    Reads the checkpoint memory-mapped (tensors are not read) through :mod:`impulsevit.safe_load`: a file that would
    run code when loaded is refused (:class:`~impulsevit.safe_load.UntrustedFileError`, naming ``--trust-checkpoint``).
    Of a distributed checkpoint folder only that is checked (``.metadata``, the non-tensor entries, ``meta.pt``); its
    tensors are checked by torch.distributed.checkpoint. A file that does not load is named as truncated or not a
    checkpoint; differing keys or shapes are counted with one example, followed by the differing model settings
    (from the checkpoint's ``hyper_parameters`` vs ``hparams``).
    """
    path = Path(path)
    if path.is_dir():
        if not (path / ".metadata").is_file():
            raise ConfigError(f"--resume {path}: a folder, not a checkpoint (give a .ckpt file, or a distributed "
                              f"checkpoint folder holding a .metadata file)")
        try:
            check_distributed_checkpoint(path)
        except (OSError, ValueError) as exc:
            if isinstance(exc, UntrustedFileError):
                raise
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"--resume {path}: not a readable distributed checkpoint ({first})") from exc
        return
    try:
        ckpt = load_checkpoint(path, mmap=True)
    except UntrustedFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure means the file is not a usable checkpoint
        raise ConfigError(f"--resume {path}: not a readable checkpoint (truncated or another format: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ConfigError(f"--resume {path}: not a Lightning checkpoint (no state_dict)")
    theirs = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items() if hasattr(v, "shape")}
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    mismatch = shapes_mismatch(ours, theirs)
    saved = ckpt.get("hyper_parameters")
    if mismatch is None:
        if isinstance(saved, dict) and hparams is not None and all(k in saved for k in _FUNCTION_KEYS):
            diff = config_diff(_function_settings(saved), _function_settings(hparams))
            if diff:
                raise ConfigError(f"--resume {path} does not fit the model: same tensor shapes, but the model "
                                  "settings that define what it computes differ: " +
                                  _settings_text(diff) + " — resume with the checkpoint's settings, "
                                  "or start a new run (another --name)")
        return
    diff: list[str] = []
    if isinstance(saved, dict) and hparams is not None:
        diff = config_diff(_model_settings(saved), _model_settings(hparams))
    where = ("; the model settings differ: " + _settings_text(diff)) if diff else ""
    raise ConfigError(f"--resume {path} does not fit the model: {mismatch}{where} — resume with the "
                      f"checkpoint's settings, or start a new run (another --name)")


def check_resume_loader(path: str | os.PathLike, datamodule: Any) -> None:
    """Raise :class:`ConfigError` when ``fit`` resumes a checkpoint taken mid-epoch whose training-loader state was
    saved with another per-device batch size than ``datamodule.batch_size`` (the interrupted epoch's order cannot be
    continued; found here before any work, not when the loader is built). Other differences (sample count, seed) are
    checked when the loader is built (:meth:`~impulsevit.data.loading.sampling.LoaderState.check`). A folder
    (distributed
    checkpoint) or a checkpoint without a loader state passes."""
    path = Path(path)
    if path.is_dir() or not hasattr(datamodule, "batch_size"):
        return
    try:
        ckpt = load_checkpoint(path, mmap=True)
    except Exception:  # noqa: BLE001 - an unreadable file is check_resume's to report
        return
    state = (ckpt.get(type(datamodule).__qualname__) or {}).get("train_loader") if isinstance(ckpt, dict) else None
    if not isinstance(state, dict) or not state.get("batches"):
        return
    then, now = state.get("batch_size"), int(datamodule.batch_size)
    if then is not None and int(then) != now:
        raise ConfigError(f"--resume {path}: the checkpoint was taken {state['batches']} batches into epoch "
                          f"{state.get('epoch')} with data.batch_size {then}, this run has {now}; the interrupted "
                          f"epoch cannot continue in the same order: resume with data.init_args.batch_size={then}, or "
                          f"from a checkpoint taken at an epoch boundary")


def stored_step(path: str | os.PathLike) -> float:
    """The ``global_step`` a checkpoint file holds (read memory-mapped); ``inf`` when unknown (a distributed
    checkpoint folder, an unreadable file)."""
    path = Path(path)
    try:
        ckpt = load_checkpoint(path, mmap=True) if path.is_file() else None
        return float(ckpt["global_step"]) if isinstance(ckpt, dict) else float("inf")
    except Exception:  # noqa: BLE001 - unknown means "never take this run's files back"
        return float("inf")


def finished_run(path: str | os.PathLike, max_epochs: int | None, max_steps: int) -> str | None:
    """Why the checkpoint at ``path`` ends a run that ``max_epochs`` / ``max_steps`` would not continue (``"2 of
    max_epochs 2 epochs done"``), or None when training would go on (or it cannot tell: a folder, an unreadable
    file). An epoch counts as done once its training batches were processed (Lightning's ``epoch_progress``)."""
    path = Path(path)
    try:
        ckpt = load_checkpoint(path, mmap=True) if path.is_file() else None
        done = epochs_done(ckpt) if ckpt else None
        step = int(ckpt["global_step"]) if ckpt else None
    except Exception:  # noqa: BLE001 - unknown: let Lightning decide
        return None
    if done is None or step is None:
        return None
    if max_steps is not None and max_steps > 0 and step >= max_steps:
        return f"step {step} of max_steps {max_steps} done"
    if max_epochs is not None and max_epochs >= 0 and done >= max_epochs:
        return f"{done} of max_epochs {max_epochs} epochs done"
    return None
