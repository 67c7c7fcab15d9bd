"""``impulsevit submit``: write ``<runs-dir>/<name>/submit.sbatch`` for ``impulsevit fit`` and hand it to ``sbatch``.

Usage::

    impulsevit submit --recipe R [--name N] [--runs-dir D] [--nodes N --gpus-per-node G --cpus-per-task C --mem M
                      --time T --partition P --account A --qos Q --constraint X --exclusive --array K
                      --container-image IMG --signal-lead S --dry-run] [fit overrides …]

Everything not recognised here is passed to ``impulsevit fit`` unchanged (``--trainer.max_epochs=100``). Defaults come
from ``~/.config/impulsevit/slurm.yaml`` (:mod:`impulsevit.cluster.slurm_config`), flags override them.
``--dry-run`` prints the script and writes/submits nothing. When the recipe's FFCV ``.beton`` files are missing, a
conversion job (one node, all its cores, ``impulsevit convert``; :mod:`impulsevit.cli.convert_job`) is submitted
first and the training job waits for it with ``--dependency=afterok:<id>`` (``--no-convert-job`` turns this off).
A GPU job whose CPUs per task are fewer than the recipe's GPUs consume (:mod:`impulsevit.cluster.scaling`: the
GPU's training img/s over the loader's img/s per core, + 2; GPU type from ``--constraint``, else A100) gets a one-line
warning naming the recipe, the request and the need; it is still submitted.
Without ``sbatch`` on PATH the script is still written and the error names it, so it can be submitted by hand. Exit
codes: 0 submitted (or dry run), 1 ``sbatch`` missing or failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from impulsevit.argparser import ArgumentParser
from impulsevit.cli.convert_job import conversion_commands, convert_script_path, render_convert_sbatch
from impulsevit.cluster.events import events_path, job_state
from impulsevit.cluster.sbatch import FitJob, SlurmOptions, fit_command, recipe_data_workers, render_sbatch, task_cpus
from impulsevit.cluster.scaling import cpu_request_warning, gpu_from_constraint, read_recipe_layout
from impulsevit.cluster.slurm_config import config_path, load_defaults
from impulsevit.io import atomic_write_text
from impulsevit.run import recipes

# fit options the batch script sets itself (why), so they must not come in as fit overrides
_FIXED_KEYS = {"--trainer.devices": "from --gpus-per-node / --tasks-per-node", "--trainer.num_nodes": "from --nodes",
               "--trainer.accelerator": "from --gpus-per-node (0: cpu)", "--runs_dir": "use --runs-dir",
               "--resume": "always 'auto', so a requeued job finds its checkpoint"}


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="impulsevit submit", allow_abbrev=False,
                                description="Write an sbatch script for `impulsevit fit` and submit it.",
                                epilog="Unrecognised arguments are passed to `impulsevit fit`.")
    p.add_argument("--recipe", required=True, help="recipe file or name in recipes/ (as for `impulsevit fit`)")
    p.add_argument("--name", help="run name (default: the recipe's file name without .yaml)")
    p.add_argument("--runs-dir", default="runs", help="parent of the run directory (default ./runs)")
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node = tasks per node (0: a CPU job)")
    p.add_argument("--tasks-per-node", type=int, help="processes per node of a CPU job (default 1)")
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--mem")
    p.add_argument("--time", help="time limit in a SLURM format, e.g. 2-00:00:00")
    for name in ("--partition", "--account", "--qos", "--constraint", "--array", "--container-image"):
        p.add_argument(name)
    p.add_argument("--exclusive", action="store_true", default=None)
    p.add_argument("--signal-lead", type=int, dest="signal_lead_s",
                   help="seconds before the time limit at which SLURM sends USR1 (default 120); the job "
                        "checkpoints at the next training step, so make it longer than one validation pass")
    p.add_argument("--stage-to", dest="stage_to",
                   help="node-local directory (e.g. /local/scratch) to copy the "
                        "--data.init_args.storage.train_beton / storage.val_beton files to before training; the fit "
                        "reads the copies (for datasets that do not fit the page cache, e.g. IN-21K)")
    p.add_argument("--launcher", help="command that starts the CLI inside the job (default: this environment's "
                                      "impulsevit; e.g. 'apptainer exec --nv img.sif impulsevit')")
    p.add_argument("--slurm-config", help=f"defaults file (default {config_path()})")
    p.add_argument("--dry-run", action="store_true", help="print the script; write and submit nothing")
    p.add_argument("--no-convert-job", action="store_true",
                   help="do not submit a conversion job for missing FFCV .beton files (the training job's "
                        "prepare_data converts small datasets itself and stops on large ones)")
    return p


def resolve_recipe(recipe: str) -> str:
    """An absolute path for a recipe file or name (:func:`impulsevit.run.recipes.resolve_recipe`), so the job finds it
    from any directory; raises ``RecipeNotFoundError`` (a ``ValueError``) naming the closest recipes."""
    return str(recipes.resolve_recipe(recipe).resolve())


def default_launcher() -> str:
    """The ``impulsevit`` script of the running Python environment, so the job uses the same installation."""
    exe = Path(sys.executable).parent / "impulsevit"
    return str(exe) if exe.exists() else "impulsevit"


def build(argv: list[str]) -> tuple[FitJob, SlurmOptions, argparse.Namespace]:
    """Parse ``argv`` (+ the defaults file) into the job and its options.

    Raises ``ValueError`` (a bad option, naming it; an unknown recipe, naming the closest ones).
    """
    args, overrides = _parser().parse_known_args(argv)
    defaults = load_defaults(args.slurm_config)
    configured_launcher = defaults.pop("launcher", None)
    launcher = args.launcher or configured_launcher
    values = dict(defaults)
    for f in fields(SlurmOptions):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    opts = SlurmOptions(**values)
    opts.validate()
    for o in overrides:
        key = o.split("=", 1)[0]
        if key in _FIXED_KEYS:
            raise ValueError(f"{key} is set by the batch script ({_FIXED_KEYS[key]}); do not pass it as a fit override")
    recipe = resolve_recipe(args.recipe)
    if launcher is None:
        launcher = "impulsevit" if opts.container_image else default_launcher()
    job = FitJob(recipe=recipe, run_name=args.name or Path(recipe).stem, runs_dir=Path(args.runs_dir).resolve(),
                 workdir=Path.cwd(), fit_overrides=tuple(overrides), launcher=launcher,
                 data_workers=recipe_data_workers(recipe, overrides))
    return job, opts, args


def check_fit_config(job: FitJob, opts: SlurmOptions) -> None:
    """Parse the job's ``impulsevit fit`` command line exactly as ``fit`` will in the job (same parser, same errors
    and key suggestions, the run name checked), without building anything. ``%a`` (the array task id) is read as 0.

    Raises:
        SystemExit: the fit parser's error, already printed to stderr (status 2).
        ValueError: a run-name or other configuration error found before instantiation.
    """
    from impulsevit.cli.argv import prepare_argv
    from impulsevit.cli.trainer_cli import ImpulseCLI

    class _Parsed(Exception):
        pass

    class _ParseOnly(ImpulseCLI):
        error_prog = "impulsevit submit"  # its one-line error names submit, and `impulsevit fit --help` for the keys

        def before_instantiate_classes(self) -> None:
            super().before_instantiate_classes()
            raise _Parsed

    argv = [a.replace("%a", "0") for a in fit_command(job, opts)]
    try:
        _ParseOnly(args=prepare_argv(argv))
    except _Parsed:
        return


def cpu_warning(job: FitJob, opts: SlurmOptions) -> str | None:
    """A one-line warning when a GPU job's CPUs per task (flag, site default, or the recipe's workers + 2) are below
    what the recipe's GPUs consume (:mod:`impulsevit.cluster.scaling`; the GPU type from ``--constraint``, A100
    otherwise); ``None`` when enough, for CPU jobs, and for models without a throughput figure."""
    cpus = task_cpus(job, opts)[0]
    layout = read_recipe_layout(job.recipe, job.fit_overrides) if opts.gpus_per_node > 0 else None
    if layout is None or cpus is None:
        return None
    return cpu_request_warning(layout, gpu_from_constraint(opts.constraint), cpus)


def main(argv: list[str]) -> int:
    """Entry point of ``impulsevit submit``; returns the process exit code."""
    try:
        job, opts, args = build(argv)
        script = render_sbatch(job, opts)
        check_fit_config(job, opts)
        convert_cmds = [] if args.no_convert_job else conversion_commands(job)
        convert_script = render_convert_sbatch(job, opts, convert_cmds) if convert_cmds else None
    except SystemExit as e:  # submit's or the fit parser's error, already printed as one line (the fit parser's with
        if e.code in (0, None):  # the suggestions `fit` gives); nothing was submitted
            raise
        return 2
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"impulsevit submit: error: {e}", file=sys.stderr)
        return 2
    if (warning := cpu_warning(job, opts)) is not None:
        print(f"impulsevit submit: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        if convert_script is not None:
            sys.stdout.write(convert_script + "# ---- then, with --dependency=afterok:<conversion job id>:\n")
        sys.stdout.write(script)
        return 0

    run_dir = job.run_dir
    path = run_dir / "submit.sbatch"
    if job_state(run_dir) == "running":
        print(f"impulsevit submit: warning: {events_path(run_dir)} says a job is still running in {run_dir}; "
              "two jobs in one run directory overwrite each other's checkpoints", file=sys.stderr)
    atomic_write_text(path, script)
    (run_dir / "slurm").mkdir(exist_ok=True)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        print(f"impulsevit submit: error: `sbatch` not found on PATH; the script is written to {path} — "
              f"submit it by hand on a SLURM login node with:  sbatch {path}", file=sys.stderr)
        return 1
    dependency: list[str] = []
    if convert_script is not None:
        cpath = convert_script_path(job)
        atomic_write_text(cpath, convert_script)
        proc = subprocess.run([sbatch, "--parsable", str(cpath)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"impulsevit submit: error: sbatch failed (exit {proc.returncode}) for the conversion job {cpath}:\n"
                  f"{proc.stderr.strip()}", file=sys.stderr)
            return 1
        convert_id = proc.stdout.strip().split(";")[0]
        dependency = [f"--dependency=afterok:{convert_id}"]
        print(f"Submitted conversion job {convert_id} ({len(convert_cmds)} split(s) to .beton): "
              f"{run_dir / 'slurm' / f'convert-{convert_id}.out'}")
    proc = subprocess.run([sbatch, "--parsable", *dependency, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"impulsevit submit: error: sbatch failed (exit {proc.returncode}) for {path}:\n"
              f"{proc.stderr.strip()}", file=sys.stderr)
        return 1
    job_id = proc.stdout.strip().split(";")[0]
    log = run_dir / "slurm" / (f"{job_id}_<task>.out" if opts.array else f"{job_id}.out")
    print(f"Submitted batch job {job_id}")
    print(f"  script:      {path}")
    print(f"  log:         {log}")
    print(f"  events:      {events_path(run_dir)}")
    print(f"  run dir:     {run_dir}" + ("/task<ID>" if opts.array else ""))
    print(f"  checkpoints: {run_dir}{'/task<ID>' if opts.array else ''}/checkpoints")
    print(f"  tensorboard: tensorboard --logdir {run_dir}")
    return 0
