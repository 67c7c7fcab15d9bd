"""``impulsevit export CKPT OUT [--ema] [--format folder|state-dict] [--overwrite] [--push-to-hub ORG/NAME]
[--trust-checkpoint]``.

A Lightning checkpoint of ``ImageClassifier`` (single file or FSDP2 distributed-checkpoint folder) becomes:

- ``--format folder`` (the default for any other ``OUT``): a timm model folder, written by timm's own
  ``save_for_hf``: ``config.json``
  (``architecture``, ``num_classes``, ``label_names`` = the dataset's class names, ``model_args`` = the backbone's
  kwargs as built, ``pretrained_cfg`` with the run's evaluation transform: ``input_size``, ``mean``, ``std``,
  ``interpolation``, ``crop_pct``), ``model.safetensors`` and ``README.md``, a model card rendered by timm's
  ``generate_readme`` (the hub's format) with the run's provenance: recipe and command, init method with its resolved
  options and report, seed, epochs, final metrics, dataset, training cost and versions (from the checkpoint's
  ``RunRecord`` and ``Initializer`` states and the run directory's ``config.yaml``). Loads with
  ``timm.create_model("local-dir:OUT", pretrained=True)`` (impulsevit's own architectures, e.g. ConvMixer, need
  ``import impulsevit.models`` first). ``OUT`` must not exist or be empty; a folder written by an earlier export is
  replaced only with ``--overwrite``; anything else is refused, untouched (:func:`impulsevit.io.claim_output`). The
  folder is written next to ``OUT`` under a temp name and renamed into place (:mod:`impulsevit.io`): an interrupted
  export leaves no half folder.
- ``--format state-dict`` (the default when ``OUT`` ends in ``.pth`` or ``.pt``): the backbone's plain ``state_dict``
  (``torch.save``, atomic; an existing ``OUT`` file is replaced only with ``--overwrite``), loaded with
  ``timm.create_model(backbone, num_classes=C, checkpoint_path=OUT, **backbone_kwargs)`` (the line is printed).
- ``--push-to-hub ORG/NAME`` (folder format): after the local folder, timm's ``push_to_hf_hub`` uploads the same
  weights, config and card (``huggingface_hub``; token from ``HF_TOKEN`` or ``hf auth login``, endpoint from
  ``HF_ENDPOINT``). Offline or unauthenticated: one line, exit 1, the local folder stays.

The checkpoint is read by :mod:`impulsevit.tools.checkpoint_model` (whose names are re-exported here), through
:mod:`impulsevit.safe_load`: one that would run code when loaded (or holds objects
other than tensors and plain values) is refused in one line, exit 2, unless ``--trust-checkpoint`` (or
``IMPULSEVIT_TRUST_CHECKPOINT=1``) says its source is trusted.

``--ema`` exports the EMA weights (``ema.module.*``). Checkpoints written before runs recorded a ``RunRecord`` get the
data config from the datamodule's saved hyperparameters and a card without metrics / cost. Not supported: models whose
``backbone_kwargs`` are not JSON-serialisable (timm refuses them in ``config.json``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from torch import nn

from impulsevit._citation import AUTHORS, BIBTEX, LICENSE, TITLE, VENUE
from impulsevit._compat.timm import model_card_readme
from impulsevit.argparser import ArgumentParser
from impulsevit.errors import ConfigError, UserError
from impulsevit.io import claim_output, commit, disk_errors, remove, temp_path
from impulsevit.safe_load import TRUST_FLAG, TRUST_HELP
from impulsevit.tools.checkpoint_model import (
    backbone_state_dict,
    build_model,
    data_config,
    init_state,
    load_checkpoint_file,
    run_record,
    timm_create_kwargs,
)
from impulsevit.training.checkpointing import atomic_torch_save, run_folder_checkpoint

__all__ = ["EXPORT_FILES", "backbone_state_dict", "build_model", "data_config", "export_checkpoint",
           "export_folder", "is_export_folder", "load_checkpoint_file", "main", "model_card", "push_to_hub",
           "run_record"]

EXPORT_FILES = frozenset({"config.json", "model.safetensors", "README.md"})  # what a folder export writes
_MARKER = "impulsevit"  # top-level key of config.json naming the export (timm ignores unknown keys)
PAPER = (TITLE, ", ".join(f"{given} {family}" for given, family in AUTHORS), VENUE)  # the model card's paper line
CITATION = BIBTEX

# ---------------------------------------------------------------------------------------------- the model card
def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.2f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not recorded"
    s = int(round(seconds))
    return f"{s // 3600} h {s // 60 % 60} min {s % 60} s" if s >= 3600 else f"{s // 60} min {s % 60} s"


def _run_dir_config(ckpt_path: Path) -> str | None:
    """``<run_dir>/config.yaml`` of a checkpoint in ``<run_dir>/checkpoints/``, if there."""
    run_dir = ckpt_path.resolve().parent.parent if ckpt_path.resolve().parent.name == "checkpoints" else None
    cfg = run_dir / "config.yaml" if run_dir is not None else None
    try:
        return cfg.read_text() if cfg is not None and cfg.is_file() else None
    except OSError:
        return None


def model_card(ckpt: dict[str, Any], model: nn.Module, ckpt_path: str | os.PathLike, ema: bool = False,
               name: str | None = None) -> dict[str, Any]:
    """The ``model_card`` dict timm's ``generate_readme`` / ``push_to_hf_hub`` render (``description``,
    ``details``, ``usage``, ``citation``), filled from the checkpoint's hyperparameters, ``RunRecord`` and
    ``Initializer`` states and the run directory's ``config.yaml``. ``name``: the folder / repo name in the
    loading example."""
    from impulsevit.init import InitReport

    hp = ckpt.get("hyper_parameters") or {}
    rec = run_record(ckpt)
    init = init_state(ckpt) or {}
    report = init.get("report")
    init_hp = hp.get("init") or {}
    method = (report or {}).get("method") or init.get("method") or init_hp.get("method", "unknown")
    options = (report or {}).get("options") or init.get("options") or init_hp.get("options") or {}
    dc = data_config(ckpt)
    metrics = rec.get("metrics") or {}
    arch = hp.get("backbone", type(model).__name__)
    registered = not _needs_impulsevit(arch)
    params = sum(p.numel() for p in model.parameters())
    classes = rec.get("class_names")
    where = "val_ema" if ema else "val"
    folder = name or "OUT"

    if method == "from weights":
        origin = (f"fine-tuned with impulsevit **from weights** {options.get('source')!s} (sha256 "
                  f"{options.get('sha256')})")
    else:
        origin = (f"trained from scratch with impulsevit and the **{method}** initialization of *{PAPER[0]}* "
                  f"({PAPER[1]}, {PAPER[2]})")
    description = (
        f"A {type(model).__name__} image classifier ({arch}) {origin}. "
        f"Weights: {'the EMA copy' if ema else 'the raw (non-EMA) model'}. "
        f"Validation top-1 {_pct(metrics.get(f'{where}/acc1'))} %, top-5 {_pct(metrics.get(f'{where}/acc5'))} % "
        f"on {rec.get('dataset') or 'the run’s validation split'}."
    )
    details: dict[str, Any] = {
        "Model Type": "Image classification / feature backbone",
        "Model Stats": {"Params (M)": f"{params / 1e6:.3f}",
                        "Image size": f"{dc['input_size'][1]} x {dc['input_size'][2]}"},
        "Papers": [f"{PAPER[0]} ({PAPER[2]})"],
        "Dataset": (rec.get("dataset") or "not recorded").split(" (")[0],  # the name; the hub lists it as a dataset
        "Data config (evaluation transform)": {
            "input_size": list(dc["input_size"]), "interpolation": dc["interpolation"],
            "crop_pct": dc["crop_pct"], "mean": [round(float(m), 4) for m in dc["mean"]],
            "std": [round(float(s), 4) for s in dc["std"]]},
        "Classes": f"{len(classes)}: {', '.join(classes[:20])}{' …' if len(classes) > 20 else ''}"
                   if classes else f"{getattr(model, 'num_classes', '?')} (names not recorded)",
        "Original": "impulsevit (Lightning + timm)",
    }
    metric_rows = {k: (_pct(v) + " %" if "acc" in k else f"{v:.4f}") for k, v in sorted(metrics.items())
                   if k.startswith(("val/", "val_ema/"))}
    training: dict[str, Any] = {
        "Init": f"{method} (seed {init.get('seed', init_hp.get('seed', '?'))})",
        "Init options (resolved)": json.dumps(options, sort_keys=True) if options else "defaults",
        "Seed (seed_everything)": rec.get("seed", "not recorded"),
        "Epochs": (f"{int(ckpt.get('epoch', 0)) + 1} (checkpoint saved in this epoch; "
                   f"{int(ckpt.get('global_step', 0))} optimizer steps)"),
        "Optimizer": _fmt_opt(hp),
        "Wall time": _duration(rec.get("wall_seconds")),
        "Device": rec.get("device") or "not recorded",
        "Versions": ", ".join(f"{k} {v}" for k, v in (rec.get("versions") or {}).items()) or "not recorded",
    }
    if metric_rows:
        details["Final metrics (validation)"] = metric_rows
    details["Training"] = training

    load = (f"import timm\nmodel = timm.create_model('local-dir:{folder}', pretrained=True).eval()  "
            f"# or 'hf-hub:ORG/NAME'")
    if not registered:
        load = f"import impulsevit.models  # registers {arch} with timm (pip install impulsevit)\n" + load
    usage = (
        f"### Image Classification\n```python\n{load}\n"
        "data_config = timm.data.resolve_data_config({}, model=model)  # the run's evaluation transform\n"
        "transform = timm.data.create_transform(**data_config)\n\n"
        "from PIL import Image\n"
        "img = Image.open('image.png').convert('RGB')\n"
        "probs = model(transform(img).unsqueeze(0)).softmax(-1)\n"
        "top5 = probs.topk(5)  # class names: model.pretrained_cfg['label_names']\n```\n"
    )
    if not registered:
        usage += (f"\n`{arch}` is not in timm's registry: `import impulsevit.models` registers it before "
                  "`timm.create_model`.\n")
    usage += ("\nOr a folder of images: `impulsevit predict " + folder + " IMAGES/ --out predictions.csv` "
              "(path, top-5 class names and probabilities).\n")
    usage += "\n## Training\n"
    commands = rec.get("commands") or []
    usage += ("Command" + ("s" if len(commands) > 1 else "") + ":\n```bash\n" + "\n".join(commands) + "\n```\n"
              if commands else "Command: not recorded (the run was started in-process, not by `impulsevit fit`).\n")
    if report:
        usage += "\nInit report (`impulsevit.init`, logged at the start of training):\n```\n"
        usage += InitReport(**report).table() + "\n```\n"
    cfg_text = _run_dir_config(Path(ckpt_path))
    if cfg_text:
        usage += ("\n<details><summary>Resolved recipe (<code>config.yaml</code> of the run)</summary>\n\n"
                  f"```yaml\n{cfg_text.rstrip()}\n```\n</details>\n")
    return {"description": description, "details": details, "usage": usage, "citation": CITATION,
            "license": LICENSE.lower(), "tags": ["image-classification", "timm", "impulsevit"]}


def _fmt_opt(hp: dict[str, Any]) -> str:
    o, s = hp.get("optimizer") or {}, hp.get("scheduler") or {}
    if not o:
        return "not recorded"
    lr = f"lr {o.get('lr')}" if o.get("lr") is not None else f"base_lr {o.get('base_lr')}"
    sched = f", {s.get('name')} schedule, warmup {s.get('warmup_epochs')} epochs" if s else ""
    extra = (f", label smoothing {hp.get('label_smoothing')}" + (", mixup/cutmix" if hp.get("mixup") else "")
             + (f", EMA decay {hp['ema_decay']}" if hp.get("ema_decay") else ""))
    return f"{o.get('name')} ({lr}, weight decay {o.get('weight_decay')}{sched}{extra})"


def _timm_model_config(ckpt: dict[str, Any], ckpt_path: str | os.PathLike, ema: bool) -> dict[str, Any]:
    """``model_config`` for timm's ``save_for_hf``: label names, the pretrained tag and what was exported."""
    rec = run_record(ckpt)
    init = (init_state(ckpt) or {}).get("method") or (ckpt.get("hyper_parameters") or {}).get("init", {}).get(
        "method", "unknown")
    out: dict[str, Any] = {"pretrained_cfg": {"tag": f"impulsevit_{init}", "license": LICENSE.lower()},
                           _MARKER: {"source_checkpoint": str(Path(ckpt_path).resolve()), "ema": bool(ema),
                                     "global_step": int(ckpt.get("global_step", 0)),
                                     "metrics": rec.get("metrics") or {}}}
    if rec.get("class_names"):
        out["label_names"] = list(rec["class_names"])
    return out


