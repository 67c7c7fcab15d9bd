"""What a study measured: each run's outcome read back from its ``status.json`` and TensorBoard event files, and the
report (``report.md``: mean ± sample std per method beside the paper's numbers, and each method's paired difference
from a reference method; ``report.json``: the same numbers, machine-readable; ``report.png``: accuracy curves;
``report_attention.png`` and a table: per-layer attention locality from init to the end, from each run's
``attention/step_*.json`` files written by ``impulsevit.callbacks.AttentionEvolution``; x is the epoch each record
names, 0 = init, and every point is the mean over the runs that recorded that epoch, so the table's "end" is the
figure's last point).

Metrics: ``val/acc1`` per validation (one point per epoch), ``test/acc1`` when a test was run. "final" = the last
validation, "best" = the maximum over epochs. Not supported: runs that log no ``val/acc1`` (reported as failed).

Paired differences. Every method of a study runs with the same seeds, and seed ``s`` fixes the same things for every
method: the initializer's generator (``model.init.seed``) and the global RNG (``seed_everything``: dropout, drop-path,
mixup); the data order and augmentation draws come from the recipe's data seed, the same for every run. So
``<method>-s<s>`` and ``<reference>-s<s>`` differ only in the init method. For each method, the report takes, per seed
where both runs finished, ``d_s = top-1(method, s) − top-1(reference, s)`` (percentage points; final val and best
val), and gives their mean, their sample std, every ``d_s``, and a 95 % Student-t interval on the mean (n − 1 degrees
of freedom; :mod:`impulsevit.study.paired`); with one pair, the difference and "no interval (n=1)". An interval built
this way covers the true mean difference (over seeds, on this recipe and data order) in 95 % of studies; one that
excludes 0 says the sign of the difference is resolved at this n. Runs that did not finish drop only their own pair.

Why pairing is tighter than comparing the two means: part of the spread between seeds is what both methods share at a
seed (the draws of the weights the init leaves alone, the global RNG), so the two methods' results move together from
seed to seed — as far as the two inits draw alike: a method that draws the weights it does not structure differently
from the reference at the same seed shares less with it. A difference of unpaired means carries both methods' whole seed
spread (per seed, the std of a difference of independent draws is ``√(s_m² + s_r²)``); the paired one carries only the
spread of ``d_s``, ``√(s_m² + s_r² − 2·cov)``, smaller whenever the two methods are positively correlated over seeds.
When they are not, pairing gains nothing and costs degrees of freedom (n − 1 instead of 2n − 2); and an interval from 3
pairs is wide (the t quantile is 4.30 at 2 degrees of freedom): it resolves effects several times the std of ``d_s``,
not fractions of it.

The reference: ``impulsevit study --reference METHOD``, else the recipe's ``# study: {reference: METHOD}`` header,
else ``torch`` when it is one of the methods, else the first method (:func:`impulsevit.study.plan.reference_method`).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import statistics
from pathlib import Path

from impulsevit.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from impulsevit.study.paired import PairedDifference, paired_difference
from impulsevit.study.plan import reference_method

__all__ = ["RunResult", "accuracy_by_epoch", "attention_by_epoch", "point_epoch", "read_attention", "read_scalars",
           "collect", "paired_differences", "render_report", "report_data", "paired_summary", "write_report"]

PAIRED_METRICS = {"final": "final val top-1", "best": "best val top-1"}  # RunResult field -> what the report calls it

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


def paired_differences(results: list[RunResult], reference: str,
                       confidence: float = 0.95) -> dict[str, dict[str, PairedDifference]]:
    """Per method other than ``reference`` (study order), per metric of :data:`PAIRED_METRICS`: the paired difference
    ``method − reference`` in top-1 percentage points over the seeds where both runs are done
    (:func:`impulsevit.study.paired.paired_difference`)."""
    def by_seed(method: str, metric: str) -> dict[int, float | None]:
        runs = [r for r in results if r.method == method and r.state == "done"]
        if len({r.seed for r in runs}) != len(runs):
            raise ValueError(f"method {method!r} has two runs with the same seed: cannot pair by seed")
        return {r.seed: None if getattr(r, metric) is None else 100 * getattr(r, metric) for r in runs}

    methods = [m for m in dict.fromkeys(r.method for r in results) if m != reference]
    return {m: {k: paired_difference(by_seed(m, k), by_seed(reference, k), confidence) for k in PAIRED_METRICS}
            for m in methods}


def _ci_cell(d: PairedDifference) -> str:
    """``+1.23 [−0.40, +2.86], excludes 0`` (percentage points); ``+1.23, no interval (n=1)``; ``–`` without pairs."""
    if d.mean is None:
        return "– (no paired seeds)"
    if d.low is None or d.high is None:
        return f"{d.mean:+.2f}, no interval (n={d.n})"
    return f"{d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}], {'excludes' if d.excludes_zero else 'includes'} 0"


def _paired_section(paired: dict[str, dict[str, PairedDifference]], reference: str) -> list[str]:
    """Markdown: per method and metric, n, seeds, mean, std and interval of the paired differences, every one."""
    lines = [f"## Paired differences vs `{reference}`", "",
             f"Per seed s where both runs finished: top-1(method, s) − top-1({reference}, s), in percentage points; "
             "mean, sample std of the differences and a 95 % Student-t interval on their mean (n − 1 degrees of "
             "freedom). The same seed gives both runs the same initializer seed, global seed and data order, so the "
             "differences carry only the init's effect and the noise that does not cancel within a pair.", "",
             "| method | metric | n | mean Δ | std of Δ | 95 % CI | excludes 0 | per seed Δ |",
             "|---|---|---|---|---|---|---|---|"]
    for m, per_metric in paired.items():
        for k, d in per_metric.items():
            ci = "no interval" if d.low is None else f"[{d.low:+.2f}, {d.high:+.2f}]"
            excl = {None: "–", True: "yes", False: "no"}[d.excludes_zero]
            per_seed = ", ".join(f"s{s} {x:+.2f}" for s, x in zip(d.seeds, d.diffs)) or "–"
            lines.append(f"| {m} | {PAIRED_METRICS[k]} | {d.n} | {'–' if d.mean is None else f'{d.mean:+.2f}'} | "
                         f"{'–' if d.std is None else f'{d.std:.2f}'} | {ci} | {excl} | {per_seed} |")
    return lines


def paired_summary(results: list[RunResult], reference: str | None = None) -> list[str]:
    """One line per method: its paired difference from ``reference`` (default
    :func:`impulsevit.study.plan.reference_method`; final and best val top-1, percentage points), for the end of the
    study's console output."""
    ref = reference_method(list(dict.fromkeys(r.method for r in results)), reference)
    return [f"{m} − {ref} (paired, 95 % CI, points): final val {_ci_cell(p['final'])}; best val "
            f"{_ci_cell(p['best'])}; n={p['final'].n}" for m, p in paired_differences(results, ref).items()]


