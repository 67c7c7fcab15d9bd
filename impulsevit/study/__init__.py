"""`impulsevit study`: every init method × seed of one recipe, then a report (mean ± std table and accuracy curves).

Modules: :mod:`~impulsevit.study.plan` (the plan and the recipe headers it reads; pure),
:mod:`~impulsevit.study.paired` (paired differences by seed and their t interval; pure),
:mod:`~impulsevit.study.report` (reading the runs back, ``report.md`` / ``report.json`` / ``report.png``; what the
paired difference from the reference method means),
:mod:`~impulsevit.study.launch` (the command: fit subprocesses, SLURM array tasks, submission); every file the study
writes goes through :mod:`impulsevit.io`'s atomic writes.

Layout: ``<runs-dir>/<study>/`` holds ``study.json`` (the plan: recipe, methods, seeds, overrides), one run directory
per ``<method>-s<seed>`` (written by ``impulsevit fit``), ``report.md``, ``report.json`` and ``report.png``. Each run
records its own outcome in ``<run>/status.json`` (``running`` / ``done`` / ``failed`` with the exit code /
``interrupted``), so ``--collect`` (alias ``--report-only``: no training) can rebuild the report at any time and lists
failed or unfinished runs instead of dropping them; ``--json`` prints ``report.json`` instead of the markdown.
SIGTERM / SIGINT stop a local study after the running fit's checkpoint: that run is ``interrupted`` (with the signal
and the fit's exit code), nothing more starts, the study exits 143 / 130; the same command again skips the finished
runs and continues the interrupted one (``--resume auto``). Each fit dies with the study, even after ``kill -9``
(:mod:`impulsevit.procs`).

Metrics come from the runs' TensorBoard event files: ``val/acc1`` per validation (one point per epoch), ``test/acc1``
when a test was run. "final" = the last validation, "best" = the maximum over epochs.

Paper numbers: a recipe may carry a machine-readable header comment ``# paper: {torch: 71.67, impulse: 77.02}``
(top-1 %, keyed by init method); the report prints them beside the measured means.

Per-method settings: a header ``# study: {methods: [impulse, box, random], overrides: {random:
[--model.backbone_kwargs.spatial_trainable=true]}}`` gives the default ``--methods`` and extra ``impulsevit fit``
arguments for the runs of one method (e.g. a ConvMixer ablation where only the ``random`` runs train their spatial
filters); ``reference: METHOD`` names the method the paired differences are taken against (``--reference`` wins;
default ``torch`` when it is a method, else the first). Each run is ``impulsevit fit --recipe R --model.init.method=M
--model.init.seed=S --seed_everything=S <method's overrides> <the study's command-line overrides>`` (later arguments
win); the data order and augmentation come from the recipe's data seed (``data.init_args.seed``, default 0), the same
for every run of the study.

SLURM (``--submit``): one array job with a task per run, written and submitted by ``impulsevit submit`` (resource
flags such as ``--nodes``, ``--gpus-per-node``, ``--time``, ``--partition`` go to it; the rest are fit overrides).
Each task starts ``impulsevit study --array-task <study dir> fit …``, which maps ``$SLURM_ARRAY_TASK_ID`` to its
plan entry and runs that fit in ``<study>/<method>-s<seed>/`` with the job's requeue machinery (signals are forwarded
to the fit), recording ``status.json`` like a local run; ``impulsevit study --collect`` then builds the report.

Pipelines (``--then DOWNSTREAM_RECIPE``, :mod:`~impulsevit.study.stages`): after the pre-training runs, each run's
last checkpoint is fine-tuned (``<run>-ft``) and probed (``<run>-probe``) on the downstream recipe, and
``report.md`` gets a section with pre-train, probe, k-NN and fine-tune accuracy side by side, per seed.

Not supported: collecting from runs that log no ``val/acc1``; mixing recipes within one study.
"""

from impulsevit.study.launch import main, run_fit
from impulsevit.study.paired import PairedDifference, paired_difference
from impulsevit.study.plan import DEFAULT_METHODS, paper_numbers, plan_runs, reference_method, run_args, study_header
from impulsevit.study.report import RunResult, collect, paired_differences, read_scalars, write_report

__all__ = ["RunResult", "plan_runs", "collect", "write_report", "paper_numbers", "study_header", "run_args", "main",
           "run_fit", "read_scalars", "DEFAULT_METHODS", "PairedDifference", "paired_difference", "paired_differences",
           "reference_method"]
