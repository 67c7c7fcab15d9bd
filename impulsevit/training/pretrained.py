"""Start a run from weights: ``model.pretrained`` (timm's word for it), resolved to one local file, read safely and
loaded into the run's backbone with timm's own transfer machinery.

Sources (:func:`resolve_source`), tried in this order:

- ``hf-hub:ORG/NAME`` (``@REV`` optional): the repo's ``model.safetensors`` (else ``pytorch_model.bin``), fetched with
  ``huggingface_hub.hf_hub_download`` (endpoint ``HF_ENDPOINT``, cache and token as for timm);
- a run folder (one holding ``checkpoints/``): the checkpoint ``--resume auto`` would pick in it
  (:func:`~impulsevit.training.checkpointing.run_folder_checkpoint`), read as a checkpoint file is;
- ``local-dir:PATH`` or a folder path: a timm model folder (what ``impulsevit export`` writes, or timm's
  ``save_for_hf``): its ``model.safetensors`` (else ``pytorch_model.bin``);
- a file: ``.safetensors``, or a ``torch.save`` file (``.pth`` / ``.pt`` / ``.bin`` / ``.ckpt``: a plain state dict, a
  dict holding one under ``state_dict`` / ``model``, or an impulsevit / Lightning checkpoint, whose ``backbone.*``
  tensors are taken);
- a timm pretrained tag ``ARCH.TAG`` (``vit_base_patch16_224.augreg_in21k``): the file of timm's pretrained config,
  from its ``hf_hub_id`` (or timm's download cache for a URL-only entry).

Every file that can hold a pickle is read by :func:`impulsevit.safe_load.load_checkpoint` (one that would run code is
refused in one line unless ``--trust-checkpoint``); ``.safetensors`` files cannot run code and are read by
``safetensors``. The file's sha256 is recorded (:class:`WeightsSource`).

Loading (:func:`load_into`), as timm transfers a checkpoint to a new task: the backbone's own
``checkpoint_filter_fn`` (its module's; ViT: ``resample_abs_pos_embed`` of absolute position embeddings to the new
grid, patch-embedding resample, key remaps of other formats; Swin: relative-position tables resized), then timm's
``load_pretrained`` with the state dict as ``pretrained_cfg`` overlay, which drops the classifier when the class
count differs (the head keeps the fresh init; one line says so). Rotary embeddings (EVA, RoPE ViTs) are buffers
recomputed by the model for its own size, not loaded. Before loading, the filtered tensors are checked against the
model: a tensor missing, unexpected or of another shape (a wrong architecture, a relative table the family cannot
resize) is a :class:`~impulsevit.errors.ConfigError` naming the first ones (timm would load non-strictly when the
head changes and say nothing). Then the architecture the source records (:class:`SourceConfig`: an impulsevit
checkpoint's ``hyper_parameters``, a model folder's ``config.json``, a timm tag's ``pretrained_cfg``) is built on the
``meta`` device and compared with the model on the settings that keep every shape but change what the weights compute
(:func:`architecture_settings`, :func:`check_architecture`): a difference is a one-line ``ConfigError`` naming it, as a
resume's is. A source without a recorded architecture (a bare ``.safetensors`` / ``.pth``) is loaded unchecked, and its
init report says so (:data:`NOT_CHECKED`).

Not supported: sharded hub checkpoints (``model.safetensors.index.json``); checkpoints whose classifier is not the
model's ``pretrained_cfg['classifier']``; changing ``in_chans`` (timm's input-conv adaptation is left at 3 channels).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from impulsevit.errors import ConfigError
from impulsevit.init import InitReport
from impulsevit.safe_load import UntrustedFileError, load_checkpoint
from impulsevit.training.checkpointing import run_folder_checkpoint

__all__ = ["FROM_WEIGHTS", "NOT_CHECKED", "SourceConfig", "WeightsSource", "architecture_settings",
           "check_architecture", "check_fits", "freeze_backbone", "load_into", "read_state_dict", "reinit_parts",
           "reinit_targets", "resolve_source"]

FROM_WEIGHTS = "from weights"
"""The init method a run started from ``model.pretrained`` records (init report, ``run.json``, model card)."""

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_KEY = "model.pretrained"


@dataclass(frozen=True)
class SourceConfig:
    """The architecture a pretrained source records: timm model name and ``timm.create_model`` keyword arguments as
    it was built (``model_args``; ``{}``: the architecture's defaults), and where that was read (``origin``, for
    messages: ``config.json``, ``checkpoint hyper_parameters``, ``timm pretrained_cfg``)."""

    architecture: str
    model_args: dict[str, Any]
    origin: str


@dataclass
class WeightsSource:
    """A resolved ``model.pretrained``: what the user wrote (``spec``), its kind (``hf-hub``, ``folder``, ``run``,
    ``file``, ``timm``), the local weights file, its sha256 (hex), the source's class names and the architecture it
    records (``config``; None: it records none, as a bare ``.safetensors`` / ``.pth`` file) when it has them."""

    spec: str
    kind: str
    path: str
    sha256: str
    label_names: list[str] | None = field(default=None)
    config: SourceConfig | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _folder_file(folder: Path, spec: str) -> Path:
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise ConfigError(f"{_KEY} {spec!r}: the folder {folder} holds no {' or '.join(_WEIGHT_FILES)} (expected a timm "
                      f"model folder, as `impulsevit export` writes)")


def _folder_config(folder: Path) -> tuple[list[str] | None, SourceConfig | None]:
    """The class names and the architecture (``architecture``, ``model_args``) a timm model folder's ``config.json``
    records (timm's ``save_for_hf`` format); None for what it lacks (no file, not JSON, another library's config)."""
    import json

    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(cfg, dict):
        return None, None
    names = cfg.get("label_names") or (cfg.get("pretrained_cfg") or {}).get("label_names")
    arch, args = cfg.get("architecture"), cfg.get("model_args") or {}
    config = SourceConfig(arch, dict(args), "config.json") if isinstance(arch, str) and isinstance(args, dict) else None
    return (list(names) if isinstance(names, list) else None), config


@contextlib.contextmanager
def _quiet_hub() -> Iterator[None]:
    """Within the block, huggingface_hub logs errors only: its retries on an unreachable endpoint (two warning lines
    per retry, five retries) end in the one line :func:`resolve_source` raises, which says it all."""
    hub = logging.getLogger("huggingface_hub")
    level = hub.level
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(level)


def _hub_file(repo: str, spec: str) -> tuple[Path, Path | None]:
    """The weights file (and ``config.json`` when there) of hub repo ``ORG/NAME[@REV]``, downloaded to the cache."""
    from huggingface_hub import hf_hub_download

    repo_id, _, revision = repo.partition("@")
    last: Exception | None = None
    for name in _WEIGHT_FILES:
        try:
            path = Path(hf_hub_download(repo_id, name, revision=revision or None))
        except Exception as e:  # noqa: BLE001 - huggingface_hub / httpx raise many kinds: one line below
            last = e
            if type(e).__name__ in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
                continue
            break
        else:
            try:
                cfg = Path(hf_hub_download(repo_id, "config.json", revision=revision or None))
            except Exception:  # noqa: BLE001 - config.json is optional
                cfg = None
            return path, cfg
    from huggingface_hub import constants

    first = (str(last).strip().splitlines() or [type(last).__name__])[0]
    raise ConfigError(f"{_KEY} {spec!r}: cannot fetch {' or '.join(_WEIGHT_FILES)} of {repo_id} from "
                      f"{constants.ENDPOINT} ({type(last).__name__}: {first})")


def _timm_tag_config(spec: str) -> SourceConfig:
    """A timm tag's architecture: its ``pretrained_cfg['architecture']``, built with the architecture's defaults."""
    import timm

    cfg = timm.models.get_pretrained_cfg(spec, allow_unregistered=False)
    return SourceConfig(str(cfg.architecture or spec.split(".", 1)[0]), {}, "timm pretrained_cfg")


def _timm_tag_file(spec: str) -> Path | None:
    """The weights file of a timm pretrained tag ``ARCH.TAG`` (None when ``spec`` is not one)."""
    import timm

    if "." not in spec or "/" in spec:
        return None
    try:
        cfg = timm.models.get_pretrained_cfg(spec, allow_unregistered=False)
    except (RuntimeError, ValueError):
        return None
    if cfg is None or not spec.split(".", 1)[1]:
        return None
    if cfg.hf_hub_id:
        from huggingface_hub import hf_hub_download

        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else list(_WEIGHT_FILES)
        last: Exception | None = None
        for name in names:
            try:
                return Path(hf_hub_download(cfg.hf_hub_id, name))
            except Exception as e:  # noqa: BLE001 - see _hub_file
                last = e
        raise ConfigError(f"{_KEY} {spec!r}: cannot fetch timm's weights from the hub ({cfg.hf_hub_id}): "
                          f"{type(last).__name__}: {(str(last).strip().splitlines() or [''])[0]}")
    if cfg.url:
        from timm.models import download_cached_file

        try:
            return Path(download_cached_file(cfg.url))
        except Exception as e:  # noqa: BLE001 - urllib errors
            raise ConfigError(f"{_KEY} {spec!r}: cannot download {cfg.url}: {type(e).__name__}: {e}") from e
    raise ConfigError(f"{_KEY} {spec!r}: timm knows the tag but lists no weights file for it")


def resolve_source(spec: str) -> WeightsSource:
    """``model.pretrained`` → the local weights file (downloaded when remote) and its sha256 (see the module).

    Raises:
        ConfigError: nothing found under that name, a folder without weights, an unreachable hub (one line each).
    """
    spec = str(spec).strip()
    if not spec:
        raise ConfigError(f"{_KEY} is empty: give a checkpoint, an exported folder, hf-hub:ORG/NAME or ARCH.TAG")
    labels: list[str] | None = None
    config: SourceConfig | None = None
    if spec.startswith("hf-hub:"):
        with _quiet_hub():
            path, cfg = _hub_file(spec[len("hf-hub:"):], spec)
        kind = "hf-hub"
        labels, config = _folder_config(cfg.parent) if cfg is not None else (None, None)
    elif not spec.startswith("local-dir:") and (run := run_folder_checkpoint(Path(spec).expanduser())) is not None:
        path, kind = run, "run"  # a run folder: the checkpoint --resume auto would pick in it, read as a file is
    elif spec.startswith("local-dir:") or Path(spec).is_dir():
        folder = Path(spec[len("local-dir:"):] if spec.startswith("local-dir:") else spec).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"{_KEY} {spec!r}: {folder} is not a folder")
        path, kind = _folder_file(folder, spec), "folder"
        labels, config = _folder_config(folder)
    elif Path(spec).expanduser().is_file():
        path, kind = Path(spec).expanduser(), "file"  # a checkpoint's config is read with its tensors
    else:
        with _quiet_hub():
            found = _timm_tag_file(spec)
        if found is None:
            raise ConfigError(f"{_KEY} {spec!r}: no such file or folder, and not hf-hub:ORG/NAME nor a timm "
                              f"pretrained tag ARCH.TAG (timm.list_pretrained())")
        path, kind, config = found, "timm", _timm_tag_config(spec)
    return WeightsSource(spec=spec, kind=kind, path=str(path.absolute()), sha256=_sha256(path), label_names=labels,
                         config=config)


def _unwrap(obj: Any, path: str) -> dict[str, torch.Tensor]:
    """A state dict from what a ``torch.save`` file holds: a plain state dict, ``{"state_dict": ...}`` /
    ``{"model": ...}`` (timm / DeiT training checkpoints), or a Lightning checkpoint of ``ImageClassifier``
    (``backbone.*`` taken, the prefix removed)."""
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        inner = obj["state_dict"]
        backbone = {k[len("backbone."):]: v for k, v in inner.items() if k.startswith("backbone.")}
        return backbone or inner
    for key in ("model", "state_dict_ema", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            return obj[key]
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj
    raise ConfigError(f"{_KEY} {path}: holds no state dict (a {type(obj).__name__}; expected tensors by name, or a "
                      f"checkpoint with 'state_dict' / 'model')")


def _checkpoint_config(obj: Any) -> SourceConfig | None:
    """The architecture an impulsevit checkpoint's ``hyper_parameters`` record (``backbone``, ``backbone_kwargs`` and
    the linked ``img_size``, as :func:`impulsevit.training.backbone.timm_kwargs` gives them to timm); None for any
    other file."""
    from impulsevit.training.backbone import timm_kwargs

    hp = obj.get("hyper_parameters") if isinstance(obj, dict) else None
    if not isinstance(hp, dict) or not isinstance(hp.get("backbone"), str) or not isinstance(
            hp.get("backbone_kwargs") or {}, dict):
        return None
    try:
        args = timm_kwargs(hp["backbone"], hp.get("backbone_kwargs"), img_size=hp.get("img_size"))
    except ConfigError:
        return None
    return SourceConfig(hp["backbone"], args, "checkpoint hyper_parameters")


def read_state_dict(source: WeightsSource, trust: bool | None = None) -> dict[str, torch.Tensor]:
    """The tensors of ``source.path`` on CPU: ``safetensors`` for ``.safetensors``, else
    :func:`impulsevit.safe_load.load_checkpoint` (``trust`` as there). An impulsevit checkpoint's architecture (its
    ``hyper_parameters``) is recorded in ``source.config`` on the way.

    Raises:
        UntrustedFileError: the file would run code when loaded (nothing of it ran).
        ConfigError: the file cannot be read or holds no state dict (names it).
    """
    path = Path(source.path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        obj = load_checkpoint(path, trust=trust, what="weights file")
    except UntrustedFileError:
        raise
    except Exception as e:  # noqa: BLE001 - torch / safetensors raise many kinds on a damaged file
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{_KEY} {source.spec!r}: {path} cannot be read as weights ({type(e).__name__}: "
                          f"{first})") from e
    sd = _unwrap(obj, str(path))
    source.config = source.config or _checkpoint_config(obj)
    return {k.removeprefix("module."): v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def _filter_fn(backbone: str) -> Any:
    """The ``checkpoint_filter_fn`` of the module that defines timm model ``backbone`` (None when it has none)."""
    from timm.models import model_entrypoint

    module = sys.modules.get(model_entrypoint(backbone).__module__)
    return getattr(module, "checkpoint_filter_fn", None)


def _classifier_names(model: nn.Module) -> tuple[str, ...]:
    names = (getattr(model, "pretrained_cfg", None) or {}).get("classifier") or ()
    return (names,) if isinstance(names, str) else tuple(names)


def _first(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def check_fits(state: dict[str, torch.Tensor], model: nn.Module, backbone: str, spec: str,
               skip: tuple[str, ...] = ()) -> None:
    """Every tensor of ``model`` is in ``state`` with its shape, and ``state`` has nothing else (keys starting with
    one of ``skip`` aside: the classifier being replaced).

    Raises:
        ConfigError: one line naming the first missing / unexpected tensors or the first shape mismatch.
    """
    own = {k: v.shape for k, v in model.state_dict().items() if not k.startswith(skip)}
    given = {k: v.shape for k, v in state.items() if not k.startswith(skip)}
    missing = [k for k in own if k not in given]
    unexpected = [k for k in given if k not in own]
    shapes = [f"{k} {tuple(given[k])} vs {tuple(own[k])}" for k in own if k in given and given[k] != own[k]]
    if missing or unexpected:
        parts = ([f"missing {_first(missing)}"] if missing else []) + (
            [f"unexpected {_first(unexpected)}"] if unexpected else [])
        raise ConfigError(f"{_KEY} {spec!r} does not fit model.backbone {backbone!r}: {'; '.join(parts)} (weights of "
                          f"another architecture or size? model.backbone / model.backbone_kwargs must match the "
                          f"source's)")
    if shapes:
        raise ConfigError(f"{_KEY} {spec!r} does not fit model.backbone {backbone!r}: tensor {_first(shapes, 2)} "
                          f"(source vs model; timm's checkpoint_filter_fn for this family cannot resize it)")


NOT_CHECKED = "architecture not checked: the source records no config"
"""The init report's note (and ``run.json``'s ``pretrained.architecture``) for a source without a recorded config."""

_ROPE_SETTINGS = ("temperature", "in_pixels", "linear_bands", "grid_indexing", "rotate_half", "grid_type",
                  "normalize_coords", "ref_feat_shape", "max_res")
_ACTIVATION_MODULES = ("torch.nn.modules.activation", "timm.layers.activations", "timm.layers.activations_me")


def architecture_settings(model: nn.Module, head: bool = True) -> dict[str, Any]:
    """The settings of timm model ``model`` that change what its weights compute without changing a tensor's name or
    shape (the tensor check, :func:`check_fits`, cannot see them), read off the built modules so that two names of one
    architecture (``deit_tiny_patch16_224`` and ``vit_tiny_patch16_224``) or the architecture's defaults against the
    same values given as keyword arguments compare equal. Keys, each present when the model has it:

    - ``num_heads``: of every module with an integer ``num_heads`` (attention of ViT / DeiT / EVA / Swin / ...): one
      int when all agree, else the tuple in module order. At a fixed width the head count splits the same ``qkv``
      weights another way; the head dim follows from it (where it is set on its own, ``qkv``'s shape changes);
    - ``no_embed_class``: whether the position embedding leaves out the class token (ViT): timm's filter would
      silently resample a table of the other layout;
    - ``act_layer``: the activation layers' classes (``GELU``, ``GELU(approximate=tanh)``, ``QuickGELU``, ``SiLU``);
    - ``rope``: the rotary embedding's class and its frequency settings (``temperature``, grid and coordinate
      settings; not ``feat_shape``, which follows the image size);
    - ``global_pool`` (only with ``head``): timm treats it as part of the classifier (``reset_classifier(n,
      global_pool)``), so it is compared only when the source's classifier is kept.

    Not compared (legitimate differences, or seen by the tensor check): ``num_classes`` (a new head), ``img_size`` (the
    position embedding is resampled), training-only settings (``drop_path_rate``, ...), ``dynamic_img_size`` (which
    input sizes are accepted, not what is computed at one), and everything that adds, removes or reshapes a tensor:
    width, depth, ``class_token`` / ``reg_tokens``, ``pre_norm`` / ``fc_norm``, ``qk_norm``, ``qkv_bias``,
    ``init_values``, learned vs no position embedding, ``mlp_ratio``.
    """
    out: dict[str, Any] = {}
    heads = [int(m.num_heads) for m in model.modules() if isinstance(getattr(m, "num_heads", None), int)]
    if heads:
        out["num_heads"] = heads[0] if len(set(heads)) == 1 else tuple(heads)
    if isinstance(getattr(model, "no_embed_class", None), bool):
        out["no_embed_class"] = model.no_embed_class
    acts = []
    for m in model.modules():
        if type(m).__module__ in _ACTIVATION_MODULES:
            approx = getattr(m, "approximate", "none")
            acts.append(type(m).__name__ + (f"(approximate={approx})" if approx != "none" else ""))
    if acts:
        out["act_layer"] = acts[0] if len(set(acts)) == 1 else tuple(sorted(set(acts)))
    rope = getattr(model, "rope", None)
    if isinstance(rope, nn.Module):
        out["rope"] = {"type": type(rope).__name__,
                       **{k: getattr(rope, k) for k in _ROPE_SETTINGS if hasattr(rope, k)}}
    if head and isinstance(getattr(model, "global_pool", None), str):
        out["global_pool"] = model.global_pool
    return out


def _source_model(config: SourceConfig) -> nn.Module:
    """The source's architecture as recorded, built on the ``meta`` device (no memory, no values), leaving the global
    random streams (torch CPU, ``random``, NumPy) as they were: the run's draws do not depend on the check."""
    import random

    import numpy as np
    import timm

    import impulsevit.models  # noqa: F401  (impulsevit's own architectures, e.g. ConvMixer, registered with timm)
    from impulsevit.training.backbone import TRAINING_ONLY_KWARGS

    args = {k: v for k, v in config.model_args.items() if k not in TRAINING_ONLY_KWARGS}
    states = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            return timm.create_model(config.architecture, **args)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])