def report_data(study_name: str, plan: dict, results: list[RunResult], paper: dict[str, float],
                reference: str | None = None) -> dict:
    """What ``report.json`` holds: the study (name, recipe, seeds, overrides, reference), per method the finished
    runs' count and final / best / test top-1 in % (mean, sample std, values by seed), the paper's number, and the
    paired difference from the reference (:meth:`PairedDifference.to_dict`, percentage points); every run with its
    state and numbers (fractions in [0, 1], as logged)."""
    methods = list(dict.fromkeys(r.method for r in results))
    ref = reference_method(methods, reference)
    paired = paired_differences(results, ref)
    per_method = {}
    for m in methods:
        done = [r for r in results if r.method == m and r.state == "done"]
        entry: dict = {"n": len(done), "paper": paper.get(m)}
        for k in ("final", "best", "test"):
            vals = {r.seed: 100 * getattr(r, k) for r in done if _finite(getattr(r, k))}
            xs = list(vals.values())
            entry[k] = {"mean": statistics.fmean(xs) if xs else None,
                        "std": statistics.stdev(xs) if len(xs) > 1 else None, "by_seed": vals}
        entry["paired"] = {k: d.to_dict() for k, d in paired[m].items()} if m in paired else None
        per_method[m] = entry
    return {"study": study_name, "recipe": plan.get("recipe"), "seeds": plan.get("seeds"),
            "overrides": plan.get("overrides", []), "reference": ref, "unit": "top-1 %, differences in points",
            "methods": per_method,
            "runs": [{"name": r.name, "method": r.method, "seed": r.seed, "state": r.state,
                      **{k: getattr(r, k) if _finite(getattr(r, k)) else None for k in ("final", "best", "test")},
                      "detail": r.detail} for r in results]}


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def render_report(study_name: str, plan: dict, results: list[RunResult], paper: dict[str, float],
                  reference: str | None = None) -> str:
    """The markdown of ``report.md``: per-method table (top-1 in %, paired difference from ``reference``, default
    :func:`impulsevit.study.plan.reference_method`), the paired differences in full, per-run table, unfinished /
    failed runs."""
    methods = list(dict.fromkeys(r.method for r in results))
    ref = reference_method(methods, reference)
    paired = paired_differences(results, ref)
    lines = [
        f"# Study `{study_name}`",
        "",
        f"Recipe `{plan['recipe']}`, methods {', '.join(methods)}, seeds {plan['seeds']}, "
        f"overrides `{' '.join(plan.get('overrides', [])) or '(none)'}`.",
        "",
        f"Top-1 accuracy in %, mean ± sample std over the finished seeds (n). Δ vs {ref} (paired): per seed, "
        f"method − {ref} in points; mean [95 % CI] and whether the interval excludes 0 (below).",
        "",
        f"| method | n | final val | best val | test | paper | Δ final val vs {ref} (paired) | "
        f"Δ best val vs {ref} (paired) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda xs: _mean_std([100 * x for x in xs if x is not None])  # noqa: E731
    for m in methods:
        done = [r for r in results if r.method == m and r.state == "done"]
        deltas = (["reference", "reference"] if m == ref else [_ci_cell(paired[m][k]) for k in PAIRED_METRICS])
        lines.append(f"| {m} | {len(done)} | {pct([r.final for r in done])} | {pct([r.best for r in done])} | "
                     f"{pct([r.test for r in done])} | {paper.get(m, '–')} | {' | '.join(deltas)} |")
    if paired:
        lines += [""] + _paired_section(paired, ref)
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


def accuracy_by_epoch(curves: list[list[float]]) -> dict[int, list[float]]:
    """Per validation index (1-based: the epoch when each epoch validates once), the values of the ``curves`` (one
    val/acc1 list per run) that reach it, nan left out: a method's figure runs to its longest run, and its last point
    is the mean over the runs that got that far (a run with fewer validations no longer cuts every curve short)."""
    out: dict[int, list[float]] = {}
    for curve in curves:
        for i, v in enumerate(curve, start=1):
            if v == v:
                out.setdefault(i, []).append(float(v))
    return out


def render_plot(results: list[RunResult]) -> bytes:
    """PNG of val top-1 (%) per epoch: per method, at every validation any of its finished runs reached, the mean over
    the runs that reached it ± one sample std (shaded; 0 for one run) — :func:`accuracy_by_epoch`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for m in dict.fromkeys(r.method for r in results):
        curves = [r.curve for r in results if r.method == m and r.state == "done" and r.curve]
        by_epoch = accuracy_by_epoch(curves)
        if not by_epoch:
            continue
        x = np.array(list(by_epoch), dtype=float)
        mean = np.array([100 * np.mean(v) for v in by_epoch.values()])
        sd = np.array([100 * np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in by_epoch.values()])
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


def write_report(study_dir: str | os.PathLike, results: list[RunResult], paper: dict[str, float] | None = None,
                 reference: str | None = None) -> Path:
    """Write ``report.md`` (:func:`render_report`), ``report.json`` (:func:`report_data`), ``report.png`` and, when
    runs recorded attention, ``report_attention.png``; returns the md path."""
    study_dir = Path(study_dir)
    plan = read_json(study_dir / "study.json")
    md = study_dir / "report.md"
    atomic_write_text(md, render_report(study_dir.name, plan, results, paper or {}, reference))
    atomic_write_json(study_dir / "report.json", report_data(study_dir.name, plan, results, paper or {}, reference),
                      indent=2)
    atomic_write_bytes(study_dir / "report.png", render_plot(results))
    attention = render_attention_plot(results)
    if attention is not None:
        atomic_write_bytes(study_dir / "report_attention.png", attention)
    return md
