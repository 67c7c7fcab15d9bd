"""How a study runs: ``impulsevit study`` argument handling, one ``impulsevit fit`` subprocess per plan entry (with
signal forwarding and ``status.json``), the SLURM array task entry, and submission through ``impulsevit submit``."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from impulsevit.argparser import ArgumentParser
from impulsevit.errors import ConfigError
from impulsevit.io import atomic_write_json, child_path, claim_output, read_json
from impulsevit.procs import forward_signals, popen
from impulsevit.study.plan import (
    DEFAULT_METHODS,
    paper_numbers,
    plan_conflicts,
    plan_entry_args,
    plan_runs,
    recipe_digest,
    reference_method,
    run_args,
    study_header,
)
from impulsevit.study.report import collect, paired_summary, write_report
from impulsevit.study.stages import finetune_args, probe_args, then_plan

__all__ = ["run_fit", "main"]

_STOPS = (signal.SIGTERM, signal.SIGINT)  # the study stops after the running fit's checkpoint
_FORWARDED = (signal.SIGUSR1, *_STOPS)  # passed on to the running fit (USR1: SLURM's requeue warning)


def _fit_state(rc: int, received: list[int]) -> str:
    """``status.json``'s state of a fit that exited with ``rc`` while ``received`` signals reached the study."""
    if rc != 0 and any(sig in _STOPS for sig in received):
        return "interrupted"  # checkpointed and stopped (143 / 130, or stopped at once by a second Ctrl-C)
    if signal.SIGUSR1 in received:
        return "requeued"
    return "done" if rc == 0 else "failed"


def _run_fit(cmd: list[str], rdir: Path, record: bool) -> tuple[int, str, list[int]]:
    rdir.mkdir(parents=True, exist_ok=True)
    if record:
        atomic_write_json(rdir / "status.json", {"state": "running", "started": time.time()}, indent=2)
    t0, received = time.time(), []
    with open(rdir / "study_fit.log", "ab") as log:
        # its own process group: a Ctrl-C in the terminal reaches the fit once, forwarded from here (twice would
        # stop it at once, without its checkpoint); it dies with this process (SIGTERM: it checkpoints first)
        proc = popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, new_group=True,
                     death_signal=signal.SIGTERM)
        with forward_signals(lambda: proc, _FORWARDED, received):
            rc = proc.wait()
    state = _fit_state(rc, received)
    if record:
        status = {"state": state, "returncode": rc, "seconds": time.time() - t0}
        stops = [signal.Signals(sig).name for sig in received if sig in _STOPS]
        if state == "interrupted":
            status["signal"] = stops[0]
        atomic_write_json(rdir / "status.json", status, indent=2)
    return rc, state, received


def run_fit(cmd: list[str], rdir: Path, *, record: bool = True) -> int:
    """Run one ``impulsevit fit`` subprocess, output appended to ``<run>/study_fit.log``; ``status.json`` records
    ``running`` then ``done`` / ``failed`` (exit code) / ``interrupted`` (SIGTERM or SIGINT reached this process: the
    fit checkpointed and stopped; ``--resume auto`` continues it) / ``requeued`` (SLURM's USR1: the fit checkpointed
    and the job was requeued). USR1 / TERM / INT received here are forwarded to the fit (its ``SlurmRequeue``
    handlers only set a flag, so a USR1 or TERM that reaches both processes is harmless); the fit runs in its own
    process group, so a terminal's Ctrl-C reaches it once, from here, and it dies with this process
    (:mod:`impulsevit.procs`). Returns the exit code."""
    return _run_fit(cmd, rdir, record)[0]


def _fit_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "impulsevit.cli", *args]


def _fit_args(study_dir: Path, recipe: str, run: dict[str, Any], overrides: list[str]) -> list[str]:
    """The ``impulsevit fit`` arguments of one plan entry (run by :func:`_run_one`, printed by ``--dry-run``)."""
    return ["fit", "--recipe", recipe, "--runs-dir", str(study_dir), "--name", run["name"], "--resume", "auto",
            *plan_entry_args(run), *overrides]


def _run_one(study_dir: Path, recipe: str, run: dict[str, Any], overrides: list[str]) -> tuple[int, str, list[int]]:
    cmd = _fit_command(*_fit_args(study_dir, recipe, run, overrides))
    return _run_fit(cmd, _run_dir(study_dir, run), True)


