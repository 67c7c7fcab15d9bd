"""The ``impulsevit`` command: ``fit|validate|test|predict`` (LightningCLI) plus ``recipes``, ``export`` and the
subcommands other modules provide (``convert``, ``submit``, ``study``, ``demo``).

``impulsevit fit --recipe NAME_OR_PATH [--dotted.key=value ...]``:

- ``--recipe`` is an alias of LightningCLI's ``--config`` (repeatable, merged in order); a NAME resolves to
  ``recipes/NAME.yaml`` (see :mod:`impulsevit.recipes`). It must come after the subcommand; ``impulsevit --recipe x
  fit`` is rewritten to ``impulsevit fit --recipe x``.
- Every run writes to ``<runs_dir>/<name>/`` (``--name``, default the first recipe's file name; ``--runs_dir`` /
  ``--runs-dir``, default ``./runs``): ``config.yaml`` (the resolved config, rewritten on every start so a requeued or
  resumed job never aborts on it), TensorBoard event files (no ``version_N`` subfolder), ``checkpoints/last.ckpt``
  and the top-k checkpoints by ``val/acc1`` (``--checkpoint.*`` configures Lightning's ``ModelCheckpoint``), and
  Lightning's SLURM ``hpc_ckpt_*.ckpt`` files. All checkpoint writes are atomic (:mod:`impulsevit.checkpointing`).
- ``--resume auto``: continue from the newest complete checkpoint of the run directory, or start fresh when there is
  none; checkpoints it passes over (truncated, or written by a ``fast_dev_run`` / different ``limit_*_batches`` smoke
  run) are named with the reason. ``--resume PATH``: from that checkpoint. Either is checked against the model (keys,
  shapes, differing settings) before any work. ``validate|test|predict`` evaluate the resolved checkpoint and refuse
  to run without one unless ``--untrained``; they log (events, ``hparams.yaml``, ``config.yaml``) into
  ``<run_dir>/<subcommand>/`` and never touch the training run's files.
- One owner per run directory (:mod:`impulsevit.rundir`): ``--name`` is a single folder name; ``fit`` holds
  ``<run_dir>/.lock`` while it runs (a second writer stops with the owner's host / pid / SLURM job; stale locks and a
  requeued job's own lock are taken over); ``fit`` into an existing run without ``--resume`` refuses (``--overwrite``
  deletes the old run's files first).
- Errors a user can fix (bad settings found before work, a run directory in use, a full / read-only disk, a damaged
  ``.beton``) print one line ``impulsevit SUB: error: ...`` and exit 2 (before any work) or 1; ``--debug`` /
  ``IMPULSEVIT_DEBUG=1`` shows the traceback. Nothing is written before these checks pass (:mod:`impulsevit.preflight`).
- Misspelled keys fail with the key and the closest valid one; unknown recipe names list the available recipes.
- ``data.num_classes`` is linked to ``model.num_classes``; the global batch is read by the module from the trainer.
- The global RNG states travel in the checkpoints, per rank (:class:`~impulsevit.checkpointing.RNGStateCheckpoint`;
  ranks are seeded ``seed_everything + global_rank``), and so does the training loaders' position: ``--resume auto``
  after any graceful stop continues bit-exactly (see the README's resume section).
- Exit status: 0 when finished, 143 after SIGTERM, 130 after SIGINT (each after the stop checkpoint is written), 0
  after a SIGUSR1 that requeued the SLURM job; argument errors exit with 2.

Not supported: remote run directories (fsspec URLs).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import logging
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from jsonargparse import ActionConfigFile
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.io import CheckpointIO

from impulsevit import __version__
from impulsevit.callbacks.preemption import SlurmRequeue
from impulsevit.checkpointing import (
    AtomicCheckpointIO,
    RNGStateCheckpoint,
    RunCheckpoint,
    atomic_write_text,
    resume_candidate,
)
from impulsevit.data.base import BaseImageDataModule
from impulsevit.errors import ConfigError, RunDirError, UserError
from impulsevit.memory import reuse_large_allocations
from impulsevit.recipes import RecipeNotFoundError, format_listing, resolve_recipe
from impulsevit.rundir import RunDirLock, check_name, clear_run, existing_run, launch_rank
from impulsevit.strategies import check_strategy, default_precision

__all__ = ["ImpulseCLI", "RunConfigSaver", "ImpulseArgumentParser", "main", "prepare_argv", "run_dir_of"]

log = logging.getLogger("impulsevit")

TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")
# subcommand -> (module, function(argv) -> exit status): provided by other parts of the package, imported on use
EXTERNAL_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "convert": ("impulsevit.data.convert_cli", "main"),
    "submit": ("impulsevit.cluster.submit", "main"),
    "study": ("impulsevit.study", "main"),
    "demo": ("impulsevit.init.demo", "main"),
    "init": ("impulsevit.init.plugins", "main"),
    "data": ("impulsevit.preview", "main"),
    "download": ("impulsevit.data.download", "main"),
}
LOCAL_SUBCOMMANDS = ("recipes", "export")
ALL_SUBCOMMANDS = (*TRAINER_SUBCOMMANDS, *LOCAL_SUBCOMMANDS, *EXTERNAL_SUBCOMMANDS)
_CONFIG_FLAGS = ("--recipe", "--config", "-c")
_NO_VALUE_FLAGS = ("-h", "--help", "--print_config")

USAGE = f"""usage: impulsevit SUBCOMMAND ...