# ---------------------------------------------------------------------------------------------- writing
def is_export_folder(path: str | os.PathLike) -> bool:
    """True when ``path`` is a folder an earlier ``impulsevit export`` wrote: only :data:`EXPORT_FILES` in it and a
    ``config.json`` carrying impulsevit's key."""
    path = Path(path)
    try:
        names = {p.name for p in path.iterdir()}
        return names <= EXPORT_FILES and "config.json" in names and _MARKER in json.loads(
            (path / "config.json").read_text())
    except (OSError, ValueError):
        return False


def export_folder(ckpt_path: str | os.PathLike, out_dir: str | os.PathLike, ema: bool = False,
                  overwrite: bool = False, trust: bool | None = None) -> dict[str, Any]:
    """Write the timm model folder of ``ckpt_path`` to ``out_dir`` (see the module docstring); atomic.

    Returns ``{"backbone", "num_classes", "params", "data_config", "label_names", "model", "model_config",
    "card"}``.

    Raises:
        ConfigError: ``out_dir`` is a file or a non-empty folder that is not an earlier export (or is one, without
            ``overwrite``). FileNotFoundError / ValueError / KeyError: see :func:`load_checkpoint_file`,
            :func:`build_model`, :func:`data_config`. WriteError: full / read-only disk.
    """
    from timm.models import save_for_hf

    out = Path(out_dir)
    ckpt_path = run_folder_checkpoint(ckpt_path) or ckpt_path
    claim_output(out, overwrite, "folder", what="OUT", replaceable=is_export_folder, ours="export")
    ckpt = load_checkpoint_file(ckpt_path, trust=trust)
    model = build_model(ckpt, ema=ema, source=f"checkpoint {ckpt_path}")
    dc = data_config(ckpt)
    model_config = _timm_model_config(ckpt, ckpt_path, ema)
    card = model_card(ckpt, model, ckpt_path, ema=ema, name=out.name)
    with disk_errors(out):
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    remove(tmp)  # a temp folder of an earlier, killed export by this host and pid
    try:
        with disk_errors(out):
            save_for_hf(model, str(tmp), model_config=model_config, safe_serialization=True, data_config=dc)
            (tmp / "README.md").write_text(model_card_readme(card, out.name), encoding="utf-8")
        commit(tmp, out, replace_dir=out.is_dir())  # checked above: empty, or an earlier export with --overwrite
    finally:
        remove(tmp)
    return {"backbone": (ckpt.get("hyper_parameters") or {}).get("backbone"), "num_classes": model.num_classes,
            "params": int(sum(p.numel() for p in model.parameters())), "data_config": dc,
            "label_names": model_config.get("label_names"), "model": model, "model_config": model_config,
            "card": card}


