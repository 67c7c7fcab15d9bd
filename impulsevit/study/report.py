"""What a study measured: each run's outcome read back from its ``status.json`` and TensorBoard event files, and the
report (``report.md``: mean ± sample std per method beside the paper's numbers; ``report.png``: accuracy curves;
``report_attention.png`` and a table: per-layer attention locality from init to the end, from each run's
``attention/step_*.json`` files written by ``impulsevit.callbacks.AttentionEvolution``; x is the epoch each record
names, 0 = init, and every point is the mean over the runs that recorded that epoch, so the table's "end" is the
figure's last point).

Metrics: ``val/acc1`` per validation (one point per epoch), ``test/acc1`` when a test was run. "final" = the last
validation, "best" = the maximum over epochs. Not supported: runs that log no ``val/acc1`` (reported as failed).
"""

from __future__ import annotations

import dataclasses
import io
import os
import statistics
from pathlib import Path

from impulsevit.io import atomic_write_bytes, atomic_write_text, read_json

__all__ = ["RunResult", "attention_by_epoch", "point_epoch", "read_attention", "read_scalars", "collect",
           "render_report", "write_report"]

ATTENTION_METRICS = ("distance", "offset_mass")  # what the report plots and tabulates, per layer
ATTENTION_SOURCE = "images"


@dataclasses.dataclass
class RunResult:
    """One run's outcome. Accuracies are fractions in [0, 1]; ``curve`` is val/acc1 per validation, in order."""

    name: str
    method: str
    seed: int
    state: str  # done | failed | running | interrupted | requeued | missing
    final: float | None = None
    best: float | None = None
    test: float | None = None
    curve: list[float] = dataclasses.field(default_factory=list)
    detail: str = ""
    attention: dict[str, dict[int, list[float]]] = dataclasses.field(default_factory=dict)
    """Per metric, per recorded epoch (0 = init, N = after epoch N; ascending) the per-layer means over heads (probe
    images)."""


def point_epoch(record: dict) -> int:
    """The epoch an ``AttentionEvolution`` record describes: 0 for ``"init"``, N for ``"epoch_N"`` (after N finished
    epochs); a record without a readable ``point`` falls back to its 0-based ``epoch`` + 1 (0 at step 0)."""
    point = str(record.get("point", ""))
    if point == "init":
        return 0
    if point.startswith("epoch_") and point[6:].isdigit():
        return int(point[6:])
    return 0 if int(record.get("step", 0)) == 0 else int(record.get("epoch", 0)) + 1


def read_attention(run_dir: Path, source: str = ATTENTION_SOURCE) -> dict[str, dict[int, list[float]]]:
    """Per metric, per epoch (:func:`point_epoch`, ascending) the per-layer means of ``<run_dir>/attention/
    step_*.json`` (``{}`` when the run recorded none). One record per epoch: when a resumed run left two records of the
    same epoch at different steps, the one at the larger step (the later life's) is used."""
    chosen: dict[int, tuple[int, dict]] = {}  # epoch -> (step, means)
    for f in sorted((run_dir / "attention").glob("step_*.json")):
        record = read_json(f)
        data = record.get("sources", {}).get(source)
        if data is None:
            continue
        epoch, step = point_epoch(record), int(record.get("step", 0))
        if epoch not in chosen or step >= chosen[epoch][0]:
            chosen[epoch] = (step, data["means"])
    out: dict[str, dict[int, list[float]]] = {}
    for epoch in sorted(chosen):
        for metric, per_layer in chosen[epoch][1].items():
            out.setdefault(metric, {})[epoch] = [float(v) for v in per_layer]
    return out


def attention_by_epoch(series: list[dict[int, list[float]]], layer: int) -> dict[int, list[float]]:
    """Per epoch (ascending) recorded by any of the runs in ``series`` (one ``{epoch: per-layer values}`` per run),
    the values of ``layer`` from the runs that recorded that epoch (nan values and runs without the layer left out;
    an epoch with none left is dropped). What the attention figure draws and the table's columns read."""
    out: dict[int, list[float]] = {}
    for run in series:
        for epoch, per_layer in run.items():
            if layer < len(per_layer) and per_layer[layer] == per_layer[layer]:
                out.setdefault(epoch, []).append(float(per_layer[layer]))
    return {e: out[e] for e in sorted(out)}


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
            r.attention = read_attention(rdir)
        if r.state == "done" and not r.curve:
            r.state, r.detail = "failed", "finished but logged no val/acc1"
        results.append(r)
    return results


def _mean_std(xs: list[float], digits: int = 2) -> str:
    """``"mean ± sample std"`` with ``digits`` decimals (std 0 for one value, ``–`` for none; nan values skipped)."""
    xs = [x for x in xs if x == x]
    if not xs:
        return "–"
    return f"{statistics.fmean(xs):.{digits}f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.{digits}f}"


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
    lines += _attention_table(results, methods)
    return "\n".join(lines)


