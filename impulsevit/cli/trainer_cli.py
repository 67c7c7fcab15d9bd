"""``ImpulseCLI``: LightningCLI for the ``fit|validate|test|predict`` subcommands, with impulsevit's extra keys, trainer
defaults, run directory and ``--resume``, and every check that can run before work starts."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from jsonargparse import ActionConfigFile, ActionYesNo
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from impulsevit._aliases import old_module_paths
from impulsevit._compat.cli import SubcommandRunHookCLI, subcommand_parsers
from impulsevit._version import __version__
from impulsevit.callbacks.config_saver import RunConfigSaver
from impulsevit.callbacks.run_checkpoint import RunCheckpoint
from impulsevit.cli.errors import one_line
from impulsevit.cli.parser import ImpulseArgumentParser
from impulsevit.cli.run_policy import resume_checkpoint, run_dir_of, start_new_run
from impulsevit.data.loading.base import BaseImageDataModule
from impulsevit.env import slurm_restart_count
from impulsevit.errors import ConfigError, UserError
from impulsevit.io import WriteError, disk_oserror, write_error
from impulsevit.run.preflight import finished_run
from impulsevit.run.rundir import RunDirLock, check_runs_dir, launch_rank, run_files
from impulsevit.safe_load import (
    TRUST_FLAG,
    UntrustedFileError,
    load_checkpoint,
    split_trust_flag,
    trust_requested,
    trusting,
)
from impulsevit.training.checkpointing import AtomicCheckpointIO
from impulsevit.training.strategies import check_strategy, default_precision
from impulsevit.training.trackers import (
    check_logger_config,
    check_trackers,
    describe,
    guard_tracker,
    place_logger_config,
    resume_ids,
    tracker_loggers,
)

log = logging.getLogger("impulsevit")


class ImpulseCLI(SubcommandRunHookCLI):
    """LightningCLI for :class:`impulsevit.training.module.ImageClassifier` and any :class:`BaseImageDataModule`
    subclass.

    See :mod:`impulsevit.cli` for the command line. Extra keys (all subcommands): ``name``, ``runs_dir``, ``resume``
    and the ``checkpoint`` group (:class:`~impulsevit.callbacks.run_checkpoint.RunCheckpoint`, a Lightning
    ``ModelCheckpoint``;
    defaults ``monitor: val/acc1``, ``mode: max``, ``save_last: true``, ``dirpath: <run_dir>/checkpoints``). Trainer
    defaults added when the recipe does not set them: ``default_root_dir=<run_dir>``, the
    ``TensorBoardLogger(save_dir=runs_dir, name=name, version="")`` *first* among the loggers (the recipe's / command
    line's ``trainer.logger`` and ``--tracker`` ones come after it, never instead; ``--no_tensorboard`` leaves it out,
    ``--trainer.logger=false`` turns every logger off), the
    :class:`~impulsevit.training.checkpointing.AtomicCheckpointIO` plugin, ``precision`` = bf16-mixed on GPU / 32-true
    on CPU, ``strategy: fsdp`` (FSDP1) refused in favour of ``fsdp2`` and ``seed_everything: 0``. Every other callback
    comes from the model (:func:`impulsevit.callbacks.standard_callbacks`), as for a plain ``Trainer``.

    Every checkpoint it reads (``--resume``, ``--ckpt_path``, the candidates of ``--resume auto``) is read through
    :mod:`impulsevit.safe_load`: one that would run code is refused in one line, unless the command line holds
    ``--trust-checkpoint`` (taken out before parsing, so it is never part of ``config.yaml``) or
    ``IMPULSEVIT_TRUST_CHECKPOINT=1`` is set; then Lightning loads it with ``weights_only=False``.
    """

    error_prog: str | None = None  # how a parse error names the command, when not `impulsevit SUBCOMMAND`

    def __init__(self, args: list[str] | None = None, run: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("parser_kwargs", {"prog": "impulsevit"})
        self.run_lock: RunDirLock | None = None
        self.start_step: float = 0  # the resumed checkpoint's global step (inf: unknown)
        self.finished: str | None = None  # `fit --resume auto` found a finished run: why it is finished
        args, flag = _without_trust_flag(args)
        self.trust = trust_requested(True if flag else None)
        failed = True
        try:
            with trusting(flag):  # for the whole command: every loader, Lightning's and the DDP ranks it starts
                self._start(args, run, kwargs)
            failed = False
        except Exception as e:
            disk = disk_oserror(e)
            if disk is not None and not disk.filename and not isinstance(e, WriteError) and hasattr(self, "config"):
                # a full disk under a writer that does not name its file (Lightning's hparams.yaml, TensorBoard's
                # event writer, whose error Lightning re-raises as "you tried to log 9.60 which is not supported")
                raise write_error(disk, self.run_dir) from e
            raise
        finally:
            if self.run_lock is not None:
                # a start that failed before its first training step takes back the run files it created (config,
                # event file, empty checkpoints/), so the retry is not refused as "already holds a run"
                self.run_lock.release(discard=failed and not self._trained())

    def _trained(self) -> bool:
        """Whether this process trained (an optimizer step past the resumed checkpoint's, or a checkpoint written):
        then its files hold work to keep. Lightning resets ``trainer.state.stage`` on an exception, so the step is
        what tells."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return False
        if any(p.suffix == ".ckpt" for p in set(run_files(self.run_dir)) - self.run_lock.existing):
            return True  # a checkpoint was written (e.g. on SIGTERM during the sanity check): keep the run
        return trainer.global_step > self.start_step

    def _start(self, args: list[str] | None, run: bool, kwargs: dict[str, Any]) -> None:
        from impulsevit.training.module import ImageClassifier

        super().__init__(
            model_class=ImageClassifier,
            datamodule_class=BaseImageDataModule,
            subclass_mode_data=True,
            save_config_callback=RunConfigSaver,
            save_config_kwargs={"overwrite": True},
            parser_class=ImpulseArgumentParser,
            auto_configure_optimizers=False,
            args=args,
            run=run,
            **kwargs,
        )

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("dump_header", [f"impulsevit=={__version__} lightning.pytorch=={pl.__version__}"])
        kwargs.setdefault("allow_abbrev", False)  # `--trainer.max_epoch` must be an error, not max_epochs
        parser = self.parser_class(**kwargs)
        if isinstance(parser, ImpulseArgumentParser):  # on this parser only: the fields of dataclass-typed arguments
            parser.model_class = self.model_class
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
                                 "or a checkpoint path. A checkpoint that would run code when loaded is refused "
                                 f"unless {TRUST_FLAG} is given (trusted sources only).")
        # bare flags (``--overwrite``), as the error messages suggest them; ``--overwrite=true`` / ``--no_overwrite``
        # work too
        parser.add_argument("--overwrite", action=ActionYesNo(yes_prefix="", no_prefix="no_"), nargs="?",
                            default=False,
                            help="fit: start over in an existing run directory, deleting its config, event files and "
                                 "checkpoints (default: refuse and suggest --resume auto or another --name)")
        parser.add_argument("--untrained", action=ActionYesNo(yes_prefix="", no_prefix="no_"), nargs="?",
                            default=False,
                            help="validate/test/predict: evaluate the model as built, without a checkpoint")
        parser.add_argument("--tracker", type=str | None, default=None,
                            help="fit/validate/test: extra trackers next to TensorBoard, comma-separated: wandb, "
                                 "mlflow, csv (files in the run directory; W&B / MLflow runs continue on resume)")
        parser.add_argument("--tensorboard", action=ActionYesNo(yes_prefix="", no_prefix="no_"), nargs="?",
                            default=True,
                            help="the run's TensorBoard logger in the run directory (default on; --no_tensorboard "
                                 "leaves it out; the run's config.yaml and attention records stay there either way)")
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/acc1", "checkpoint.mode": "max", "checkpoint.save_last": True})
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate",
                              compute_fn=_checked_num_classes)
        # the input size has one source, the data's image_size (timm's img_size for fixed-size architectures)
        parser.link_arguments("data.image_size", "model.img_size", apply_on="instantiate")

    # ------------------------------------------------------------------ run directory, trainer defaults, resume
    def _value(self, config: Any, key: str, default: Any = None) -> Any:
        """``key`` of ``config`` (``self.config`` or ``self.config_init``), inside the subcommand's section when there
        is a subcommand (LightningCLI's own lookup, from its public ``subcommand`` and the config's ``get``)."""
        return config.get(str(self.subcommand), config).get(key, default)

    @property
    def run_dir(self) -> Path:
        return run_dir_of(self._value(self.config, "runs_dir"), self._value(self.config, "name"))

    @property
    def files_dir(self) -> Path:
        """Where the subcommand's run files go: the run directory (``fit``), ``<run_dir>/<subcommand>`` otherwise."""
        return self.run_dir if self.subcommand in (None, "fit") else self.run_dir / str(self.subcommand)

    @property
    def run_name(self) -> str:
        return self._value(self.config, "name") or "default"

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """LightningCLI's parsing without its warning about ``args`` next to a non-empty ``sys.argv``: ``main`` passes
        the command line it has rewritten (:func:`prepare_argv`) and keeps ``sys.argv`` for DDP's re-launch."""
        subcommands = subcommand_parsers(parser)
        if isinstance(parser, ImpulseArgumentParser) and isinstance(args, list | tuple) and args and \
                args[0] in subcommands:
            parser.error_prog = f"{parser.prog} {args[0]}"  # the one-line error names the subcommand
            if self.error_prog is not None:  # ... or the command that parses a fit configuration (submit)
                for p in (parser, subcommands[args[0]]):
                    if isinstance(p, ImpulseArgumentParser):
                        p.error_prog, p.keys_prog = self.error_prog, f"{parser.prog} {args[0]}"
        with old_module_paths():  # class_path strings of recipes and old runs' config.yaml may name old paths
            if isinstance(args, dict):
                self.config = parser.parse_object(args)
            else:
                self.config = parser.parse_args(args)
        self._check_ckpt_path_file()

    def _check_ckpt_path_file(self) -> None:
        """``--ckpt_path FILE``: LightningCLI reads the file's hyperparameters into the config right after parsing
        (``torch.load(weights_only=True)``, a traceback when that fails); read it through :mod:`impulsevit.safe_load`
        first, so a file that would run code, or does not load, is one line. A file that only a trusted load reads is
        to be given as ``--resume`` (LightningCLI's read cannot be trusted)."""
        sub = self.config.get("subcommand")
        ckpt_path = self.config.get(sub, {}).get("ckpt_path") if sub else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        try:
            load_checkpoint(ckpt_path, mmap=True, trust=False)
        except UntrustedFileError:
            if not self.trust:
                raise
            raise ConfigError(f"--ckpt_path {ckpt_path}: LightningCLI reads this file's hyperparameters with "
                              f"weights_only=True, which it does not pass; give it as --resume {ckpt_path} "
                              f"{TRUST_FLAG}") from None
        except Exception as exc:  # noqa: BLE001 - any failure means the file is not a usable checkpoint
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"--ckpt_path {ckpt_path}: not a readable checkpoint (truncated or another format: "
                              f"{type(exc).__name__}: {first})") from exc

    def before_instantiate_classes(self) -> None:
        """Checks on the parsed configuration, before any class is built (the datamodule's constructor already reads
        the data root): the run name and runs directory, ``fit``'s epoch / step limits, and ``model.init.method``."""
        if self.subcommand is not None:
            self.run_dir  # noqa: B018 - the one name resolver: one folder name inside --runs_dir, links included
            check_runs_dir(self._value(self.config, "runs_dir"))
        self._check_typed_blocks()
        if self.subcommand == "fit":
            from impulsevit.run.preflight import check_epochs

            trainer_cfg = self._value(self.config, "trainer") or {}
            check_epochs(trainer_cfg.get("max_epochs"), trainer_cfg.get("max_steps"))
        init = self._value(self.config, "model")
        init = init.get("init") if init is not None else None
        if init is not None:
            from impulsevit.init import check_init_method

            check_init_method(init.get("method", "impulse"), init.get("options"))
        if self.subcommand is not None:
            self._place_trackers()
        importlib.import_module("impulsevit.training.strategies")  # registers `fsdp2` / `ddp_bf16` with Lightning
        importlib.import_module("impulsevit.models")  # registers impulsevit's architectures with timm

    def _resumes(self) -> bool:
        """``fit`` continuing its run: ``--resume`` / ``--ckpt_path`` given, or a requeued SLURM job."""
        requeued = slurm_restart_count() > 0
        given = self._value(self.config, "resume") is not None or self._value(self.config, "ckpt_path") is not None
        return self.subcommand == "fit" and (given or requeued)

    def _place_trackers(self) -> None:
        """``--tracker`` checked; the configured loggers' save location defaulted to the run directory, and on a
        resumed ``fit`` the W&B / MLflow run ids of ``<run>/trackers.json`` passed back
        (:mod:`impulsevit.training.trackers`)."""
        self._trackers = check_trackers(self._value(self.config, "tracker"))
        self._tracker_ids = resume_ids(self.run_dir) if self._resumes() else {}
        trainer = self._value(self.config, "trainer")
        check_logger_config(trainer.get("logger") if trainer is not None else None, self._trackers)
        if trainer is not None and trainer.get("logger") not in (None, True, False):
            place_logger_config(trainer.get("logger"), self.files_dir, self._tracker_ids)

    def _check_typed_blocks(self) -> None:
        """The ranges the typed blocks declare (``model.optimizer`` / ``scheduler`` / ``mixup``: their
        ``__post_init__``; ``data``'s ``batch_size`` / ``num_workers``), checked on the parsed values before any class
        is built: a bad value is the error even when the data root is missing, and under ``submit`` (which parses
        without building)."""
        from impulsevit.data.loading.base import check_batch_size, check_num_workers
        from impulsevit.training.config import MixupConfig, OptimizerConfig, SchedulerConfig, as_config

        model = self._value(self.config, "model")
        for key, cls in (("optimizer", OptimizerConfig), ("scheduler", SchedulerConfig), ("mixup", MixupConfig)):
            value = _plain(model.get(key)) if model is not None else None
            if isinstance(value, dict):
                try:
                    as_config(cls, value, key)
                except (ValueError, TypeError) as e:  # the block's own range check, naming the key
                    raise ConfigError(one_line(e)) from e
        data = self._value(self.config, "data")
        args = _plain(data.get("init_args")) if data is not None and hasattr(data, "get") else None
        if isinstance(args, dict):
            if isinstance(args.get("batch_size"), int):
                check_batch_size(args["batch_size"])
            if isinstance(args.get("num_workers"), int):
                check_num_workers(args["num_workers"])

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """LightningCLI's trainer, with impulsevit's defaults for what the recipe leaves unset (see the class)."""
        trainer_cfg = self._value(self.config_init, "trainer", default={})
        check_strategy(trainer_cfg.get("strategy"))
        kwargs.update(self._trainer_defaults(trainer_cfg))
        self.save_config_kwargs["run_dir"] = str(self.files_dir)
        checkpoint = self._value(self.config_init, "checkpoint")
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath is None:
            checkpoint.dirpath = os.path.realpath(self.run_dir / "checkpoints")
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except MisconfigurationException as e:  # e.g. accelerator=gpu where no GPU is visible: the settings' fault
            acc, dev = trainer_cfg.get("accelerator"), trainer_cfg.get("devices")
            raise ConfigError(f"trainer.accelerator={acc!r} / trainer.devices={dev!r} cannot run here: {one_line(e)} "
                              f"(torch sees {_visible_devices()}; set --trainer.accelerator / --trainer.devices to "
                              f"what this machine has)") from e
        for lg in trainer.loggers:
            guard_tracker(lg)  # an MLflow server that stops answering mid-run: dropped with one line, bounded waits
        return trainer

    def _trainer_defaults(self, trainer_cfg: Any) -> dict[str, Any]:
        """Root dir, logger, atomic checkpoint writes and precision, each where ``trainer_cfg`` does not set them."""
        defaults: dict[str, Any] = {}
        if trainer_cfg.get("default_root_dir") is None:
            defaults["default_root_dir"] = str(self.run_dir)
        configured = trainer_cfg.get("logger")
        if configured is not False:  # False: every logger off, Lightning's switch
            # validate/test/predict log (events, hparams.yaml, config.yaml) into <run_dir>/<subcommand>/, never over
            # the training run's files
            version = "" if self.subcommand in (None, "fit") else self.subcommand
            loggers = [] if configured in (None, True) else list(configured) if isinstance(configured, list | tuple) \
                else [configured]
            if self._value(self.config, "tensorboard", True):
                loggers.insert(0, TensorBoardLogger(save_dir=str(self.run_dir.parent), name=self.run_name,
                                                    version=version, default_hp_metric=False))
            trackers = getattr(self, "_trackers", [])
            loggers += tracker_loggers(trackers, self.files_dir, self.run_name, getattr(self, "_tracker_ids", {}))
            defaults["logger"] = loggers or False
        plugins = trainer_cfg.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list | tuple) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            defaults["plugins"] = [*plugins, AtomicCheckpointIO()]
        if trainer_cfg.get("precision") is None:
            defaults["precision"] = default_precision(trainer_cfg.get("accelerator"))
        return defaults

    def instantiate_classes(self) -> None:
        """LightningCLI's instantiation; an invalid model or data setting becomes a one-line :class:`ConfigError`."""
        try:
            with old_module_paths():
                super().instantiate_classes()
        except UserError:
            raise
        except (ValueError, TypeError, FileNotFoundError, KeyError) as e:
            chain: list[BaseException] = []
            cause: BaseException | None = e
            while cause is not None and cause not in chain:
                chain.append(cause)
                # an error raised `from None` is the one that names the problem: its hidden context is not followed
                cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
            user = next((c for c in chain if isinstance(c, UserError)), None)
            # jsonargparse wraps the class's own error in its "Does not validate against any of the Union subtypes
            # ... Given value: Namespace(...)" report: the innermost error is the one that names the problem
            raise (user if user is not None else ConfigError(one_line(chain[-1]))) from e

    def after_instantiate_classes(self) -> None:
        """Everything that can be checked before work starts, in this order: the data's class count, the checkpoint
        to resume (found, complete, not a smoke run's, fitting the model), the init method fitting the backbone
        (``fit`` from scratch), the run directory (``fit``: lock, existing run); nothing is written until the lock is
        taken, last. (The image size and ``model.init.method`` were checked while the classes were built / before.)"""
        if self.subcommand is None:
            return
        self._check_data_fits_model()
        path = self._checkpoint_to_load()
        if path is None:
            self._check_start_without_checkpoint()
        if self.subcommand == "fit" and path is not None and self._value(self.config, "resume") == "auto":
            self.finished = finished_run(path, self.trainer.max_epochs, self.trainer.max_steps)
            if self.finished is not None:
                log.info("impulsevit: %s is finished (%s; %s): nothing to resume; raise --trainer.max_epochs to "
                         "train on, or evaluate it: impulsevit test ... --resume auto", self.run_dir, self.finished,
                         path)
                return
        if self.subcommand == "fit" and launch_rank() == 0:
            resume = self._value(self.config, "resume") is not None
            self._own_run_dir(resuming=resume, ckpt_path=None if resume else path)

    def run_subcommand(self, subcommand: str) -> None:
        if self.finished is None:  # a finished run under `fit --resume auto`: no sanity check, no new event file
            super().run_subcommand(subcommand)
            if subcommand == "fit" and self.trainer.is_global_zero and not self.trainer.interrupted:
                log.info("%s", fit_summary(self.trainer, self.run_dir))

    def _check_data_fits_model(self) -> None:
        """The data has at least 2 classes (named with its dataset and root), and for ``fit`` at least one training
        batch per process (:meth:`BaseImageDataModule.check_fits_batch`). Its image size is the model's
        (``data.image_size`` is linked to ``model.img_size`` and checked against the backbone when it is built)."""
        from impulsevit.run.preflight import check_classes

        check_classes(self.datamodule.num_classes, _describe_data(self._value(self.config, "data")))
        if self.subcommand == "fit" and isinstance(self.datamodule, BaseImageDataModule):
            self.datamodule.check_fits_batch(int(self.trainer.world_size))

    def _checkpoint_to_load(self) -> Path | None:
        """The checkpoint ``--resume`` names (made the subcommand's ``ckpt_path``) or the ``--ckpt_path`` given,
        checked against the model; None when neither is given (or ``--resume auto`` found none for ``fit``)."""
        from impulsevit.run.preflight import check_resume, check_resume_loader, stored_step

        model, sub_init = self.model, self.config_init[self.subcommand]
        path = self._resume_path()
        given = path if path is not None else sub_init.get("ckpt_path")
        if given is not None and Path(given).is_dir() and (Path(given) / ".metadata").is_file():
            from lightning.pytorch.strategies import ModelParallelStrategy

            if not isinstance(self.trainer.strategy, ModelParallelStrategy):
                raise ConfigError(f"--resume {given}: a distributed checkpoint folder (written under "
                                  f"trainer.strategy=fsdp2), which this run's strategy "
                                  f"({type(self.trainer.strategy).__name__}) cannot read: resume it with "
                                  f"--trainer.strategy=fsdp2, or give a .ckpt file")
        if path is not None:
            check_resume(path, model, dict(model.hparams))
            if self.subcommand == "fit":
                check_resume_loader(path, self.datamodule)
                self.start_step = stored_step(path)
            log.info("impulsevit: %s %s", "resuming from" if self.subcommand == "fit" else "evaluating", path)
            sub_init["ckpt_path"] = str(path)
            if self.trust:  # checked by safe_load above, and trusted: Lightning loads it as it is
                sub_init["weights_only"] = False
        elif sub_init.get("ckpt_path") is not None:
            path = Path(sub_init["ckpt_path"])
            check_resume(path, model, dict(model.hparams))
            if self.subcommand == "fit":
                check_resume_loader(path, self.datamodule)
                self.start_step = stored_step(path)
            if self.trust:
                sub_init["weights_only"] = False
        return path

    def _resume_path(self) -> Path | None:
        """The checkpoint ``--resume`` names (``auto``: found in the run directory, skipped ones reported)."""
        resume = self._value(self.config, "resume")
        if resume is None:
            return None
        ckpt_path = self.config_init[self.subcommand].get("ckpt_path")
        if ckpt_path is not None:
            raise ConfigError(f"give either --resume ({resume!r}) or --ckpt_path ({ckpt_path!r}), not both")
        checkpoint = self._value(self.config_init, "checkpoint")
        extra = (checkpoint.dirpath,) if isinstance(checkpoint, ModelCheckpoint) and checkpoint.dirpath else ()
        return resume_checkpoint(resume, self.run_dir, self.subcommand, self.trainer, extra_dirs=extra)

    def _check_start_without_checkpoint(self) -> None:
        """``fit`` from scratch: the init method fits the backbone (or ``model.pretrained`` is loaded: a source that is
        missing, hostile or of another architecture stops here, before the run directory is taken); the other
        subcommands need ``--untrained``."""
        from impulsevit.run.preflight import check_init

        sub, model = self.subcommand, self.model
        if sub == "fit" and model.hparams.get("pretrained"):
            model.load_weights()  # read, checked and loaded once here, before the run directory is taken
        elif sub == "fit":
            cfg = model.init_cfg
            check_init(model.build_backbone, model.hparams.backbone, cfg.method, dict(cfg.options), cfg.seed)
        elif not self._value(self.config, "untrained"):
            raise ConfigError(f"impulsevit {sub} evaluates a trained model: give --resume auto (the newest checkpoint "
                              f"of {self.run_dir}) or --resume PATH; pass --untrained to evaluate the model as built")

    def _own_run_dir(self, resuming: bool, ckpt_path: Path | None = None) -> None:
        """Take the run directory's lock; refuse to start a new run over an existing one unless ``--overwrite``, and
        a ``--ckpt_path`` (not ``--resume``) into an existing one (:func:`~impulsevit.cli.run_policy.start_new_run`)."""
        self.run_lock = RunDirLock(self.run_dir)  # set first: __init__ releases it whatever fails after
        self.run_lock.acquire()
        requeued = slurm_restart_count() > 0
        if not resuming and not requeued:
            start_new_run(self.run_dir, overwrite=self._value(self.config, "overwrite"), ckpt_path=ckpt_path)