def export_checkpoint(ckpt_path: str | os.PathLike, out_path: str | os.PathLike, ema: bool = False,
                      overwrite: bool = False, trust: bool | None = None) -> dict[str, Any]:
    """Write the plain timm state dict of ``ckpt_path`` to ``out_path`` (atomically); an existing file there is
    replaced only with ``overwrite`` (:func:`impulsevit.io.claim_output`, before the checkpoint is read).

    Returns ``{"backbone", "num_classes", "backbone_kwargs", "tensors", "params"}`` (what ``timm.create_model`` needs
    to load it; ``backbone``/``backbone_kwargs`` are ``None``/``{}`` when the checkpoint has no hyperparameters).

    Raises:
        ConfigError: ``out_path`` is a folder (it is never replaced by a file), or an existing file without
            ``overwrite``; the tensors do not fit the model the hyperparameters name (:func:`build_model`, checked
            before anything is written).
    """
    ckpt_path = run_folder_checkpoint(ckpt_path) or ckpt_path
    claim_output(out_path, overwrite, "file", what="OUT")
    ckpt = load_checkpoint_file(ckpt_path, trust=trust)
    state = backbone_state_dict(ckpt, ema=ema)
    hp = ckpt.get("hyper_parameters") or {}
    if hp.get("backbone"):  # the printed `timm.create_model(..., checkpoint_path=OUT)` line must work: check the fit
        build_model(ckpt, ema=ema, source=f"checkpoint {ckpt_path}")
    atomic_torch_save(state, out_path)
    head = state.get("head.weight")
    return {
        "backbone": hp.get("backbone"),
        "num_classes": int(head.shape[0]) if head is not None else hp.get("num_classes"),
        "backbone_kwargs": timm_create_kwargs(hp),
        "tensors": len(state),
        "params": int(sum(v.numel() for v in state.values())),
    }


