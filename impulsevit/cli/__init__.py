"""The ``impulsevit`` command: ``fit|validate|test|predict`` (LightningCLI) plus ``recipes``, ``export`` and the
subcommands other modules provide (``convert``, ``submit``, ``study``, ``demo``); ``predict MODEL IMAGES`` (a
positional argument after ``predict``) is :mod:`impulsevit.tools.predict`, not LightningCLI's.

``impulsevit fit --recipe NAME_OR_PATH [--dotted.key=value ...]``:

- ``--recipe`` is an alias of LightningCLI's ``--config`` (repeatable, merged in order); a NAME resolves to
  ``recipes/NAME.yaml`` (see :mod:`impulsevit.run.recipes`). It must come after the subcommand; ``impulsevit --recipe x
  fit`` is rewritten to ``impulsevit fit --recipe x``.
- Every run writes to ``<runs_dir>/<name>/`` (``--name``, default the first recipe's file name; ``--runs_dir`` /
  ``--runs-dir``, default ``./runs``): ``config.yaml`` (the resolved config, rewritten on every start so a requeued or
  resumed job never aborts on it), TensorBoard event files (no ``version_N`` subfolder), ``checkpoints/last.ckpt``
  and the top-k checkpoints by ``val/acc1`` (``--checkpoint.*`` configures Lightning's ``ModelCheckpoint``), and
  Lightning's SLURM ``hpc_ckpt_*.ckpt`` files. All checkpoint writes are atomic
  (:mod:`impulsevit.training.checkpointing`).
- ``--resume auto``: continue from the newest complete checkpoint of the run directory, or start fresh when there is
  none; checkpoints it passes over (truncated, or written by a ``fast_dev_run`` / different ``limit_*_batches`` smoke
  run) are named with the reason. ``--resume PATH``: from that checkpoint. Either is checked against the model (keys,
  shapes, differing settings) before any work. ``validate|test|predict`` evaluate the resolved checkpoint and refuse
  to run without one unless ``--untrained``; they log (events, ``hparams.yaml``, ``config.yaml``) into
  ``<run_dir>/<subcommand>/`` and never touch the training run's files.
- One owner per run directory (:mod:`impulsevit.run.rundir`): ``--name`` is a single folder name; ``fit`` holds
  ``<run_dir>/.lock`` while it runs (a second writer stops with the owner's host / pid / SLURM job; stale locks and a
  requeued job's own lock are taken over); ``fit`` into an existing run without ``--resume`` refuses (``--overwrite``
  deletes the old run's files first).
- Errors a user can fix (bad settings found before work, a run directory in use, a full / read-only disk, a damaged
  ``.beton``, a missing file, a plugin module that raises, an accelerator the machine lacks, weights that do not fit)
  print one line ``impulsevit SUB: error: ...`` and exit 2 (before any work) or 1, for every subcommand: ``main`` is
  the process's one error boundary, :mod:`impulsevit.cli.errors` the policy; ``--debug`` /
  ``IMPULSEVIT_DEBUG=1`` shows the traceback. Nothing is written before these checks pass
  (:mod:`impulsevit.run.preflight`).
- Misspelled keys fail with the key and the closest valid one; unknown recipe names name the closest ones
  (``impulsevit recipes`` lists all).
- ``data.num_classes`` is linked to ``model.num_classes``; the global batch is read by the module from the trainer.
- The global RNG states travel in the checkpoints, per rank
  (:class:`~impulsevit.callbacks.rng_state.RNGStateCheckpoint`; ranks are seeded ``seed_everything + global_rank``),
  and so does the training loaders' position: ``--resume auto`` after any graceful stop continues bit-exactly (see
  the README's resume section).
- Exit status: 0 when finished, 143 after SIGTERM, 130 after SIGINT (each after the stop checkpoint is written), 0
  after a SIGUSR1 that requeued the SLURM job; argument errors exit with 2.

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
