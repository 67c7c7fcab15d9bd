"""What a study measured: each run's outcome read back from its ``status.json`` and TensorBoard event files, and the
report (``report.md``: mean ± sample std per method beside the paper's numbers; ``report.png``: accuracy curves).

Metrics: ``val/acc1`` per validation (one point per epoch), ``test/acc1`` when a test was run. "final" = the last
validation, "best" = the maximum over epochs. Not supported: runs that log no ``val/acc1`` (reported as failed).
"""

from __future__ import annotations

import dataclasses
import io
import os
import statistics
from pathlib import Path

from impulsevit.study.files import read_json, write_atomic

__all__ = ["RunResult", "read_scalars", "collect", "render_report", "write_report"]


@dataclasses.dataclass
class RunResult:
    """One run's outcome. Accuracies are fractions in [0, 1]; ``curve`` is val/acc1 per validation, in order."""

    name: str
    method: str
    seed: int
    state: str  # done | failed | running | requeued | missing
    final: float | None = None
    best: float | None = None
    test: float | None = None
    curve: list[float] = dataclasses.field(default_factory=list)
    detail: str = ""


def read_scalars(run_dir: Path) -> dict[str, list[float]]:
    """All scalar series in the run's TensorBoard event files (any depth below ``run_dir``), ordered by (step, wall
    time)."""
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
    results = []
    for run in read_json(plan_file)["runs"]:
        rdir = study_dir / run["name"]
        status_file = rdir / "status.json"
        status = read_json(status_file) if status_file.exists() else {"state": "missing"}
        r = RunResult(run["name"], run["method"], int(run["seed"]), status.get("state", "missing"))
        if status.get("state") == "failed":
            r.detail = f"exit code {status.get('returncode')}"
        if rdir.exists():
            s = read_scalars(rdir)
            r.curve = s.get("val/acc1", [])
            if r.curve:
                r.final, r.best = r.curve[-1], max(r.curve)
            if s.get("test/acc1"):
                r.test = s["test/acc1"][-1]
        if r.state == "done" and not r.curve:
            r.state, r.detail = "failed", "finished but logged no val/acc1"
        results.append(r)
    return results


def _mean_std(xs: list[float]) -> str:
    """``"mean ± sample std"`` with two decimals (std 0 for one value, ``–`` for none)."""
    if not xs:
        return "–"
    return f"{statistics.fmean(xs):.2f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.2f}"


def render_report(study_name: str, plan: dict, results: list[RunResult], paper: dict[str, float]) -> str:
    """The markdown of ``report.md``: per-method table (top-1 in %), per-run table, unfinished / failed runs."""
    methods = list(dict.fromkeys(r.method for r in results))
    lines = [
        f"# Study `{study_name}`",
        "",
        f"Recipe `{plan['recipe']}`, methods {', '.join(methods)}, seeds {plan['seeds']}, "
        f"overrides `{' '.join(plan.get('overrides', [])) or '(none)'}`.",
        "",
        "Top-1 accuracy in %, mean ± sample std over the finished seeds (n).",
        "",
        "| method | n | final val | best val | test | paper |",
        "|---|---|---|---|---|---|",
    ]
    pct = lambda xs: _mean_std([100 * x for x in xs if x is not None])  # noqa: E731
    for m in methods:
        done = [r for r in results if r.method == m and r.state == "done"]
        lines.append(f"| {m} | {len(done)} | {pct([r.final for r in done])} | {pct([r.best for r in done])} | "
                     f"{pct([r.test for r in done])} | {paper.get(m, '–')} |")
    lines += ["", "## Runs", "", "| run | state | final val | best val | test | note |", "|---|---|---|---|---|---|"]
    for r in results:
        cells = ["–" if v is None else f"{100 * v:.2f}" for v in (r.final, r.best, r.test)]
        lines.append(f"| {r.name} | {r.state} | {' | '.join(cells)} | {r.detail} |")
    bad = [r for r in results if r.state != "done"]
    if bad:
        listed = ", ".join(f"{r.name} ({r.state})" for r in bad)
        lines += ["", f"**{len(bad)} run(s) not finished or failed:** {listed}"]
    lines += ["", "![validation accuracy per epoch](report.png)", ""]
    return "\n".join(lines)


def render_plot(results: list[RunResult]) -> bytes:
    """PNG of val top-1 (%) per epoch: per method the mean over its finished runs ± one sample std (shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for m in dict.fromkeys(r.method for r in results):
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_report(study_dir: str | os.PathLike, results: list[RunResult], paper: dict[str, float] | None = None) -> Path:
    """Write ``report.md`` (mean ± std of final/best/test top-1 in %, per method) and ``report.png``; returns the
    md path."""
    study_dir = Path(study_dir)
    plan = read_json(study_dir / "study.json")
    md = study_dir / "report.md"
    write_atomic(md, render_report(study_dir.name, plan, results, paper or {}))
    write_atomic(study_dir / "report.png", render_plot(results))
    return md
