"""`impulsevit study`: every init method × seed of one recipe, then a report (mean ± std table and accuracy curves).

Layout: ``<runs-dir>/<study>/`` holds ``study.json`` (the plan: recipe, methods, seeds, overrides), one run directory
per ``<method>-s<seed>`` (written by ``impulsevit fit``), ``report.md`` and ``report.png``. Each run records its own
outcome in ``<run>/status.json`` (``running`` / ``done`` / ``failed`` with the exit code), so ``--collect`` can rebuild
the report at any time and lists failed or unfinished runs instead of dropping them.

Metrics come from the runs' TensorBoard event files: ``val/acc1`` per validation (one point per epoch), ``test/acc1``
when a test was run. "final" = the last validation, "best" = the maximum over epochs.

Paper numbers: a recipe may carry a machine-readable header comment ``# paper: {torch: 71.67, impulse: 77.02}``
(top-1 %, keyed by init method); the report prints them beside the measured means.

Per-method settings: a header ``# study: {methods: [impulse, box, random], overrides: {random:
[--model.backbone_kwargs.spatial_trainable=true]}}`` gives the default ``--methods`` and extra ``impulsevit fit``
arguments for the runs of one method (e.g. a ConvMixer ablation where only the ``random`` runs train their spatial
filters). Each run is ``impulsevit fit --recipe R --model.init.method=M --model.init.seed=S --seed_everything=S
<method's overrides> <the study's command-line overrides>`` (later arguments win).

SLURM (``--submit``): one array job with a task per run, written and submitted by ``impulsevit submit`` (resource
flags such as ``--nodes``, ``--gpus-per-node``, ``--time``, ``--partition`` go to it; the rest are fit overrides).
Each task starts ``impulsevit study --array-task <study dir> fit …``, which maps ``$SLURM_ARRAY_TASK_ID`` to its
plan entry and runs that fit in ``<study>/<method>-s<seed>/`` with the job's requeue machinery (signals are forwarded
to the fit), recording ``status.json`` like a local run; ``impulsevit study --collect`` then builds the report.

Not supported: collecting from runs that log no ``val/acc1``; mixing recipes within one study.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

__all__ = ["RunResult", "plan_runs", "collect", "write_report", "paper_numbers", "study_header", "run_args", "main"]


DEFAULT_METHODS = ["impulse", "mimetic", "torch"]


@dataclasses.dataclass
class RunResult:
    """One run's outcome. Accuracies are fractions in [0, 1]; ``curve`` is val/acc1 per validation, in order."""

    name: str
    method: str
    seed: int
    state: str  # done | failed | running | missing
    final: float | None = None
    best: float | None = None
    test: float | None = None
    curve: list[float] = dataclasses.field(default_factory=list)
    detail: str = ""


def plan_runs(methods: list[str], seeds: int) -> list[tuple[str, int, str]]:
    """``(method, seed, run_name)`` for every method × seed ``0..seeds-1``, method-major."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if not methods:
        raise ValueError("--methods is empty")
    return [(m, s, f"{m}-s{s}") for m in methods for s in range(seeds)]


def _header(recipe_path: str | os.PathLike, key: str) -> Any:
    """The YAML value of the header comment line ``# <key>: <value>`` of a recipe (None when absent). The header is
    the run of comment / blank lines at the top of the file."""
    for line in Path(recipe_path).read_text().splitlines():
        s = line.strip()
        if not s.startswith("#"):
            if s:
                break
            continue
        body = s.lstrip("#").strip()
        if body.startswith(f"{key}:"):
            try:
                return yaml.safe_load(body[len(key) + 1:].strip())
            except yaml.YAMLError as e:
                raise ValueError(f"{recipe_path}: '# {key}:' header is not valid YAML: {e}") from e
    return None


def paper_numbers(recipe_path: str | os.PathLike) -> dict[str, float]:
    """The ``# paper: {...}`` header of a recipe file as ``{method: top-1 %}`` (empty when absent)."""
    value = _header(recipe_path, "paper")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{recipe_path}: '# paper:' header must be a mapping method -> top-1, got {value!r}")
    return {str(k): float(v) for k, v in value.items()}