def _run_dir(study_dir: Path, run: dict[str, Any]) -> Path:
    """The folder of a plan entry: its name (from ``study.json``) through the one name resolver."""
    return child_path(study_dir, run["name"], f"{study_dir / 'study.json'}: run name",
                      "a run of a study is one folder inside the study")


def _array_task(study_dir: Path, fit_argv: list[str]) -> int:
    """Inside a SLURM array task: run the plan entry ``$SLURM_ARRAY_TASK_ID`` with the job's ``impulsevit fit`` argv
    (from ``impulsevit submit``: devices, nodes, requeue callback, the study's overrides), renamed to the run's
    directory and with the run's own arguments added. Only ``SLURM_PROCID`` 0 writes ``status.json``."""
    plan_file = study_dir / "study.json"
    if not plan_file.exists():
        raise SystemExit(f"impulsevit study --array-task: {plan_file} not found")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if task is None or not task.isdigit():
        raise SystemExit(f"impulsevit study --array-task: SLURM_ARRAY_TASK_ID is {task!r}, expected a task index")
    plan = read_json(plan_file)
    if int(task) >= len(plan["runs"]):
        raise SystemExit(f"impulsevit study --array-task: task {task} but {plan_file} plans {len(plan['runs'])} runs")
    run = plan["runs"][int(task)]
    if not fit_argv or fit_argv[0] != "fit":
        raise SystemExit(f"impulsevit study --array-task: expected an `impulsevit fit` argv after the study dir, "
                         f"got {fit_argv[:3]}")
    argv = list(fit_argv)
    for flag, value in (("--name", run["name"]), ("--runs-dir", str(study_dir))):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    # the run's own arguments go right after the recipe (they override it; the job's overrides still win)
    at = argv.index("--recipe") + 2 if "--recipe" in argv else 1
    print(f"[study] array task {task}: {run['name']}", flush=True)
    cmd = _fit_command(*argv[:at], *plan_entry_args(run), *argv[at:])
    return run_fit(cmd, _run_dir(study_dir, run), record=os.environ.get("SLURM_PROCID", "0") == "0")


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="impulsevit study",
        description="Run a recipe with several init methods × seeds and report mean ± std (see impulsevit/study/).",
        epilog="Other arguments are `impulsevit fit` overrides for every run (with --submit also `impulsevit "
               "submit` resource flags).",
    )
    p.add_argument("--recipe", required=True, help="recipe name (see `impulsevit recipes`) or path")
    p.add_argument("--methods", default=None,
                   help="comma-separated init methods (default: the recipe's '# study:' header, else "
                        "impulse,mimetic,torch)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method")
    p.add_argument("--name", default=None, help="study name (default: <recipe>-study)")
    p.add_argument("--runs-dir", "--runs_dir", dest="runs_dir", default="runs",
                   help="where the study folder goes (default: runs)")
    p.add_argument("--collect", "--report-only", dest="collect", action="store_true",
                   help="only rebuild the report from the run directories (no training)")
    p.add_argument("--reference", default=None,
                   help="the method the report's paired differences are taken against (default: the recipe's "
                        "'# study:' reference, else torch when it is a method, else the first method)")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON (report.json) instead of the markdown")
    p.add_argument("--run-index", type=int, default=None, help="run only this entry of the plan")
    p.add_argument("--submit", action="store_true", help="submit the plan as a SLURM array instead of running here")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (every run's `impulsevit fit` command; with --submit the sbatch script) and "
                        "write, run and submit nothing")
    p.add_argument("--then", default=None, metavar="RECIPE",
                   help="a pipeline: fine-tune and probe every pre-training run's last checkpoint on this recipe "
                        "(impulsevit/study/stages.py); the report shows both stages paired by seed")
    p.add_argument("--then-args", default="", metavar="ARGS",
                   help="with --then: fit / probe overrides of the downstream stage only, one shell-quoted string")
    return p


# fit arguments the study sets for every run itself: an override of them would move the runs out of the study folder or
# make every run the same method / seed (the report would then count wrong runs), so they are refused before any work
_OWNED = {"--resume": "the study resumes each run itself (--resume auto)",
          "--model.init.method": "choose the methods with --methods",
          "--model.init": "choose the methods with --methods",
          "--model.init.seed": "choose the seeds with --seeds", "--seed_everything": "choose the seeds with --seeds",
          "--trainer.default_root_dir": "the study places its runs in <runs-dir>/<name>/"}