def check_architecture(source: WeightsSource, model: nn.Module, keeps_head: bool) -> str:
    """Compare the settings :func:`architecture_settings` reads of the architecture ``source`` records (built on the
    ``meta`` device) with ``model``'s, as :func:`impulsevit.training.checkpointing.config_diff` compares a resumed
    checkpoint's; ``keeps_head``: the source's classifier is loaded (then ``global_pool`` is compared too). Returns
    what was done, for the init report: ``architecture checked against <origin> (<arch>)``, :data:`NOT_CHECKED`, or
    why the recorded architecture could not be built (then it is not checked either).

    Raises:
        ConfigError: a setting differs: one line naming each (``num_heads: 2 in the source, 4 in the model``).
    """
    from impulsevit.training.checkpointing import config_diff

    config = source.config
    if config is None:
        return NOT_CHECKED
    try:
        theirs = architecture_settings(_source_model(config), head=keeps_head)
    except Exception as e:  # noqa: BLE001 - timm / a model's constructor raise many kinds for a config they reject
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return (f"architecture not checked: timm cannot build the source's {config.architecture!r} from its "
                f"{config.origin} ({type(e).__name__}: {first})")
    diff = config_diff(theirs, architecture_settings(model, head=keeps_head), then="in the source", now="in the model")
    if diff:
        raise ConfigError(f"{_KEY}={source.spec}: {'; '.join(diff)} (same tensor shapes, but the weights would "
                          f"compute something else; the source's {config.origin}: {config.architecture}) — set"
                          f" model.backbone / model.backbone_kwargs to the source's, or start from "
                          f"other weights")
    return f"architecture checked against the source's {config.origin} ({config.architecture})"