# ---------------------------------------------------------------------------------------------- the hub
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def check_repo_id(repo_id: str) -> None:
    """``ORG/NAME`` (letters, digits, ``-_.``); ConfigError otherwise."""
    if not _REPO_RE.match(repo_id):
        raise ConfigError(f"--push-to-hub {repo_id!r}: expected ORG/NAME (e.g. my-lab/vit-impulse-fmnist)")


def _hub_error(e: BaseException, repo_id: str) -> UserError:
    """One line for a failed push: unauthenticated, offline / unreachable, or what the hub answered."""
    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    status = getattr(getattr(e, "response", None), "status_code", None)
    name = type(e).__name__
    if status in (401, 403) or name == "LocalTokenNotFoundError":
        return UserError(f"push to {repo_id}: not authenticated at {endpoint} (HTTP {status}); log in with "
                         f"`hf auth login` or set HF_TOKEN to a token with write access")
    if status is None and (name == "OfflineModeIsEnabled" or "Connect" in name or "Timeout" in name
                           or isinstance(e, OSError)):
        return UserError(f"push to {repo_id}: cannot reach {endpoint} ({name}); are you offline? The local folder "
                         f"is complete; push it later with --push-to-hub")
    first = (str(e).strip().splitlines() or [name])[0]
    return UserError(f"push to {repo_id} failed ({name}{f', HTTP {status}' if status else ''}): {first}")


