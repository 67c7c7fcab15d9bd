"""The ``impulsevit`` console script: ``main`` dispatches to a subcommand; ``run_trainer_command`` runs
``fit|validate|test|predict`` and turns a user's error into one line and an exit status."""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import sys
import threading
import warnings
from typing import Any

from impulsevit.cli.argv import prepare_argv
from impulsevit.cli.errors import one_line, user_error
from impulsevit.cli.extensions import load_plugins, split_plugins_flag
from impulsevit.cli.subcommands import ALL_SUBCOMMANDS, EXTERNAL_SUBCOMMANDS, TRAINER_SUBCOMMANDS, USAGE
from impulsevit.cli.trainer_cli import ImpulseCLI
from impulsevit.errors import ConfigError, UserError
from impulsevit.memory import reuse_large_allocations
from impulsevit.procs import adopt
from impulsevit.run.recipes import RecipeNotFoundError, format_listing

log = logging.getLogger("impulsevit")


class _StderrHandler(logging.StreamHandler):
    """A stream handler that writes to the *current* ``sys.stderr`` (redirections made after setup are honoured)."""

    @property
    def stream(self):  # noqa: ANN201
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


PROVIDERS: dict[str, tuple[str, str]] = {
    "convert": ("impulsevit.data.storage.convert_cli", "main"),
    "submit": ("impulsevit.cli.submit", "main"),
    "study": ("impulsevit.study", "main"),
    "demo": ("impulsevit.init.demo", "main"),
    "init": ("impulsevit.init.plugins", "main"),
    "data": ("impulsevit.cli.data_preview", "main"),
    "download": ("impulsevit.data.sources.download", "main"),
    "runs": ("impulsevit.run.runs", "main"),
    "probe": ("impulsevit.cli.probe", "main"),
}
"""Subcommand of :data:`~impulsevit.cli.subcommands.EXTERNAL_SUBCOMMANDS` -> (module, function(argv) -> exit status),
imported when that subcommand runs. Here, at the top of the command line, not beside the subcommand names: the
providers (``submit``, ``data preview``) parse the fit configuration with :mod:`impulsevit.cli.trainer_cli` and
:mod:`impulsevit.cli.argv`, which must not depend back on them."""


def run_external(sub: str, rest: list[str], debug: bool = False) -> int:
    """Run a subcommand of :data:`PROVIDERS` with its arguments; its exit status (2 when its module is not part of
    this installation)."""
    module, func = PROVIDERS[sub]
    try:
        fn = getattr(importlib.import_module(module), func)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            print(f"impulsevit {sub}: not available in this installation ({module} is missing)", file=sys.stderr)
            return 2
        raise
    try:
        return int(fn(rest) or 0)
    except UserError as e:  # a subcommand's own user error (e.g. study's ConfigError): one line, its exit status
        if debug:
            raise
        print(f"impulsevit {sub}: error: {one_line(e)}", file=sys.stderr)
        return e.exit_status


def _setup_logging() -> None:
    if not log.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class _DropMessages(logging.Filter):
    """Drops the records whose message contains one of ``parts``."""

    def __init__(self, *parts: str) -> None:
        super().__init__()
        self.parts = parts

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(p in str(record.msg) for p in self.parts)


_LIGHTNING_TIPS = _DropMessages("Tip: For seamless cloud")  # litlogger / litmodels adverts, on every run


class _DropConsoleOverride(logging.Filter):
    """Drops Lightning's notice that ``configure_callbacks`` replaces trainer callbacks when the replaced ones are
    only its default model summary and progress bar (``impulsevit.callbacks.console`` swaps them on every run)."""

    _PREFIX = "will override existing callbacks passed to Trainer: "

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if self._PREFIX not in msg:
            return True
        names = {n.strip() for n in msg.split(self._PREFIX, 1)[1].split(",")}
        return not names <= {"ModelSummary", "TQDMProgressBar"}


_CONSOLE_OVERRIDE = _DropConsoleOverride()