def load_into(model: nn.Module, backbone: str, source: WeightsSource, state: dict[str, torch.Tensor],
              say: bool = True) -> InitReport:
    """Load ``state`` (from ``source``) into timm model ``model`` (built as ``timm.create_model(backbone, ...)``) as
    the module docstring says; returns the :class:`~impulsevit.init.InitReport` of method :data:`FROM_WEIGHTS`
    (options: source, kind, sha256, what was adapted). ``say``: print the adaptations, one line each, on stderr.

    Raises:
        ConfigError: the weights do not fit the model (:func:`check_fits`).
    """
    from timm.models import load_pretrained

    t0 = time.perf_counter()
    filter_fn = _filter_fn(backbone)
    try:
        filtered = filter_fn(dict(state), model) if filter_fn is not None else dict(state)
    except Exception as e:  # noqa: BLE001 - a filter fn meets a foreign layout: KeyError / RuntimeError / ...
        raise ConfigError(f"{_KEY} {source.spec!r} does not fit model.backbone {backbone!r}: timm's "
                          f"checkpoint_filter_fn failed ({type(e).__name__}: {e})") from e
    heads = _classifier_names(model)
    num_classes = int(getattr(model, "num_classes", 0) or 0)
    src_classes = None
    for h in heads:
        w = filtered.get(f"{h}.weight")
        if w is not None:
            src_classes = int(w.shape[0])
    new_head = bool(heads) and src_classes != num_classes
    check_fits(filtered, model, backbone, source.spec, skip=tuple(f"{h}." for h in heads) if new_head else ())
    checked = check_architecture(source, model, keeps_head=not new_head)
    notes: list[str] = [] if checked.startswith("architecture checked") else [checked]
    if new_head:
        notes.append(f"new classifier head: {num_classes} classes (the source has "
                     f"{src_classes if src_classes is not None else 'no head'}); it keeps timm's init")
    for key, value in state.items():
        own = model.state_dict().get(key)
        if key.endswith("pos_embed") and own is not None and tuple(value.shape) != tuple(own.shape):
            notes.append(f"{key} resampled from {tuple(value.shape)} to {tuple(own.shape)} "
                         f"(timm resample_abs_pos_embed, new image size)")
    cfg = {**dict(getattr(model, "pretrained_cfg", None) or {}), "state_dict": filtered, "file": None, "url": None,
           "hf_hub_id": None, "source": None, "num_classes": src_classes if src_classes is not None else -1}
    load_pretrained(model, pretrained_cfg=cfg, num_classes=num_classes, filter_fn=None, strict=not new_head)
    if say:
        for note in notes:
            print(f"[impulsevit] {_KEY}: {note}", file=sys.stderr, flush=True)
    return InitReport(method=FROM_WEIGHTS, family="pretrained", model=type(model).__name__,
                      options={"source": source.spec, "kind": source.kind, "sha256": source.sha256,
                               "file": source.path, "architecture": checked},
                      offsets=[], seconds=time.perf_counter() - t0, notes=notes)


