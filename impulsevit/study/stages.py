"""A study over a pipeline (``impulsevit study --recipe PRE --then DOWN``): every pre-training run of the plan is
then fine-tuned and probed on the downstream recipe, and the report gets both stages side by side, paired by seed.

For each pre-training run ``<method>-s<seed>`` (its ``checkpoints/last.ckpt`` is the source):

- ``<method>-s<seed>-ft``: ``impulsevit fit --recipe DOWN --model.pretrained=<that checkpoint> --seed_everything=<seed>
  --resume auto <--then-args>``, in the study folder (its own ``status.json``, as a pre-training run);
- ``<method>-s<seed>-probe``: ``impulsevit probe <that checkpoint> --recipe DOWN <--then-args>`` (``probe.json``:
  linear-probe and k-NN top-1).

Pure functions here (the plan entries, reading the results back, the markdown table); the processes are started by
:mod:`impulsevit.study.launch`. ``study.json`` keeps the stage under ``"then"``: ``{"recipe", "args", "runs": [{"name",
"source_run", "method", "seed"}]}``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from impulsevit.io import read_json
from impulsevit.study.plan import recipe_digest

__all__ = ["SOURCE_CHECKPOINT", "collect_stages", "finetune_args", "probe_args", "render_stages", "then_plan"]

SOURCE_CHECKPOINT = Path("checkpoints") / "last.ckpt"
"""The file of a pre-training run that seeds its downstream stage (relative to the run folder)."""


def then_plan(recipe: str | os.PathLike, runs: list[dict[str, Any]], args: list[str]) -> dict[str, Any]:
    """The ``"then"`` block of ``study.json`` for the pre-training ``runs`` of a plan."""
    return {"recipe": str(recipe), "recipe_sha256": recipe_digest(recipe), "args": list(args),
            "runs": [{"name": f"{r['name']}-ft", "probe": f"{r['name']}-probe", "source_run": r["name"],
                      "method": r["method"], "seed": int(r["seed"])} for r in runs]}


def finetune_args(study_dir: Path, then: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """The ``impulsevit fit`` arguments of one fine-tune of the stage."""
    source = study_dir / entry["source_run"] / SOURCE_CHECKPOINT
    return ["fit", "--recipe", then["recipe"], "--runs-dir", str(study_dir), "--name", entry["name"],
            "--resume", "auto", f"--model.pretrained={source}", f"--seed_everything={entry['seed']}", *then["args"]]


def probe_args(study_dir: Path, then: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """The ``impulsevit probe`` arguments of one probe of the stage."""
    source = study_dir / entry["source_run"] / SOURCE_CHECKPOINT
    return ["probe", str(source), "--recipe", then["recipe"], "--runs-dir", str(study_dir), "--name",
            entry["probe"], "--overwrite", *then["args"]]


def _last(values: list[float] | None) -> float | None:
    return values[-1] if values else None


def collect_stages(study_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One row per pre-training run of the study's ``"then"`` block: ``method``, ``seed``, ``pretrain`` (final
    ``val/acc1`` of the pre-training), ``probe`` / ``knn`` (``probe.json``), ``finetune`` (final ``val/acc1`` of the
    fine-tune), each 0–1 or None when that run is missing / not finished; ``state`` of the fine-tune."""
    from impulsevit.study.report import read_scalars

    study_dir = Path(study_dir)
    then = read_json(study_dir / "study.json").get("then")
    if not then:
        return []
    rows = []
    for entry in then["runs"]:
        pre, ft, pr = (study_dir / entry["source_run"], study_dir / entry["name"], study_dir / entry["probe"])
        status = read_json(ft / "status.json") if (ft / "status.json").is_file() else {"state": "missing"}
        probe = read_json(pr / "probe.json") if (pr / "probe.json").is_file() else {}
        rows.append({
            "method": entry["method"], "seed": entry["seed"], "state": status.get("state", "missing"),
            "pretrain": _last(read_scalars(pre).get("val/acc1")) if pre.is_dir() else None,
            "probe": probe.get("linear_probe_acc1"), "knn": probe.get("knn_acc1"),
            "finetune": _last(read_scalars(ft).get("val/acc1")) if ft.is_dir() and status.get("state") == "done"
            else None,
        })
    return rows


_COLS = (("pretrain", "pre-train top-1"), ("probe", "linear probe"), ("knn", "k-NN (k=20)"),
         ("finetune", "fine-tune top-1"))


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.2f}"


def _mean_std(xs: list[float]) -> str:
    if not xs:
        return "–"
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return f"{100 * m:.2f} ± {100 * sd:.2f}"


def render_stages(rows: list[dict[str, Any]], recipe: str) -> str:
    """The report's section: mean ± std (sample std, over seeds) per method and stage, then every seed's row
    (methods side by side for the same seed: the pairing)."""
    if not rows:
        return ""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = [f"## Downstream: {Path(recipe).stem}", "",
             "Each pre-training checkpoint (`checkpoints/last.ckpt`) fine-tuned and probed on the downstream recipe "
             "(top-1 %, mean ± std over seeds; probe: logistic regression on frozen features, k-NN: cosine, k=20).",
             "", "| method | n | " + " | ".join(t for _, t in _COLS) + " |", "|---|---|" + "---|" * len(_COLS)]
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        cells = [_mean_std([r[k] for r in mine if r[k] is not None]) for k, _ in _COLS]
        lines.append(f"| {m} | {len(mine)} | " + " | ".join(cells) + " |")
    lines += ["", "Per seed (paired: the same seed's data order and downstream seed for every method):", "",
              "| seed | method | " + " | ".join(t for _, t in _COLS) + " | fine-tune state |",
              "|---|---|" + "---|" * (len(_COLS) + 1)]
    for seed in sorted({r["seed"] for r in rows}):
        for r in (r for r in rows if r["seed"] == seed):
            lines.append(f"| {seed} | {r['method']} | " + " | ".join(_pct(r[k]) for k, _ in _COLS)
                         + f" | {r['state']} |")
    return "\n".join(lines) + "\n"
