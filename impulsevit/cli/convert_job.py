"""The FFCV conversion job ``impulsevit submit`` puts in front of a training job whose ``.beton`` files are missing.

:func:`conversion_commands` instantiates the recipe's datamodule exactly as ``impulsevit fit`` would (same parser,
same overrides; :func:`impulsevit.cli.fit_datamodule.build_datamodule`) and asks it which splits have no complete
``.beton`` and which ``impulsevit convert`` command writes each (the ffcv backend's ``convert_command``: same path,
preset, subset and request, so the training job's ``prepare_data`` finds them up to date). :func:`render_convert_sbatch`
writes one job on one node with all its cores (``--exclusive``; ``--workers`` = ``$SLURM_CPUS_ON_NODE``) that runs
them in order; the training job is then submitted with ``--dependency=afterok:<conversion job id>``, so it starts
only when every split converted. The conversion job's output goes to ``<run dir>/slurm/convert-<job id>.out``.

Not supported: datamodules other than :class:`~impulsevit.data.loading.datamodule.ImageDataModule` (nothing to convert),
per-task data settings in array jobs (``%a`` in a data override: the data of task 0 is converted).
"""

from __future__ import annotations

import contextlib
import io
import shlex
import sys
from pathlib import Path

from impulsevit.cluster.sbatch import FitJob, SlurmOptions

__all__ = ["conversion_commands", "convert_script_path", "render_convert_sbatch"]


def conversion_commands(job: FitJob) -> list[list[str]]:
    """``impulsevit convert`` argvs (without the launcher) for the splits of ``job``'s recipe + overrides that
    have no complete ``.beton``; empty when nothing needs converting (or the backend is not FFCV)."""
    from impulsevit.cli.fit_datamodule import build_datamodule

    overrides = [o.replace("%a", "0") for o in job.fit_overrides]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            dm = build_datamodule(["--recipe", job.recipe, *overrides])
    except SystemExit:  # the job itself will report it; no conversion can be planned from an unparsable recipe
        lines = [ln for ln in errors.getvalue().splitlines() if "error" in ln.lower()] or ["(no message)"]
        print(f"impulsevit submit: warning: no conversion job planned: the recipe does not parse as for "
              f"`impulsevit fit`: {lines[0].strip()}", file=sys.stderr)
        return []
    except Exception as exc:  # noqa: BLE001 - e.g. unreadable .beton overrides: the training job reports them itself
        print(f"impulsevit submit: warning: no conversion job planned: the data section cannot be built here "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return []
    todo = getattr(dm, "splits_to_convert", lambda: [])()
    backend = getattr(dm, "data_backend", None)
    commands = [backend.convert_command(split, workers="${SLURM_CPUS_ON_NODE:-1}")[1:] for split in todo]
    if commands and getattr(dm, "download", False):  # data.init_args.download: fetch before converting
        commands.insert(0, ["download", dm.info.name, str(dm.root), "--verify", dm.verify])
    return commands


def _arg(word: str) -> str:
    """Quote for bash, leaving the ``${SLURM_CPUS_ON_NODE:-1}`` expansion live."""
    if word.startswith("${") and word.endswith("}"):
        return f'"{word}"'
    return shlex.quote(word)


def render_convert_sbatch(job: FitJob, opts: SlurmOptions, commands: list[list[str]]) -> str:
    """The conversion job's batch script: one node, one task, the whole node (``--exclusive``), the site options of
    ``opts`` (partition, account, qos, time, constraint, mem, setup lines), ``commands`` run in order; fails on the
    first failing one."""
    log_dir = job.run_dir / "slurm"
    sb = [f"--job-name={job.run_name}-convert", "--nodes=1", "--ntasks=1", "--exclusive",
          f"--output={log_dir}/convert-%j.out"]
    for key in ("mem", "time", "partition", "account", "qos", "constraint"):
        value = getattr(opts, key)
        if value is not None:
            sb.append(f"--{key.replace('_', '-')}={value}")
    prefix: list[str] = []
    if opts.container_image:  # as the training job: pyxis/enroot with the working and run directories mounted
        mounts = sorted({str(job.workdir), str(job.runs_dir)})
        prefix = ["srun", shlex.quote(f"--container-image={opts.container_image}"),
                  shlex.quote(f"--container-mounts={','.join(f'{m}:{m}' for m in mounts)}"),
                  shlex.quote(f"--container-workdir={job.workdir}")]
    lines = [
        "#!/bin/bash",
        f"# Written by `impulsevit submit`: FFCV conversion for recipe {job.recipe} (run {job.run_name}); the training",
        "# job waits for it (--dependency=afterok).",
        *(f"#SBATCH {o}" for o in sb),
        "",
        "set -euo pipefail",
        f"cd {shlex.quote(str(job.workdir))}",
        *opts.setup,
        *(" ".join([*prefix, job.launcher, *map(_arg, cmd)]) for cmd in commands),
        "",
    ]
    return "\n".join(lines)


def convert_script_path(job: FitJob) -> Path:
    return job.run_dir / "convert.sbatch"