def reinit_targets(model: nn.Module, patterns: Sequence[str]) -> list[str]:
    """The tensor names (parameters and buffers) of ``model`` that ``model.reinit`` patterns select.

    A pattern names a module of ``model`` (``head``, ``blocks.11``, ``blocks.1*.attn``; ``fnmatch`` globs over
    ``model.named_modules()`` names); every tensor of a matched module and of its children is selected.

    Raises:
        ConfigError: a pattern that matches no module (named, with the model's top-level modules), or an empty one.
    """
    modules = [name for name, _ in model.named_modules() if name]
    chosen: set[str] = set()
    for pattern in patterns:
        pattern = str(pattern).strip()
        hits = [m for m in modules if fnmatch.fnmatchcase(m, pattern)] if pattern else []
        if not hits:
            top = [name for name, _ in model.named_children()]
            raise ConfigError(f"model.reinit: {pattern!r} matches no module of {type(model).__name__} (module names "
                              f"or globs, e.g. {', '.join(top[:8])})")
        chosen.update(hits)
    names = [n for n, _ in (*model.named_parameters(), *model.named_buffers())]
    return [n for n in names if any(n.startswith(m + ".") for m in chosen)]


def reinit_parts(model: nn.Module, patterns: Sequence[str], seed: int) -> str:
    """Put the tensors ``patterns`` select (:func:`reinit_targets`) back at PyTorch's constructor init: exactly the
    values the ``torch`` init method gives them with ``seed`` (one draw per tensor of the whole model, then only the
    selected ones written), so a re-initialised head is the same whatever was loaded. Returns the init report's note.

    Why only the constructor init: a structured init (``impulse``) solves over whole layers with the position
    embedding as input; applied to a part of a trained model it has no defined meaning (not supported).
    """
    from impulsevit.init.api import make_generator
    from impulsevit.init.baselines import torch_default_fills, write_values

    targets = set(reinit_targets(model, patterns))
    values, _ = torch_default_fills(model, make_generator(seed))
    write_values(model, {name: value for name, value in values.items() if name in targets})
    return (f"re-initialised {', '.join(patterns)} ({len(targets)} tensors) at PyTorch's constructor init "
            f"(the torch method's values for seed {seed})")


def freeze_backbone(model: nn.Module) -> int:
    """Freeze every parameter of timm model ``model`` but its classifier (``model.get_classifier()``); returns the
    number of trainable parameters left. Dropout / drop path of the frozen blocks still follow train / eval mode.

    Raises:
        ConfigError: the model has no classifier to train (``num_classes`` 0).
    """
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    params = list(head.parameters()) if isinstance(head, nn.Module) else []
    if not params:
        raise ConfigError(f"model.freeze_backbone: {type(model).__name__} has no classifier with parameters to "
                          f"train (num_classes 0?)")
    model.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    return sum(p.numel() for p in params)