def study_header(recipe_path: str | os.PathLike) -> dict[str, Any]:
    """The ``# study: {methods: [...], overrides: {method: [fit args]}}`` header as ``{"methods": list[str] | None,
    "overrides": dict[str, list[str]]}`` (both empty when absent).

    Raises:
        ValueError: naming the recipe file, when the header has other keys or values of the wrong type.
    """
    value = _header(recipe_path, "study")
    if value is None:
        return {"methods": None, "overrides": {}}
    if not isinstance(value, dict) or set(value) - {"methods", "overrides"}:
        raise ValueError(f"{recipe_path}: '# study:' header must be a mapping with keys 'methods' (list of init "
                         f"methods) and/or 'overrides' (method -> list of fit arguments), got {value!r}")
    methods = value.get("methods")
    if methods is not None and (not isinstance(methods, list) or not all(isinstance(m, str) for m in methods)):
        raise ValueError(f"{recipe_path}: '# study:' methods must be a list of method names, got {methods!r}")
    overrides = value.get("overrides") or {}
    if not isinstance(overrides, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) and a.startswith("--") for a in v) for v in overrides.values()
    ):
        raise ValueError(f"{recipe_path}: '# study:' overrides must map a method to a list of '--key=value' fit "
                         f"arguments, got {overrides!r}")
    return {"methods": methods, "overrides": {str(k): list(v) for k, v in overrides.items()}}


def run_args(method: str, seed: int, method_overrides: dict[str, list[str]] | None = None) -> list[str]:
    """The ``impulsevit fit`` arguments that make one run of a study: init method and seed, the global seed, then the
    method's overrides from the recipe's ``# study:`` header."""
    return [f"--model.init.method={method}", f"--model.init.seed={seed}", f"--seed_everything={seed}",
            *(method_overrides or {}).get(method, [])]


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def _scalars(run_dir: Path) -> dict[str, list[float]]:
    """All scalar series in the run's TensorBoard event files, ordered by (wall time, step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: dict[str, list[tuple[float, int, float]]] = {}
    for ev in sorted(run_dir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(ev), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            series.setdefault(tag, []).extend((e.wall_time, e.step, e.value) for e in acc.Scalars(tag))
    return {tag: [v for _, _, v in sorted(pts, key=lambda p: (p[1], p[0]))] for tag, pts in series.items()}


def collect(study_dir: str | os.PathLike) -> list[RunResult]:
    """Read ``study.json`` and every planned run's status and metrics."""
    study_dir = Path(study_dir)
    plan_file = study_dir / "study.json"
    if not plan_file.exists():
        raise FileNotFoundError(f"{plan_file} not found: not a study directory (run `impulsevit study` first)")
    plan = json.loads(plan_file.read_text())
    results = []
    for run in plan["runs"]:
        rdir = study_dir / run["name"]
        status_file = rdir / "status.json"
        status = json.loads(status_file.read_text()) if status_file.exists() else {"state": "missing"}
        r = RunResult(run["name"], run["method"], int(run["seed"]), status.get("state", "missing"))
        if status.get("state") == "failed":
            r.detail = f"exit code {status.get('returncode')}"
        if rdir.exists():
            s = _scalars(rdir)
            r.curve = s.get("val/acc1", [])
            if r.curve:
                r.final, r.best = r.curve[-1], max(r.curve)
            if s.get("test/acc1"):
                r.test = s["test/acc1"][-1]
        if r.state == "done" and not r.curve:
            r.state, r.detail = "failed", "finished but logged no val/acc1"
        results.append(r)
    return results


