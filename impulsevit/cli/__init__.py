"""The ``impulsevit`` command: ``fit|validate|test|predict`` (LightningCLI) plus ``recipes``, ``export`` and the
subcommands other modules provide (``convert``, ``submit``, ``study``, ``demo``); ``predict MODEL IMAGES`` (a
positional argument after ``predict``) is :mod:`impulsevit.tools.predict`, not LightningCLI's.

``impulsevit fit --recipe NAME_OR_PATH [--dotted.key=value ...]``:

- ``--recipe`` is an alias of LightningCLI's ``--config`` (repeatable, merged in order); a NAME resolves to
  ``recipes/NAME.yaml`` (see :mod:`impulsevit.run.recipes`). It must come after the subcommand; ``impulsevit --recipe x
  fit`` is rewritten to ``impulsevit fit --recipe x``.
- ``data.num_classes`` is linked to ``model.num_classes``; the global batch is read by the module from the trainer.

What a run writes, ``--resume``, the one writer per run directory and ``validate|test|predict``'s checkpoint rule are
described for users in docs/usage.md ("A run and its folder"); the one-line errors, what a failed command leaves
behind and the exit status of every subcommand in docs/guarantees.md. In code: :mod:`impulsevit.cli.run_policy` (run
directory, ``--resume``), :mod:`impulsevit.run.rundir` (the lock), :mod:`impulsevit.cli.errors` (which errors are one
line; ``main`` in :mod:`impulsevit.cli.entry` is the process's one error boundary), :mod:`impulsevit.run.preflight`
(the checks before any work).

Not supported: remote run directories (fsspec URLs).
"""


# What lives where: entry.py (main, run_trainer_command), subcommands.py (the subcommand table, usage), argv.py (the
# command line as LightningCLI gets it), parser.py (closest-key suggestions), trainer_cli.py (ImpulseCLI), run_policy.py
# (run directory, --resume), errors.py (which errors are the user's to fix); config.yaml is written by
# callbacks/config_saver.py.
from impulsevit.callbacks.config_saver import RunConfigSaver
from impulsevit.cli.argv import RecipeSyntaxError, check_recipe_syntax, prepare_argv
from impulsevit.cli.entry import main, run_trainer_command
from impulsevit.cli.errors import user_error
from impulsevit.cli.parser import ImpulseArgumentParser
from impulsevit.cli.run_policy import run_dir_of
from impulsevit.cli.subcommands import USAGE
from impulsevit.cli.trainer_cli import ImpulseCLI

__all__ = [
    "USAGE",
    "ImpulseArgumentParser",
    "ImpulseCLI",
    "RecipeSyntaxError",
    "RunConfigSaver",
    "check_recipe_syntax",
    "main",
    "prepare_argv",
    "run_dir_of",
    "run_trainer_command",
    "user_error",
]