def _quiet_known_noise() -> None:
    """Silence, by their exact text, what every run printed that tells the user nothing: Lightning's advert tips and
    its notice that the console callbacks replace its default summary and progress bar (filters on its rank-zero
    logger), its hint to prepend ``srun`` (runs started outside ``srun`` on a SLURM login
    node are deliberate here; ``impulsevit submit`` starts the jobs under ``srun``) and the ``_pytree`` deprecation
    of Lightning's own code. Nothing else is filtered."""
    tips_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    for noise in (_LIGHTNING_TIPS, _CONSOLE_OVERRIDE):
        if noise not in tips_log.filters:
            tips_log.addFilter(noise)
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")
    # Lightning 2.6's own call of a torch API that torch deprecated (lightning/pytorch/utilities/_pytree.py), printed
    # at every loader / batch transfer setup; not the user's to act on
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated, use")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``impulsevit`` console script, and the process's one error boundary. Returns the exit status:
    0 done; 2 the command cannot work as given (bad arguments, values, names, a plugin module that does not import, no
    such accelerator, weights that do not fit the model: found before any work started); 1 the work failed for a
    reason outside the command line (full / read-only disk, a file missing or unreadable at run time, damaged data);
    130 / 143 after SIGINT / SIGTERM. Every subcommand and the plugin loading run inside the boundary: a user's
    mistake (:func:`impulsevit.cli.errors.user_error`, whose docstring is the full policy) is printed as the one line
    ``impulsevit SUB: error: ...``; anything else is a bug and keeps its traceback.

    ``--debug`` (anywhere) or ``IMPULSEVIT_DEBUG=1`` shows the traceback of those errors too. ``--plugins MOD[,MOD]``
    (anywhere), ``IMPULSEVIT_PLUGINS`` and the entry-point group ``impulsevit.plugins`` name modules imported first
    (:mod:`impulsevit.cli.extensions`)."""
    adopt()  # a DDP rank started by an impulsevit process dies with it; this process owns what it starts
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("IMPULSEVIT_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    _setup_logging()
    # the deprecated extension routes the user took (an init import path, a function entry point, ...) are shown, once
    # each, though Python hides a DeprecationWarning raised outside __main__
    warnings.filterwarnings("default", category=DeprecationWarning, message=r".*will be removed in impulsevit ")
    where = ["impulsevit"]  # the message's prefix: "impulsevit SUB" once the subcommand is known
    try:
        return _dispatch(argv, debug, where)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{' '.join(where)}: interrupted (exit 130)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the boundary: user errors become one line; anything else is re-raised
        found = None if debug else user_error(e)
        if found is None:
            raise
        message, status = found
        print(f"{' '.join(where)}: error: {message}", file=sys.stderr)
        return status


def _dispatch(argv: list[str], debug: bool, where: list[str]) -> int:
    """Load the plugins and run the subcommand ``argv`` names; ``where`` gets the subcommand's name once known."""
    # the user's registrations (datasets, init families) before anything reads a registry
    argv, plugins = split_plugins_flag(argv)
    load_plugins(plugins)
    if len(argv) > 1 and argv[0] == "predict" and not argv[1].startswith("-"):
        from impulsevit.tools.predict import main as predict_main  # `predict MODEL IMAGES`: a folder of images

        where.append("predict")
        return predict_main(argv[1:])
    try:
        argv = prepare_argv(argv)
    except RecipeNotFoundError as e:
        raise ConfigError(str(e)) from e
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    sub, rest = argv[0], argv[1:]
    if sub in ALL_SUBCOMMANDS:
        where.append(sub)
        if sub == "data" and rest and not rest[0].startswith("-"):
            where.append(rest[0])
    if sub == "recipes":
        print(format_listing())
        return 0
    if sub == "export":
        from impulsevit.tools.export import main as export_main

        return export_main(rest)
    if sub in EXTERNAL_SUBCOMMANDS:
        return run_external(sub, rest, debug)
    if sub not in TRAINER_SUBCOMMANDS:
        close = difflib.get_close_matches(sub, ALL_SUBCOMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"impulsevit: error: unknown subcommand {sub!r} (choose from {', '.join(ALL_SUBCOMMANDS)}){hint} "
              f"(impulsevit --help lists them)", file=sys.stderr)
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

    from impulsevit.cli.parser import ImpulseArgumentParser

    ImpulseArgumentParser.full_errors = debug
    _quiet_known_noise()
    previous_hook = threading.excepthook
    threading.excepthook = _quiet_disk_errors_in_threads
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
    finally:
        ImpulseArgumentParser.full_errors = False
        threading.excepthook = previous_hook
    return 0


def _quiet_disk_errors_in_threads(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook`` during a run: a full / read-only disk in a writer thread (TensorBoard's event writer)
    prints no traceback — the writer raises it again in the main thread at its next call, where it becomes the one
    ``cannot write RUN_DIR: no space left on device`` line. Anything else is printed as usual."""
    from impulsevit.io import disk_oserror

    if args.exc_value is not None and disk_oserror(args.exc_value) is not None:
        return
    threading.__excepthook__(args)