def check_overrides(overrides: list[str]) -> None:
    """Refuse the ``impulsevit fit`` overrides that the study itself sets per run (:data:`_OWNED`).

    Raises:
        ConfigError: names the argument and what to use instead.
    """
    for arg in overrides:
        key = arg.split("=", 1)[0]
        if key in _OWNED:
            raise ConfigError(f"{key} cannot be passed to a study: {_OWNED[key]}")


def check_tracker_overrides(overrides: list[str]) -> None:
    """The ``--tracker`` of the fit overrides (``--tracker X`` / ``--tracker=X``, the last one wins as in ``fit``),
    checked once as ``fit`` checks it (:func:`~impulsevit.training.trackers.check_trackers`: known, installed, able to
    start), so that a tracker that cannot start is one line before the first run, not a failure of every run.

    Raises:
        ConfigError: ``fit``'s one line.
    """
    spec = None
    for i, arg in enumerate(overrides):
        if arg == "--tracker" and i + 1 < len(overrides):
            spec = overrides[i + 1]
        elif arg.startswith("--tracker="):
            spec = arg.split("=", 1)[1]
    if spec:
        from impulsevit.training.trackers import check_trackers

        check_trackers(spec)


def _new_plan(args: argparse.Namespace, recipe_path: Path, overrides: list[str]) -> dict[str, Any]:
    """The ``study.json`` content for these arguments (methods from ``--methods``, else the recipe's header)."""
    header = study_header(recipe_path)
    methods = args.methods.split(",") if args.methods is not None else header["methods"] or DEFAULT_METHODS
    runs = plan_runs(list(dict.fromkeys(m.strip() for m in methods if m.strip())), args.seeds)
    plan = {
        "recipe": str(recipe_path), "recipe_sha256": recipe_digest(recipe_path),
        "methods": list(dict.fromkeys(m for m, _, _ in runs)), "seeds": args.seeds, "overrides": overrides,
        "runs": [{"method": m, "seed": s, "name": n, "args": run_args(m, s, header["overrides"])} for m, s, n in runs],
    }
    if args.then is not None:
        from impulsevit.run.recipes import resolve_recipe

        then_args = shlex.split(args.then_args)
        check_overrides(then_args)
        check_tracker_overrides(then_args)
        plan["then"] = then_plan(resolve_recipe(args.then).resolve(), plan["runs"], then_args)
    return plan


def _check_continues(study_dir: Path, stored: dict[str, Any], plan: dict[str, Any]) -> None:
    """Refuse (one line, before anything is written or started) to continue a study whose runs were started under
    other settings (:func:`~impulsevit.study.plan.plan_conflicts`): the finished ones would be skipped and reported
    beside new ones as if one configuration. More seeds or methods continue it; a plan whose runs never started is
    replaced."""
    conflicts = plan_conflicts(stored, plan)
    started = [r["name"] for r in stored.get("runs") or [] if _run_dir(study_dir, r).exists()]
    if conflicts and started:
        raise ConfigError(f"{study_dir / 'study.json'}: {len(started)} run(s) of this study were started with other "
                          f"settings ({'; '.join(conflicts)}); continuing would report both as one: give the same "
                          f"settings (--seeds and --methods may grow), or another --name")


def _check_run_index(plan: dict[str, Any], run_index: int | None) -> None:
    if run_index is not None and not 0 <= run_index < len(plan["runs"]):
        n = len(plan["runs"])
        raise ConfigError(f"--run-index {run_index}: the plan has {n} runs (0..{n - 1})")


def _print_plan(study_dir: Path, plan: dict[str, Any], run_index: int | None) -> None:
    """``--dry-run`` without ``--submit``: one line per plan entry (its index for ``--run-index``, name, state and
    the ``impulsevit fit`` command the study would run), then the downstream stage's runs; nothing is written."""
    _check_run_index(plan, run_index)
    indexed = list(enumerate(plan["runs"]))
    for i, run in indexed if run_index is None else [indexed[run_index]]:
        status = _run_dir(study_dir, run) / "status.json"
        state = read_json(status).get("state", "?") if status.exists() else "to run"
        cmd = ["impulsevit", *_fit_args(study_dir, plan["recipe"], run, plan["overrides"])]
        print(f"[study] {i} {run['name']} ({state}): {shlex.join(cmd)}")
    if run_index is None and plan.get("then"):
        for entry in plan["then"]["runs"]:
            print(f"[study] then {entry['name']} and {entry['probe']}: fine-tune and probe {entry['source_run']} "
                  f"on {plan['then']['recipe']}")
    print(f"[study] dry run: {len(plan['runs'])} runs planned in {study_dir}; nothing was written or started")