impulsevit {__version__}: Lightning + timm training of vision transformers with structured initializations.

  fit|validate|test|predict --recipe NAME_OR_PATH [--dotted.key=value ...]
        [--name N] [--runs-dir D] [--resume auto|PATH]
                      train / evaluate (LightningCLI; `impulsevit fit --help` lists every key)
  recipes             list the available recipes
  export CKPT OUT.pth [--ema]
                      write a plain timm state dict from a checkpoint
  convert ...         convert a dataset to FFCV .beton
  submit ...          submit a recipe to SLURM
  study ...           run an initialization study
  demo                show an impulse initialization on a small ViT
  init list [module:function ...]
                      list the init methods (built-in, plugins, import paths) and their source
  data preview --recipe R [overrides] --split train|val [--num N] [--out DIR]
                      write the images the recipe feeds the model (PNG grid + tensors)
  download NAME ROOT  fetch a public dataset (cifar10, cifar100, stl10, flowers102, pets, food101, fashion_mnist)
"""


# ----------------------------------------------------------------------------------------------------- argv handling
def _option_name(token: str) -> str | None:
    return token.split("=", 1)[0] if token.startswith("-") else None


def _subcommand_index(argv: list[str]) -> int | None:
    """Position of the first bare subcommand token (not the value of a preceding option), or ``None``."""
    for i, tok in enumerate(argv):
        if tok in ALL_SUBCOMMANDS:
            prev = argv[i - 1] if i else ""
            takes_value = prev.startswith("-") and "=" not in prev and prev not in _NO_VALUE_FLAGS
            if not takes_value:
                return i
    return None


def prepare_argv(argv: list[str]) -> list[str]:
    """Normalise a command line for LightningCLI.

    - moves a subcommand given after options to the front (``--recipe x fit`` -> ``fit --recipe x``; Lightning#21245);
    - resolves every ``--recipe`` / ``--config`` / ``-c`` value that is not an existing file as a recipe name;
    - inserts ``--name=<stem of the first --recipe>`` right after the subcommand when no ``--name`` is given (a
      ``name:`` in the recipe or a later ``--name`` still wins).

    Raises:
        RecipeNotFoundError: a recipe value is neither a file nor a known recipe (lists the available ones).
        RecipeSyntaxError: a recipe file is not valid YAML.
    """
    argv = list(argv)
    if argv and argv[0] not in ALL_SUBCOMMANDS and not (set(argv) & {"-h", "--help"}):
        idx = _subcommand_index(argv)
        if idx is not None:
            argv.insert(0, argv.pop(idx))
    if not argv or argv[0] not in TRAINER_SUBCOMMANDS:
        return argv
    out: list[str] = [argv[0]]
    first_recipe: Path | None = None
    has_name = False
    i = 1
    while i < len(argv):
        tok = argv[i]
        name = _option_name(tok)
        if name in _CONFIG_FLAGS:
            if "=" in tok:
                value, consumed = tok.split("=", 1)[1], 1
            elif i + 1 < len(argv):
                value, consumed = argv[i + 1], 2
            else:  # let the parser report the missing value
                out.append(tok)
                i += 1
                continue
            path = resolve_recipe(value)
            check_recipe_syntax(path)
            if name == "--recipe" and first_recipe is None:
                first_recipe = path
            out += [name, str(path)]
            i += consumed
            continue
        if name == "--name":
            has_name = True
        out.append(tok)
        i += 1
    if first_recipe is not None and not has_name:
        out.insert(1, f"--name={first_recipe.stem}")
    return out


class RecipeSyntaxError(ConfigError):
    """A recipe file is not valid YAML (the message names the file, line and column)."""


def check_recipe_syntax(path: Path) -> None:
    """Raise :class:`RecipeSyntaxError` naming ``path`` when it is not valid YAML (jsonargparse would report the
    error against ``<unicode string>``)."""
    import yaml

    try:
        yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeSyntaxError(f"{path}{where}: invalid YAML: {what}") from None
    except OSError as e:
        raise RecipeSyntaxError(f"cannot read recipe {path}: {e.strerror or e}") from None


def run_dir_of(runs_dir: str | os.PathLike, name: str | None) -> Path:
    """``<runs_dir>/<name>`` (``name`` defaults to ``default``)."""
    return Path(runs_dir) / (name or "default")


# ------------------------------------------------------------------------------------------ errors with suggestions
def _unwrap_optional(hint: Any) -> Any:
    """``X`` for ``X | None`` / ``Optional[X]``, else ``hint`` unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _class_keys(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _import_object(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class ImpulseArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose errors about unknown keys also name the closest valid key."""

    model_class: type | None = None  # set by ImpulseCLI, used to list the fields of dataclass-typed model arguments

    def _valid_keys(self) -> set[str]:
        keys: set[str] = set()
        for action in self._actions:
            sub = getattr(action, "choices", None)
            if isinstance(sub, dict) and all(isinstance(p, LightningArgumentParser) for p in sub.values()):
                for p in sub.values():
                    keys |= p._valid_keys() if isinstance(p, ImpulseArgumentParser) else set()
                continue
            if action.dest and action.dest != "help":
                keys.add(action.dest)
        hints = typing.get_type_hints(self.model_class.__init__) if self.model_class is not None else {}
        for name, hint in hints.items():
            inner = _unwrap_optional(hint)
            if dataclasses.is_dataclass(inner):
                keys |= {f"model.{name}.{f}" for f in _class_keys(inner)}
        return keys

    def _closest(self, key: str) -> str | None:
        """The valid key closest to ``key``: keep its longest valid prefix, fix the first wrong segment."""
        valid = self._valid_keys()
        parts = key.split(".")
        prefixes = {".".join(k.split(".")[:n]) for k in valid for n in range(len(k.split(".")) + 1)}
        depth = max(n for n in range(len(parts) + 1) if ".".join(parts[:n]) in prefixes)
        if depth == len(parts):
            return None
        head = ".".join(parts[:depth])
        children = {k.split(".")[depth] for k in valid if (not head or k.startswith(head + ".")) and
                    len(k.split(".")) > depth}
        best = difflib.get_close_matches(parts[depth], sorted(children), n=1, cutoff=0.5)
        if not best:
            return None
        return ".".join([*parts[:depth], best[0], *parts[depth + 1:]])

    def _hint(self, message: str) -> str:
        hints = []
        for key in re.findall(r"does not accept option '([^']+)'", message):
            hints.append((key, self._closest(key)))
        m = re.search(r"unrecognized arguments: (.*)", message)
        if m:
            for tok in m.group(1).split():
                if tok.startswith("--"):
                    key = tok[2:].split("=", 1)[0]
                    hints.append((key, self._closest(key)))
        # nested class / dataclass values: 'Parser key "model.init": ... class_path 'X': ... Option 'metod' is not...'
        for owner, cls_path, opt in re.findall(
            r"Parser key \"([^\"]+)\":.*?class_path '([^']+)'.*?Option '([^']+)' is not accepted", message, re.S
        ):
            try:
                options = _class_keys(_import_object(cls_path))
            except (ImportError, AttributeError, ValueError, TypeError):
                options = []
            best = difflib.get_close_matches(opt, options, n=1, cutoff=0.5)
            hints.append((f"{owner}.{opt}", f"{owner}.{best[0]}" if best else None))
        lines = []
        for key, best in hints:
            lines.append(f"unknown key '{key}'" + (f"; did you mean '{best}'?" if best else ""))
        return message if not lines else message.rstrip() + "\n" + "\n".join(lines)

    def error(self, message: str, ex: Exception | None = None) -> typing.NoReturn:
        try:
            message = self._hint(message)
        except Exception:  # noqa: BLE001 - a failing suggestion must never hide the original error
            pass
        super().error(message, ex)


# ----------------------------------------------------------------------------------------------------- the CLI class
class RunConfigSaver(SaveConfigCallback):
    """Writes the resolved config to ``<run_dir>/config.yaml`` at setup, atomically, overwriting an existing one.

    Overwriting is deliberate: a requeued / resumed job reuses its run directory (Lightning's default aborts there,
    Lightning#17115). Rank 0 writes; the config is also logged to TensorBoard as text (``config``) and its path to the
    ``impulsevit`` logger. ``multifile`` is not supported.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # broadcast from rank 0 (collective: every rank calls it)
        if trainer.is_global_zero and log_dir is not None:
            text = self.parser.dump(self.config, skip_none=False)
            path = Path(log_dir) / self.config_filename
            atomic_write_text(path, text)
            log.info("impulsevit: resolved config written to %s", path)
            for lg in trainer.loggers:
                if isinstance(lg, TensorBoardLogger):
                    lg.experiment.add_text("config", "    " + text.replace("\n", "\n    "), global_step=0)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


def _first_of_each(callbacks: list[Callback], kinds: tuple[type, ...]) -> list[Callback]:
    """``callbacks`` without the second and later instances of each type in ``kinds`` (order otherwise kept)."""
    seen: set[type] = set()
    out = []
    for cb in callbacks:
        kind = next((k for k in kinds if isinstance(cb, k)), None)
        if kind is not None and kind in seen:
            continue
        if kind is not None:
            seen.add(kind)
        out.append(cb)
    return out


class ImpulseCLI(LightningCLI):
    """LightningCLI for :class:`impulsevit.module.ImageClassifier` and any :class:`BaseImageDataModule` subclass.

    See the module docstring for the command line. Extra keys (all subcommands): ``name``, ``runs_dir``, ``resume``
    and the ``checkpoint`` group (:class:`~impulsevit.checkpointing.RunCheckpoint`, a Lightning ``ModelCheckpoint``;
    defaults ``monitor: val/acc1``, ``mode: max``, ``save_last: true``, ``dirpath: <run_dir>/checkpoints``). Trainer
    defaults added when the recipe does not set them: ``default_root_dir=<run_dir>``,
    ``TensorBoardLogger(save_dir=runs_dir, name=name, version="")``, the
    :class:`~impulsevit.checkpointing.AtomicCheckpointIO` plugin, ``precision`` = bf16-mixed on GPU / 32-true on CPU,
    ``strategy: fsdp`` (FSDP1) refused in favour of ``fsdp2``, the
    :class:`~impulsevit.callbacks.preemption.SlurmRequeue` callback (the one owner of SLURM requeueing, also for sbatch
    scripts users write themselves) and ``seed_everything: 0``.
    """

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        from impulsevit.module import ImageClassifier

        ImpulseArgumentParser.model_class = ImageClassifier
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("parser_kwargs", {"prog": "impulsevit"})
        self.run_lock: RunDirLock | None = None
        try:
            self._start(args, run, kwargs)
        finally:
            if self.run_lock is not None:
                self.run_lock.release()

    def _start(self, args: list[str] | None, run: bool, kwargs: dict[str, Any]) -> None:
        from impulsevit.module import ImageClassifier

        super().__init__(
            model_class=ImageClassifier,
            datamodule_class=BaseImageDataModule,
            subclass_mode_data=True,
            save_config_callback=RunConfigSaver,
            save_config_kwargs={"overwrite": True},
            parser_class=ImpulseArgumentParser,
            trainer_defaults={"callbacks": [RNGStateCheckpoint(), SlurmRequeue()]},
            auto_configure_optimizers=False,
            args=args,
            run=run,
            **kwargs,
        )

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("dump_header", [f"impulsevit=={__version__} lightning.pytorch=={pl.__version__}"])
        kwargs.setdefault("allow_abbrev", False)  # `--trainer.max_epoch` must be an error, not max_epochs
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c", "--config", "--recipe", action=ActionConfigFile,
            help="Recipe: a config file, or the name of one in recipes/ (repeatable, merged in order).",
        )
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--name", type=str | None, default=None,
                            help="Run name; the run directory is <runs_dir>/<name>. Default: the recipe's file name.")
        parser.add_argument("--runs_dir", "--runs-dir", type=str, default="runs", help="Parent of run directories.")
        parser.add_argument("--resume", type=str | None, default=None,
                            help="'auto': newest complete checkpoint of the run directory (fresh start if none); "
                                 "or a checkpoint path.")
        parser.add_argument("--overwrite", type=bool, default=False,
                            help="fit: start over in an existing run directory, deleting its config, event files and "
                                 "checkpoints (default: refuse and suggest --resume auto or another --name)")
        parser.add_argument("--untrained", type=bool, default=False,
                            help="validate/test/predict: evaluate the model as built, without a checkpoint")
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/acc1", "checkpoint.mode": "max", "checkpoint.save_last": True})
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate",
                              compute_fn=_checked_num_classes)

    # ------------------------------------------------------------------ run directory, trainer defaults, resume
    @property
    def run_dir(self) -> Path:
        cfg = self._get(self.config, "name"), self._get(self.config, "runs_dir")
        return run_dir_of(cfg[1], cfg[0])

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """LightningCLI's parsing without its warning about ``args`` next to a non-empty ``sys.argv``: ``main`` passes
        the command line it has rewritten (:func:`prepare_argv`) and keeps ``sys.argv`` for DDP's re-launch."""
        if isinstance(args, dict):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def before_instantiate_classes(self) -> None:
        if self.subcommand is not None:
            check_name(self._get(self.config, "name") or "default")
        importlib.import_module("impulsevit.strategies")  # registers `fsdp2` / `ddp_bf16` with Lightning
        importlib.import_module("impulsevit.models")  # registers impulsevit's architectures with timm

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        run_dir, name = self.run_dir, self._get(self.config, "name") or "default"
        if trainer_cfg.get("default_root_dir") is None:
            kwargs["default_root_dir"] = str(run_dir)
        if trainer_cfg.get("logger") in (None, True):
            # validate/test/predict log (events, hparams.yaml, config.yaml) into <run_dir>/<subcommand>/, never over
            # the training run's files
            version = "" if self.subcommand in (None, "fit") else self.subcommand
            kwargs["logger"] = TensorBoardLogger(save_dir=str(run_dir.parent), name=name, version=version,
                                                 default_hp_metric=False)
        plugins = trainer_cfg.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        check_strategy(trainer_cfg.get("strategy"))
        if trainer_cfg.get("precision") is None:
            kwargs["precision"] = default_precision(trainer_cfg.get("accelerator"))
        ckpt_cb = self._get(self.config_init, "checkpoint")
        if isinstance(ckpt_cb, ModelCheckpoint) and ckpt_cb.dirpath is None:
            ckpt_cb.dirpath = os.path.realpath(run_dir / "checkpoints")
        trainer = super().instantiate_trainer(**kwargs)
        # LightningCLI appends the default callbacks to the configured ones: a recipe or an sbatch script that names
        # SlurmRequeue / RNGStateCheckpoint itself would otherwise run two (the configured one, listed first, stays)
        trainer.callbacks = _first_of_each(trainer.callbacks, (SlurmRequeue, RNGStateCheckpoint))
        return trainer

    def instantiate_classes(self) -> None:
        """LightningCLI's instantiation; an invalid model or data setting becomes a one-line :class:`ConfigError`."""
        try:
            super().instantiate_classes()
        except UserError:
            raise
        except (ValueError, TypeError, FileNotFoundError, KeyError) as e:
            cause: BaseException | None = e
            while cause is not None and not isinstance(cause, UserError):
                cause = cause.__cause__ or cause.__context__
            raise (cause if cause is not None else ConfigError(_one_line(e))) from e

    def after_instantiate_classes(self) -> None:
        """Everything that can be checked before work starts, in this order: the data's class count, the image size
        against the backbone, the checkpoint to resume (found, complete, not a smoke run's, fitting the model), the
        init method (``fit`` from scratch), the run directory (``fit``: lock, existing run); nothing is written until
        the lock is taken, last."""
        if self.subcommand is None:
            return
        sub = self.subcommand
        model, dm = self.model, self.datamodule
        from impulsevit.module import check_image_size
        from impulsevit.preflight import check_classes, check_init, check_resume

        check_classes(getattr(dm, "num_classes", None), _describe_data(self._get(self.config, "data")))
        try:
            check_image_size(model.backbone, model.hparams.backbone, getattr(dm, "image_size", None))
        except ValueError as e:
            raise ConfigError(str(e)) from e
        path = self._resume_path()
        if path is not None:
            check_resume(path, model, dict(model.hparams))
            log.info("impulsevit: resuming from %s", path)
            self.config_init[sub]["ckpt_path"] = str(path)
        elif self.config_init[sub].get("ckpt_path") is not None:
            path = Path(self.config_init[sub]["ckpt_path"])
            check_resume(path, model, dict(model.hparams))
        if sub == "fit" and path is None:
            cfg = model.init_cfg
            check_init(model.build_backbone, model.hparams.backbone, cfg.method, dict(cfg.options), cfg.seed)
        if sub != "fit" and path is None and not self._get(self.config, "untrained"):
            raise ConfigError(f"impulsevit {sub} evaluates a trained model: give --resume auto (the newest checkpoint "
                              f"of {self.run_dir}) or --resume PATH; pass --untrained to evaluate the model as built")
        if sub == "fit" and launch_rank() == 0:
            self._own_run_dir(resuming=self._get(self.config, "resume") is not None or path is not None)

    def _resume_path(self) -> Path | None:
        """The checkpoint ``--resume`` names (``auto``: found in the run directory, skipped ones reported)."""
        resume = self._get(self.config, "resume")
        if resume is None:
            return None
        sub = self.subcommand
        sub_init = self.config_init[sub]
        if sub_init.get("ckpt_path") is not None:
            raise ConfigError(f"give either --resume ({resume!r}) or --ckpt_path ({sub_init['ckpt_path']!r}), not both")
        if resume != "auto":
            path = Path(resume)
            if not path.exists():
                raise ConfigError(f"--resume {resume!r}: no such checkpoint")
            return path
        ckpt_cb = self._get(self.config_init, "checkpoint")
        extra = (ckpt_cb.dirpath,) if isinstance(ckpt_cb, ModelCheckpoint) and ckpt_cb.dirpath else ()
        trainer = self.trainer
        limits = {"fast_dev_run": bool(trainer.fast_dev_run), "limit_train_batches": trainer.limit_train_batches,
                  "limit_val_batches": trainer.limit_val_batches}
        path, skipped = resume_candidate(self.run_dir, extra_dirs=extra, limits=limits)
        for line in skipped:
            log.warning("impulsevit: --resume auto: skipped %s", line)
        if path is None:
            if sub != "fit":
                why = f" ({len(skipped)} skipped, see above)" if skipped else ""
                raise ConfigError(f"--resume auto: no usable checkpoint in {self.run_dir} to {sub}{why}")
            log.info("impulsevit: --resume auto: no usable checkpoint in %s; starting fresh", self.run_dir)
        return path

    def _own_run_dir(self, resuming: bool) -> None:
        """Take the run directory's lock; refuse to start a new run over an existing one unless ``--overwrite``."""
        run_dir = self.run_dir
        self.run_lock = lock = RunDirLock(run_dir)
        lock.acquire()
        found = existing_run(run_dir)
        requeued = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0
        if found and not resuming and not requeued:
            if not self._get(self.config, "overwrite"):
                raise RunDirError(f"run directory {run_dir} already holds a run ({', '.join(found)}); continue it with "
                                  f"--resume auto, choose another --name, or pass --overwrite to delete it and start "
                                  f"over")
            log.warning("impulsevit: --overwrite: deleting the previous run in %s (%s)", run_dir, ", ".join(found))
            clear_run(run_dir)


def _checked_num_classes(num_classes: int | None) -> int | None:
    """The data's class count, linked to the model's; fewer than 2 is a :class:`ConfigError` (before the model is
    built, where torchmetrics would fail with a message that does not mention the data)."""
    from impulsevit.preflight import check_classes

    check_classes(num_classes, "data.num_classes")
    return num_classes


def _describe_data(data_cfg: Any) -> str:
    """``dataset X at ROOT`` / the data class, for error messages."""
    args = getattr(data_cfg, "init_args", None) or {}
    get = args.get if hasattr(args, "get") else (lambda k, d=None: getattr(args, k, d))
    parts = [f"dataset {get('dataset')}" if get("dataset") else str(getattr(data_cfg, "class_path", "data"))]
    if get("root"):
        parts.append(f"at {get('root')}")
    return " ".join(parts)


def _one_line(e: BaseException) -> str:
    """An exception's message on one line (jsonargparse nests the cause's lines; the last non-empty one is kept when
    the first is only a wrapper)."""
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if len(lines) == 1 else "; ".join(lines)


# ------------------------------------------------------------------------------------------------------ entry point
class _StderrHandler(logging.StreamHandler):
    """A stream handler that writes to the *current* ``sys.stderr`` (redirections made after setup are honoured)."""

    @property
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _setup_logging() -> None:
    if not log.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _run_external(sub: str, rest: list[str]) -> int:
    module, func = EXTERNAL_SUBCOMMANDS[sub]
    try:
        fn = getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            print(f"impulsevit {sub}: not available in this installation ({module} is missing)", file=sys.stderr)
            return 2
        raise
    return int(fn(rest) or 0)


def user_error(exc: BaseException) -> tuple[str, int] | None:
    """``(one-line message, exit status)`` when ``exc`` (or an exception it was raised from) is one a user fixes: an
    :class:`~impulsevit.errors.UserError`, a full / read-only / forbidden disk (:class:`~impulsevit.io.WriteError`, or
    an ``OSError`` with such an errno from elsewhere), a damaged ``.beton``. Else None: a bug, shown with its
    traceback."""
    from impulsevit.data.integrity import BetonError
    from impulsevit.io import _DISK_ERRNOS, WriteError, write_error

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, UserError):
            return _one_line(e), e.exit_status
        if isinstance(e, WriteError | BetonError):
            return _one_line(e), 1
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS and e.filename:
            return str(write_error(e, e.filename)), 1
        e = e.__cause__ or e.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``impulsevit`` console script. Returns the exit status: 0 done, 1 a run failed for a reason
    the message names (full disk, damaged data), 2 bad arguments or configuration (found before any work started).

    ``--debug`` (anywhere) or ``IMPULSEVIT_DEBUG=1`` shows the traceback of those errors too."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("IMPULSEVIT_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    _setup_logging()
    try:
        argv = prepare_argv(argv)
    except (RecipeNotFoundError, ConfigError) as e:
        print(f"impulsevit: error: {e}", file=sys.stderr)
        return 2
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    sub, rest = argv[0], argv[1:]
    if sub == "recipes":
        print(format_listing())
        return 0
    if sub == "export":
        from impulsevit.export import main as export_main

        return export_main(rest)
    if sub in EXTERNAL_SUBCOMMANDS:
        return _run_external(sub, rest)
    if sub not in TRAINER_SUBCOMMANDS:
        close = difflib.get_close_matches(sub, ALL_SUBCOMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"impulsevit: error: unknown subcommand {sub!r}{hint}\n\n{USAGE}", file=sys.stderr)
        return 2
    reuse_large_allocations()  # per-step batches above 32 MiB are not page-faulted in again every step
    return run_trainer_command(argv, sub, debug)


def run_trainer_command(argv: list[str], sub: str = "fit", debug: bool = False) -> int:
    """Run ``fit|validate|test|predict`` and return its exit status: 0 when it finished, 143 after SIGTERM and 130
    after SIGINT (each after its checkpoint was written, see :mod:`impulsevit.callbacks.preemption`), 0 after a
    SIGUSR1 that requeued the SLURM job, 1 or 2 for a user-fixable error (printed as one line; ``debug`` re-raises).
    Lightning leaves a SIGTERM with a ``SIGTERMException`` (a ``SystemExit`` without a code, i.e. status 0); it is
    mapped to 143 here."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        ImpulseCLI(args=argv)
    except SIGTERMException:
        log.info("impulsevit: stopped by SIGTERM (exit 143)")
        return 143
    except KeyboardInterrupt:
        log.info("impulsevit: interrupted (exit 130)")
        return 130
    except Exception as e:  # noqa: BLE001 - user errors become one line; anything else is re-raised
        found = None if debug else user_error(e)
        if found is None:
            raise
        message, status = found
        print(f"impulsevit {sub}: error: {message}", file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