def _without_trust_flag(args: Any) -> tuple[Any, bool]:
    """``args`` (a list, or None: ``sys.argv[1:]``) without :data:`~impulsevit.safe_load.TRUST_FLAG`, and whether it
    was there (a dict of arguments is returned as it is)."""
    if args is None:
        rest, flag = split_trust_flag(sys.argv[1:])
        return (rest if flag else None), flag
    if isinstance(args, list | tuple):
        return split_trust_flag(list(args))
    return args, False


def fit_summary(trainer: Trainer, run_dir: Path) -> str:
    """The lines ``fit`` ends on: the run directory, the best and last checkpoints, the final val top-1, the
    TensorBoard command and every other tracker with where it wrote."""
    ckpt = trainer.checkpoint_callback
    metrics = trainer.callback_metrics
    acc = metrics.get("val/acc1")
    lines = [f"impulsevit: run finished: {run_dir}"]
    if isinstance(ckpt, ModelCheckpoint) and ckpt.best_model_path:
        score = f" ({ckpt.monitor} {float(ckpt.best_model_score):.4f})" if ckpt.best_model_score is not None else ""
        lines.append(f"  best checkpoint: {ckpt.best_model_path}{score}")
    if isinstance(ckpt, ModelCheckpoint) and ckpt.last_model_path:
        lines.append(f"  last checkpoint: {ckpt.last_model_path}")
    if acc is not None:
        lines.append(f"  final val/acc1:  {float(acc):.4f} (after {trainer.current_epoch} epoch(s), step "
                     f"{trainer.global_step})")
    if any(isinstance(lg, TensorBoardLogger) and Path(lg.log_dir) == run_dir for lg in trainer.loggers):
        lines.append(f"  TensorBoard:     tensorboard --logdir {run_dir.parent}")
    for lg in trainer.loggers:
        if not (isinstance(lg, TensorBoardLogger) and Path(lg.log_dir) == run_dir):
            lines.append(f"  {type(lg).__name__ + ':':<16} {describe(lg)}")
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    """A parsed block as a plain dict (jsonargparse ``Namespace`` or a dataclass instance); anything else as is."""
    import dataclasses

    if hasattr(value, "as_dict"):
        return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def _visible_devices() -> str:
    """``"2 CUDA device(s)"`` / ``"no CUDA device"``, for the accelerator error."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"{n} CUDA device(s)" if n else "no CUDA device"


def _checked_num_classes(num_classes: int | None) -> int | None:
    """The data's class count, linked to the model's; fewer than 2 is a :class:`ConfigError` (before the model is
    built, where torchmetrics would fail with a message that does not mention the data)."""
    from impulsevit.run.preflight import check_classes

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