def push_to_hub(info: dict[str, Any], repo_id: str, private: bool = False) -> str:
    """Upload the model of :func:`export_folder`'s ``info`` to the hub through timm's ``push_to_hf_hub`` (weights as
    safetensors, the same ``config.json`` and, when the repo has none, the same card). Returns the commit URL.

    Raises:
        UserError: unauthenticated, offline, or the hub refused (one line naming the repo and the endpoint).
    """
    from timm.models import push_to_hf_hub

    try:
        result = push_to_hf_hub(info["model"], repo_id, model_config=info["model_config"], model_card=info["card"],
                                data_config=info["data_config"], safe_serialization=True, private=private,
                                commit_message="Add model (impulsevit export)")
    except Exception as e:  # noqa: BLE001 - huggingface_hub / httpx errors: one line, see _hub_error
        raise _hub_error(e, repo_id) from e
    return str(getattr(result, "commit_url", result))


# ---------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``impulsevit export CKPT OUT [--ema] [--format folder|state-dict] [--overwrite] [--push-to-hub ORG/NAME]``;
    returns the exit status (0 done, 2 bad input, 1 disk or hub failure)."""
    parser = ArgumentParser(
        prog="impulsevit export",
        description="Write a timm model folder (config.json with the run's data config and class names, "
                    "model.safetensors, a model card) or a plain state dict from a checkpoint; load the folder with "
                    "timm.create_model('local-dir:OUT', pretrained=True).")
    parser.add_argument("ckpt", help="Lightning checkpoint file, FSDP2 checkpoint folder, or a run folder (the "
                                     "checkpoint --resume auto would pick in it)")
    parser.add_argument("out", help="output folder (folder format) or .pth file (state-dict format)")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights instead of the raw ones")
    parser.add_argument("--format", choices=("folder", "state-dict"), default=None,
                        help="folder: timm model folder (config.json, model.safetensors, README.md); state-dict: "
                             "a plain .pth (default: state-dict when OUT ends in .pth or .pt, else folder)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing OUT: a .pth file, or a folder an earlier export wrote (any other "
                             "non-empty folder is never replaced)")
    parser.add_argument("--push-to-hub", metavar="ORG/NAME", default=None,
                        help="also upload the model to the Hugging Face Hub (timm's push_to_hf_hub)")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create a private repo")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    trust = True if args.trust_checkpoint else None
    if args.format is None:  # `export CKPT vit.pth` means a file, as it always did; anything else a folder
        args.format = "state-dict" if Path(args.out).suffix in (".pth", ".pt") else "folder"
    from impulsevit.io import WriteError

    try:
        if args.push_to_hub is not None:
            if args.format != "folder":
                raise ConfigError("--push-to-hub needs --format folder")
            check_repo_id(args.push_to_hub)
        resolved = run_folder_checkpoint(args.ckpt)
        if resolved is not None:
            print(f"impulsevit export: {args.ckpt} is a run folder: exporting {resolved}")
            args.ckpt = str(resolved)
        if args.format == "state-dict":
            info = export_checkpoint(args.ckpt, args.out, ema=args.ema, overwrite=args.overwrite, trust=trust)
        else:
            info = export_folder(args.ckpt, args.out, ema=args.ema, overwrite=args.overwrite, trust=trust)
    except (FileNotFoundError, KeyError, ValueError, ConfigError) as e:
        print(f"impulsevit export: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    except WriteError as e:
        print(f"impulsevit export: error: {e}", file=sys.stderr)
        return 1
    if args.format == "state-dict":
        kwargs = "".join(f", {k}={v!r}" for k, v in info["backbone_kwargs"].items())
        print(f"wrote {info['tensors']} tensors ({info['params']:,} parameters) to {args.out}\n"
              f"load with: timm.create_model({info['backbone']!r}, num_classes={info['num_classes']}{kwargs}, "
              f"checkpoint_path={args.out!r})")
        return 0
    dc = info["data_config"]
    pre = "import impulsevit.models; " if _needs_impulsevit(info["backbone"]) else ""
    print(f"wrote {args.out.rstrip('/') or '/'}/ (config.json, model.safetensors, README.md): {info['backbone']}, "
          f"{info['params']:,} parameters, {info['num_classes']} classes, input {dc['input_size'][1]} px, "
          f"mean {tuple(round(m, 4) for m in dc['mean'])}, std {tuple(round(s, 4) for s in dc['std'])}, "
          f"{dc['interpolation']}, crop_pct {dc['crop_pct']}\n"
          f"load with: {pre}import timm; model = timm.create_model('local-dir:{Path(args.out).resolve()}', "
          f"pretrained=True)")
    if args.push_to_hub is not None:
        try:
            url = push_to_hub(info, args.push_to_hub, private=args.private)
        except UserError as e:
            print(f"impulsevit export: error: {e}", file=sys.stderr)
            return 1
        print(f"pushed to {args.push_to_hub}: {url}")
    return 0


def _needs_impulsevit(arch: str) -> bool:
    """``arch`` is one of impulsevit's own architectures (registered with timm by ``import impulsevit.models``)."""
    from timm.models import model_entrypoint

    import impulsevit.models  # noqa: F401

    return model_entrypoint(arch).__module__.startswith("impulsevit.")