def _run_plan(study_dir: Path, plan: dict[str, Any], run_index: int | None) -> tuple[int, str] | None:
    """Run the plan's entries here, one after the other (or only ``run_index``); finished ones are skipped. A
    SIGTERM / SIGINT stops the study after the running fit's checkpoint (that run is ``interrupted``) or, between
    runs, before the next one: returns ``(signal, run name or "")``, else None."""
    _check_run_index(plan, run_index)
    with forward_signals(lambda: None, _STOPS) as between:  # a signal between two runs: start nothing more
        for run in plan["runs"] if run_index is None else [plan["runs"][run_index]]:
            if between:
                return between[0], ""
            status = _run_dir(study_dir, run) / "status.json"
            if status.exists() and read_json(status).get("state") == "done":
                print(f"[study] {run['name']}: already done, skipped", flush=True)
                continue
            print(f"[study] {run['name']}: fit {plan['recipe']} {' '.join(plan_entry_args(run))}", flush=True)
            rc, state, received = _run_one(study_dir, plan["recipe"], run, plan["overrides"])
            stops = [sig for sig in (*received, *between) if sig in _STOPS]
            if stops:  # an interrupted run is named by main's one line; a run that ended anyway is said here
                if state != "interrupted":
                    print(f"[study] {run['name']}: {state} (exit {rc})", flush=True)
                return stops[0], run["name"] if state == "interrupted" else ""
            print(f"[study] {run['name']}: {'done' if rc == 0 else f'FAILED (exit {rc})'}", flush=True)
        if run_index is None and plan.get("then"):
            return _run_then(study_dir, plan, between)
    return None


def _run_then(study_dir: Path, plan: dict[str, Any], between: list[int]) -> tuple[int, str] | None:
    """The downstream stage (:mod:`impulsevit.study.stages`): a fine-tune and a probe of every finished
    pre-training run; done ones are skipped, a stop signal ends it as for the pre-training runs."""
    then = plan["then"]
    for entry in then["runs"]:
        if between:
            return between[0], ""
        pre_status = study_dir / entry["source_run"] / "status.json"
        if not (pre_status.exists() and read_json(pre_status).get("state") == "done"):
            print(f"[study] {entry['name']}: skipped ({entry['source_run']} is not done)", flush=True)
            continue
        rdir = child_path(study_dir, entry["name"], "study.json: run name")
        status = rdir / "status.json"
        if not (status.exists() and read_json(status).get("state") == "done"):
            print(f"[study] {entry['name']}: fine-tune on {Path(then['recipe']).stem}", flush=True)
            rc, state, received = _run_fit(_fit_command(*finetune_args(study_dir, then, entry)), rdir, True)
            stops = [sig for sig in (*received, *between) if sig in _STOPS]
            if stops:
                return stops[0], entry["name"] if state == "interrupted" else ""
            print(f"[study] {entry['name']}: {'done' if rc == 0 else f'FAILED (exit {rc})'}", flush=True)
        pdir = child_path(study_dir, entry["probe"], "study.json: probe name")
        if not (pdir / "probe.json").exists():
            print(f"[study] {entry['probe']}: probe on {Path(then['recipe']).stem}", flush=True)
            rc, _, received = _run_fit(_fit_command(*probe_args(study_dir, then, entry)), pdir, False)
            if any(sig in _STOPS for sig in (*received, *between)):
                return next(sig for sig in (*received, *between) if sig in _STOPS), ""
            print(f"[study] {entry['probe']}: {'done' if rc == 0 else f'FAILED (exit {rc})'}", flush=True)
    return None