def _mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def write_report(study_dir: str | os.PathLike, results: list[RunResult], paper: dict[str, float] | None = None) -> Path:
    """Write ``report.md`` (mean ± std of final/best/test top-1 in %, per method) and ``report.png``; returns the
    md path."""
    study_dir = Path(study_dir)
    plan = json.loads((study_dir / "study.json").read_text())
    paper = paper or {}
    methods = list(dict.fromkeys(r.method for r in results))
    lines = [
        f"# Study `{study_dir.name}`",
        "",
        f"Recipe `{plan['recipe']}`, methods {', '.join(methods)}, seeds {plan['seeds']}, "
        f"overrides `{' '.join(plan.get('overrides', [])) or '(none)'}`.",
        "",
        "Top-1 accuracy in %, mean ± sample std over the finished seeds (n).",
        "",
        "| method | n | final val | best val | test | paper |",
        "|---|---|---|---|---|---|",
    ]

    def fmt(xs: list[float]) -> str:
        if not xs:
            return "–"
        m, sd = _mean_std([100 * x for x in xs])
        return f"{m:.2f} ± {sd:.2f}"

    for m in methods:
        done = [r for r in results if r.method == m and r.state == "done"]
        lines.append(
            f"| {m} | {len(done)} | {fmt([r.final for r in done])} | {fmt([r.best for r in done])} | "
            f"{fmt([r.test for r in done if r.test is not None])} | {paper.get(m, '–')} |"
        )
    bad = [r for r in results if r.state != "done"]
    lines += ["", "## Runs", "", "| run | state | final val | best val | test | note |", "|---|---|---|---|---|---|"]
    for r in results:
        cells = ["–" if v is None else f"{100 * v:.2f}" for v in (r.final, r.best, r.test)]
        lines.append(f"| {r.name} | {r.state} | {' | '.join(cells)} | {r.detail} |")
    if bad:
        listed = ", ".join(f"{r.name} ({r.state})" for r in bad)
        lines += ["", f"**{len(bad)} run(s) not finished or failed:** {listed}"]
    lines += ["", "![validation accuracy per epoch](report.png)", ""]
    md = study_dir / "report.md"
    tmp = md.with_name(".report.md.tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, md)
    _plot(study_dir / "report.png", results, methods)
    return md


def _plot(path: Path, results: list[RunResult], methods: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for m in methods:
        curves = [r.curve for r in results if r.method == m and r.state == "done" and r.curve]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        arr = 100 * np.array([c[:n] for c in curves])
        x = np.arange(1, n + 1)
        mean, sd = arr.mean(0), arr.std(0, ddof=1) if len(arr) > 1 else np.zeros(n)
        ax.plot(x, mean, label=f"{m} (n={len(curves)})")
        ax.fill_between(x, mean - sd, mean + sd, alpha=0.2)
    ax.set_xlabel("epoch")
    ax.set_ylabel("val top-1 (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(".report.png.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def _fit(cmd: list[str], rdir: Path, *, record: bool = True) -> int:
    """Run one ``impulsevit fit`` subprocess, output appended to ``<run>/study_fit.log``; ``status.json`` records
    ``running`` then ``done`` / ``failed`` (exit code) / ``requeued`` (a SLURM signal arrived: the fit checkpointed
    and the job was requeued, or it was stopped). USR1 / TERM received here are forwarded to the fit (its
    ``SlurmRequeue`` handlers only set a flag, so a signal that reaches both processes is harmless)."""
    rdir.mkdir(parents=True, exist_ok=True)
    if record:
        _write_json_atomic(rdir / "status.json", {"state": "running", "started": time.time()})
    t0, signalled = time.time(), []
    with open(rdir / "study_fit.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

        def forward(signum: int, frame: Any) -> None:
            signalled.append(signum)
            proc.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGUSR1, signal.SIGTERM)}
        try:
            rc = proc.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    state = "requeued" if signalled else ("done" if rc == 0 else "failed")
    if record:
        _write_json_atomic(rdir / "status.json", {"state": state, "returncode": rc, "seconds": time.time() - t0})
    return rc


def _args(run: dict[str, Any]) -> list[str]:
    """A plan entry's fit arguments (plans written before per-run ``args`` existed: method and seed only)."""
    return run["args"] if "args" in run else run_args(run["method"], int(run["seed"]))


def _run_one(study_dir: Path, recipe: str, run: dict[str, Any], overrides: list[str]) -> int:
    cmd = [
        sys.executable, "-m", "impulsevit.cli", "fit", "--recipe", recipe,
        "--runs-dir", str(study_dir), "--name", run["name"], "--resume", "auto", *_args(run), *overrides,
    ]
    return _fit(cmd, study_dir / run["name"])


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
    plan = json.loads(plan_file.read_text())
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
    cmd = [sys.executable, "-m", "impulsevit.cli", *argv[:at], *_args(run), *argv[at:]]
    print(f"[study] array task {task}: {run['name']}", flush=True)
    return _fit(cmd, study_dir / run["name"], record=os.environ.get("SLURM_PROCID", "0") == "0")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--array-task"]:
        if len(argv) < 2:
            raise SystemExit("impulsevit study --array-task STUDY_DIR fit ...")
        return _array_task(Path(argv[1]), argv[2:])
    p = argparse.ArgumentParser(
        prog="impulsevit study",
        description="Run a recipe with several init methods × seeds and report mean ± std (see impulsevit/study.py).",
        epilog="Other arguments are `impulsevit fit` overrides for every run (with --submit also `impulsevit "
               "submit` resource flags).",
    )
    p.add_argument("--recipe", required=True, help="recipe name (recipes/NAME.yaml) or path")
    p.add_argument("--methods", default=None,
                   help="comma-separated init methods (default: the recipe's '# study:' header, else "
                        "impulse,mimetic,torch)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per method")
    p.add_argument("--name", default=None, help="study name (default: <recipe>-study)")
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--collect", action="store_true", help="only rebuild the report from the run directories")
    p.add_argument("--run-index", type=int, default=None, help="run only this entry of the plan")
    p.add_argument("--submit", action="store_true", help="submit the plan as a SLURM array instead of running here")
    p.add_argument("--dry-run", action="store_true", help="with --submit: print the sbatch script, submit nothing")
    args, overrides = p.parse_known_args(argv)

    from impulsevit.recipes import resolve_recipe

    recipe_path = resolve_recipe(args.recipe).resolve()
    study_name = args.name or f"{recipe_path.stem}-study"
    study_dir = Path(args.runs_dir) / study_name
    plan_file = study_dir / "study.json"
    if args.collect:
        results = collect(study_dir)
    else:
        header = study_header(recipe_path)
        methods = args.methods.split(",") if args.methods is not None else header["methods"] or DEFAULT_METHODS
        runs = plan_runs(list(dict.fromkeys(m.strip() for m in methods if m.strip())), args.seeds)
        plan = {
            "recipe": str(recipe_path), "methods": list(dict.fromkeys(m for m, _, _ in runs)),
            "seeds": args.seeds, "overrides": overrides,
            "runs": [{"method": m, "seed": s, "name": n, "args": run_args(m, s, header["overrides"])}
                     for m, s, n in runs],
        }
        if plan_file.exists() and args.run_index is not None:
            plan = json.loads(plan_file.read_text())
        elif not (args.submit and args.dry_run):
            study_dir.mkdir(parents=True, exist_ok=True)
            _write_json_atomic(plan_file, plan)
        if args.submit:
            return _submit(args, recipe_path, study_name, len(plan["runs"]), overrides)
        if args.run_index is not None and not 0 <= args.run_index < len(plan["runs"]):
            raise SystemExit(f"--run-index {args.run_index}: the plan has {len(plan['runs'])} runs")
        todo = plan["runs"] if args.run_index is None else [plan["runs"][args.run_index]]
        for run in todo:
            status = study_dir / run["name"] / "status.json"
            if status.exists() and json.loads(status.read_text()).get("state") == "done":
                print(f"[study] {run['name']}: already done, skipped", flush=True)
                continue
            print(f"[study] {run['name']}: fit {plan['recipe']} {' '.join(_args(run))}", flush=True)
            rc = _run_one(study_dir, plan["recipe"], run, plan["overrides"])
            print(f"[study] {run['name']}: {'done' if rc == 0 else f'FAILED (exit {rc})'}", flush=True)
        if args.run_index is not None:
            return 0
        results = collect(study_dir)
    md = write_report(study_dir, results, paper_numbers(recipe_path))
    print(md.read_text())
    print(f"[study] report: {md}  plot: {md.with_suffix('.png')}")
    return 0 if all(r.state == "done" for r in results) else 1


def _submit(args: argparse.Namespace, recipe: Path, study_name: str, n_runs: int, overrides: list[str]) -> int:
    """Hand the plan to ``impulsevit submit`` as one array job (task i = plan entry i); its launcher is
    ``<impulsevit> study --array-task <study dir>``, in front of the ``fit`` argv that submit writes."""
    from impulsevit.cluster.slurm_config import load_defaults
    from impulsevit.cluster.submit import default_launcher
    from impulsevit.cluster.submit import main as submit_main

    sp = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
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


if __name__ == "__main__":
    raise SystemExit(main())