def _attention_runs(results: list[RunResult]) -> list[RunResult]:
    """The finished runs that recorded every metric of :data:`ATTENTION_METRICS` (the figure's and the table's)."""
    return [r for r in results if r.state == "done" and all(r.attention.get(m) for m in ATTENTION_METRICS)]


def _num_layers(runs: list[RunResult]) -> int:
    return max(len(v) for r in runs for v in r.attention[ATTENTION_METRICS[0]].values())


def _attention_table(results: list[RunResult], methods: list[str]) -> list[str]:
    """Markdown: per method and layer, each of :data:`ATTENTION_METRICS` at init (epoch 0) and at the end — the
    method's last recorded epoch, the figure's last point —, mean ± std over the finished runs that recorded that
    epoch (the text names the epoch and how many runs); empty when no run recorded attention."""
    done = _attention_runs(results)
    if not done:
        return []
    layers = _num_layers(done)
    head = " | ".join(f"{m} init → end" for m in ATTENTION_METRICS)
    ends = []
    for m in methods:
        runs = [r for r in done if r.method == m]
        if runs:
            epochs = attention_by_epoch([r.attention[ATTENTION_METRICS[0]] for r in runs], 0)
            first, last = min(epochs), max(epochs)
            ends.append(f"{m}: {'init' if first == 0 else f'epoch {first}'} ({len(epochs[first])} of {len(runs)} "
                        f"runs) → epoch {last} ({len(epochs[last])} of {len(runs)} runs)")
    lines = ["## Attention locality", "",
             "Per layer, on the fixed probe images: mean attention distance (patches) and the attention mass on each "
             "head's reference offset (its initial impulse offset; for methods without one, its best one-tap offset "
             "at init), mean over heads, then mean ± std over the seeds that recorded that epoch. init = epoch 0, "
             "end = the method's last recorded epoch, the last point of its curves in the figure: "
             + "; ".join(ends) + ".", "",
             f"| method | layer | {head} |", "|---|---|" + "---|" * len(ATTENTION_METRICS)]
    for m in methods:
        runs = [r for r in done if r.method == m]
        if not runs:
            continue
        for li in range(layers):
            cells = []
            for metric in ATTENTION_METRICS:
                by_epoch = attention_by_epoch([r.attention[metric] for r in runs], li)
                if not by_epoch:
                    cells.append("– → –")
                    continue
                first, last = by_epoch[min(by_epoch)], by_epoch[max(by_epoch)]
                cells.append(f"{_mean_std(first, 3)} → {_mean_std(last, 3)}")
            lines.append(f"| {m} | {li} | {' | '.join(cells)} |")
    lines += ["", "![attention locality per layer over training](report_attention.png)", ""]
    return lines


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


def render_attention_plot(results: list[RunResult]) -> bytes | None:
    """PNG: one row per metric of :data:`ATTENTION_METRICS`, one column per layer, x = the epoch each record names
    (0 = init); per method, at every epoch any of its finished runs recorded, the mean over the runs that recorded it
    ± one sample std (shaded; 0 for one run) — :func:`attention_by_epoch`, as the table. ``None`` when no run recorded
    attention."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    done = _attention_runs(results)
    if not done:
        return None
    layers = _num_layers(done)
    fig, axes = plt.subplots(len(ATTENTION_METRICS), layers, figsize=(2.6 * layers + 1, 2.4 * len(ATTENTION_METRICS)),
                             dpi=110, squeeze=False)
    for mi, metric in enumerate(ATTENTION_METRICS):
        for li in range(layers):
            ax = axes[mi][li]
            for m in dict.fromkeys(r.method for r in done):
                by_epoch = attention_by_epoch([r.attention[metric] for r in done if r.method == m], li)
                if not by_epoch:
                    continue
                x = np.array(list(by_epoch), dtype=float)
                mean = np.array([np.mean(v) for v in by_epoch.values()])
                sd = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in by_epoch.values()])
                ax.plot(x, mean, marker=".", label=m)
                ax.fill_between(x, mean - sd, mean + sd, alpha=0.2)
            ax.set_title(f"layer {li}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
            if li == 0:
                ax.set_ylabel(metric)
            if mi == len(ATTENTION_METRICS) - 1:
                ax.set_xlabel("epoch (0 = init)")
    axes[0][0].legend(fontsize=8)
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
    atomic_write_text(md, render_report(study_dir.name, plan, results, paper or {}))
    atomic_write_bytes(study_dir / "report.png", render_plot(results))
    attention = render_attention_plot(results)
    if attention is not None:
        atomic_write_bytes(study_dir / "report_attention.png", attention)
    return md