def main(argv: list[str] | None = None) -> int:
    """``impulsevit study``; returns 0 when every run of the study is done."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--array-task"]:
        if len(argv) < 2:
            raise SystemExit("impulsevit study --array-task STUDY_DIR fit ...")
        return _array_task(Path(argv[1]), argv[2:])
    args, overrides = _parser().parse_known_args(argv)
    check_overrides(overrides)
    if not args.collect:
        check_tracker_overrides(overrides)
    if args.then is None and args.then_args:
        raise ConfigError("--then-args: the downstream stage's overrides need --then RECIPE (the stage to run)")
    if args.then is not None and (args.submit or args.run_index is not None):
        raise ConfigError("--then runs the downstream stage here, after the pre-training runs: not with --submit or "
                          "--run-index (run the stage later with the same command without them)")

    from impulsevit.run.recipes import resolve_recipe

    recipe_path = resolve_recipe(args.recipe).resolve()  # RecipeNotFoundError: a ConfigError
    study_name = args.name if args.name is not None else f"{recipe_path.stem}-study"
    study_dir = child_path(args.runs_dir, study_name, "--name", "a study name must be a single folder name inside "
                                                               "--runs-dir")
    claim_output(study_dir, overwrite=False, kind="into", what="study folder")  # a file there: one line
    plan_file = study_dir / "study.json"
    if args.collect:
        plan, stored = (read_json(plan_file) if plan_file.exists() else None), True
    else:
        plan, stored = _new_plan(args, recipe_path, overrides), plan_file.exists() and args.run_index is not None
        if stored:
            plan = read_json(plan_file)
        elif plan_file.exists():
            _check_continues(study_dir, read_json(plan_file), plan)
    # checked before any run starts (a typo must not cost a study); without a plan (--collect on a folder that is not
    # a study) collect() below says what is missing
    reference = args.reference if plan is None else reference_method(
        list(plan["methods"]), args.reference, study_header(recipe_path)["reference"], recipe_path)
    if plan is not None and not args.collect:
        if args.dry_run and not args.submit:
            _print_plan(study_dir, plan, args.run_index)
            return 0
        if not stored and not (args.submit and args.dry_run):
            study_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(plan_file, plan, indent=2)
        if args.submit:
            return _submit(args, recipe_path, study_name, len(plan["runs"]), overrides)
        stopped = _run_plan(study_dir, plan, args.run_index)
        if stopped is not None:
            sig, name = stopped
            what = (f"run {name} checkpointed and marked interrupted" if name else "between two runs")
            print(f"impulsevit study: stopped by {signal.Signals(sig).name}: {what}; no further run started; rerun "
                  f"the same command to continue (exit {128 + sig})", file=sys.stderr, flush=True)
            return 128 + sig
        if args.run_index is not None:
            return 0
    results = collect(study_dir)
    paper = paper_numbers(recipe_path)
    md = write_report(study_dir, results, paper, reference)
    if args.json:
        print(md.with_suffix(".json").read_text(), end="")
        print(f"[study] report: {md}  json: {md.with_suffix('.json')}", file=sys.stderr)
    else:
        print(md.read_text())
        for line in paired_summary(results, reference):
            print(f"[study] {line}")
        print(f"[study] report: {md}  json: {md.with_suffix('.json')}  plot: {md.with_suffix('.png')}")
    return 0 if all(r.state == "done" for r in results) else 1


def _submit(args: argparse.Namespace, recipe: Path, study_name: str, n_runs: int, overrides: list[str]) -> int:
    """Hand the plan to ``impulsevit submit`` as one array job (task i = plan entry i); its launcher is
    ``<impulsevit> study --array-task <study dir>``, in front of the ``fit`` argv that submit writes."""
    from impulsevit.cli.submit import default_launcher
    from impulsevit.cli.submit import main as submit_main
    from impulsevit.cluster.slurm_config import load_defaults

    sp = ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--launcher", "--slurm-config", "--container-image"):
        sp.add_argument(flag)
    known, rest = sp.parse_known_args(overrides)
    defaults = load_defaults(known.slurm_config)
    base = known.launcher or defaults.get("launcher") or (
        "impulsevit" if known.container_image or defaults.get("container_image") else default_launcher())
    study_dir = (Path(args.runs_dir) / study_name).resolve()
    launcher = f"{base} study --array-task {shlex.quote(str(study_dir))}"
    argv = ["--recipe", str(recipe), "--name", study_name, "--runs-dir", str(Path(args.runs_dir).resolve()),
            "--array", f"0-{n_runs - 1}", "--launcher", launcher, *rest]
    for flag in ("slurm_config", "container_image"):
        value = getattr(known, flag)
        if value is not None:
            argv += [f"--{flag.replace('_', '-')}", value]
    if args.dry_run:
        argv.append("--dry-run")
    return submit_main(argv)
