"""``impulsevit study``: real ``impulsevit fit`` runs per method x seed, a report whose numbers are the runs' logged
metrics (read here with TensorBoard's raw ``EventFileLoader``, not the study's own reader), failed and unfinished runs
listed, per-method overrides from the recipe header, and the SLURM array path (script + one task run as SLURM would)."""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_cluster import slurm_cluster  # noqa: F401  (module-scoped loopback SLURM fixture)
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from impulsevit import study
from impulsevit.errors import ConfigError
from impulsevit.run.recipes import packaged_recipes_dir

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

TINY_RECIPE = """\
# Tiny study recipe for tests: 1-block ViT on synthetic blobs, 2 epochs
# paper: {impulse: 55.5}
# study: {methods: [impulse, torch], overrides: {torch: [--trainer.max_epochs=3]}}
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  precision: 32-true
  max_epochs: 2
  log_every_n_steps: 1
  enable_progress_bar: false
  enable_model_summary: false
model:
  backbone: vit_tiny_patch16_224
  backbone_kwargs: {img_size: 16, patch_size: 4, embed_dim: 32, depth: 1, num_heads: 2}
  init: {method: impulse, seed: 0}
  optimizer: {name: adamw, lr: 3.0e-3, weight_decay: 0.05}
  scheduler: {name: cosine, warmup_epochs: 0, min_lr: 1.0e-5}
  mixup: null
  log_attention: false
data:
  class_path: impulsevit.data.SyntheticDataModule
  init_args: {num_classes: 4, image_size: 16, num_train: 64, num_val: 32, batch_size: 16, noise: 2.0}
"""


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    path = tmp_path / "tiny_study.yaml"
    path.write_text(TINY_RECIPE)
    return path


def val_acc1(run_dir: Path) -> list[float]:
    """``val/acc1`` of a run, one value per validation in step order, straight from the event protobufs."""
    points = []
    for f in sorted(run_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(f)).Load():
            for v in event.summary.value:
                if v.tag == "val/acc1":
                    value = v.simple_value if v.HasField("simple_value") else float(v.tensor.float_val[0])
                    points.append((event.step, event.wall_time, value))
    return [v for _, _, v in sorted(points)]


def table_rows(md: str, header: str) -> dict[str, list[str]]:
    """Rows of the markdown table whose header line starts with ``header``, keyed by the first cell."""
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def mean_std(xs: list[float]) -> str:
    xs = [100 * x for x in xs]
    return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.2f}"


@pytest.mark.slow
def test_study_report_matches_logged_metrics_and_lists_failures(recipe: Path, tmp_path: Path, capsys) -> None:
    runs_dir = tmp_path / "runs"
    # --runs_dir (fit's spelling) is the study's --runs-dir, not an override that would move the runs out of the study
    rc = study.main(["--recipe", str(recipe), "--methods", "impulse,torch,nosuch", "--seeds", "2",
                     "--runs_dir", str(runs_dir)])
    assert rc == 1, "a study with failed runs must exit non-zero"
    sdir = runs_dir / "tiny_study-study"
    plan = json.loads((sdir / "study.json").read_text())
    assert [r["name"] for r in plan["runs"]] == ["impulse-s0", "impulse-s1", "torch-s0", "torch-s1",
                                                 "nosuch-s0", "nosuch-s1"]

    curves = {name: val_acc1(sdir / name) for name in ("impulse-s0", "impulse-s1", "torch-s0", "torch-s1")}
    # the recipe's 2 epochs, and 3 for torch from the header's per-method override
    assert {n: len(c) for n, c in curves.items()} == {"impulse-s0": 2, "impulse-s1": 2, "torch-s0": 3, "torch-s1": 3}
    assert curves["impulse-s0"] != curves["impulse-s1"], "seeds 0 and 1 gave identical curves"

    md = (sdir / "report.md").read_text()
    assert md in capsys.readouterr().out
    per_run = table_rows(md, "| run |")
    for name, c in curves.items():
        state, final, best, test, _ = per_run[name]
        assert (state, final, best, test) == ("done", f"{100 * c[-1]:.2f}", f"{100 * max(c):.2f}", "–")
    for name in ("nosuch-s0", "nosuch-s1"):
        assert per_run[name][0] == "failed" and per_run[name][4].startswith("exit code ")
        status = json.loads((sdir / name / "status.json").read_text())
        assert status["state"] == "failed" and status["returncode"] != 0
        assert "nosuch" in (sdir / name / "study_fit.log").read_text()

    per_method = table_rows(md, "| method |")
    for m in ("impulse", "torch"):
        cs = [curves[f"{m}-s0"], curves[f"{m}-s1"]]
        assert per_method[m][:4] == ["2", mean_std([c[-1] for c in cs]), mean_std([max(c) for c in cs]), "–"]
    assert per_method["impulse"][4] == "55.5" and per_method["torch"][4] == "–"
    assert per_method["nosuch"][:2] == ["0", "–"]
    assert "**2 run(s) not finished or failed:** nosuch-s0 (failed), nosuch-s1 (failed)" in md
    png = (sdir / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000

    # attention locality per layer (the runs' attention/step_*.json, read here with json): init -> end per method
    attention = table_rows(md, "| method | layer |")
    for m in ("impulse", "torch"):
        files = [sorted((sdir / f"{m}-s{s}" / "attention").glob("step_*.json")) for s in (0, 1)]
        assert all(len(f) == len(curves[f"{m}-s0"]) + 1 for f in files)  # init + one point per epoch
        for col, metric in ((1, "distance"), (2, "offset_mass")):
            first = [json.loads(f[0].read_text())["sources"]["images"]["means"][metric][0] for f in files]
            last = [json.loads(f[-1].read_text())["sources"]["images"]["means"][metric][0] for f in files]
            fmt = lambda xs: f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"  # noqa: E731
            assert attention[m][0] == "0" and attention[m][col] == f"{fmt(first)} → {fmt(last)}", (m, metric)
    assert (sdir / "report_attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --collect rebuilds the report from the run directories; a run that is still running is listed, not dropped
    (sdir / "report.md").unlink()
    (sdir / "impulse-s1" / "status.json").write_text(json.dumps({"state": "running"}))
    assert study.main(["--recipe", str(recipe), "--runs-dir", str(runs_dir), "--collect"]) == 1
    md = (sdir / "report.md").read_text()
    assert table_rows(md, "| run |")["impulse-s1"][0] == "running"
    assert table_rows(md, "| method |")["impulse"][:2] == ["1", mean_std([curves["impulse-s0"][-1]])]
    assert "impulse-s1 (running)" in md

    # continuing the study: more seeds are planned beside the finished runs; other settings are refused before work
    # (the finished runs would be skipped and reported beside new ones as one configuration)
    base = ["--recipe", str(recipe), "--methods", "impulse,torch,nosuch", "--runs-dir", str(runs_dir)]
    plan_text = (sdir / "study.json").read_text()
    capsys.readouterr()
    assert study.main([*base, "--seeds", "3", "--dry-run"]) == 0
    assert "impulse-s2 (to run)" in capsys.readouterr().out
    recipe.write_text(recipe.read_text() + "# a comment changes no setting\n")
    assert study.main([*base, "--seeds", "2", "--dry-run"]) == 0
    with pytest.raises(ConfigError, match=r"study.json: 6 run\(s\) of this study were started with other settings "
                                          r"\(overrides \[\] then, \['--trainer.max_epochs=5'\] now\)"):
        study.main([*base, "--seeds", "2", "--trainer.max_epochs=5"])
    recipe.write_text(recipe.read_text().replace("lr: 3.0e-3", "lr: 1.0e-3"))
    with pytest.raises(ConfigError, match=r"started with other settings \(the recipe's settings changed"):
        study.main([*base, "--seeds", "2", "--dry-run"])
    assert (sdir / "study.json").read_text() == plan_text


def test_recipe_headers(tmp_path: Path) -> None:
    r = tmp_path / "r.yaml"
    r.write_text(TINY_RECIPE)
    assert study.paper_numbers(r) == {"impulse": 55.5}
    assert study.study_header(r) == {"methods": ["impulse", "torch"],
                                     "overrides": {"torch": ["--trainer.max_epochs=3"]}, "reference": None}
    assert study.run_args("torch", 2, study.study_header(r)["overrides"]) == [
        "--model.init.method=torch", "--model.init.seed=2", "--seed_everything=2", "--trainer.max_epochs=3"]
    assert study.run_args("impulse", 0, {}) == ["--model.init.method=impulse", "--model.init.seed=0",
                                                "--seed_everything=0"]
    # a header comment after the YAML starts is not a header
    r.write_text("seed_everything: 0\n# paper: {impulse: 1.0}\n")
    assert study.paper_numbers(r) == {} and study.study_header(r) == {"methods": None, "overrides": {},
                                                                     "reference": None}
    for bad in ("# study: [impulse]", "# study: {method: [impulse]}", "# study: {overrides: {random: x}}",
                "# study: {overrides: {random: [spatial_trainable=true]}}", "# study: {methods: impulse}",
                "# study: {reference: [torch]}"):
        r.write_text(bad + "\nseed_everything: 0\n")
        with pytest.raises(ValueError, match=str(r)):
            study.study_header(r)
    r.write_text("# paper: 77.0\n")
    with pytest.raises(ValueError, match="paper"):
        study.paper_numbers(r)


def test_shipped_cpu_recipes_have_study_headers() -> None:
    root = packaged_recipes_dir()
    for name, methods in (("cpu_fmnist_vit", ["impulse", "mimetic", "torch"]),
                          ("cpu_digits_vit", ["impulse", "mimetic", "torch"]),
                          ("cpu_fmnist_convmixer", ["impulse", "box", "random"])):
        header = study.study_header(root / f"{name}.yaml")
        assert header["methods"] == methods
    cm = study.study_header(root / "cpu_fmnist_convmixer.yaml")["overrides"]
    assert cm == {"random": ["--model.backbone_kwargs.spatial_trainable=true"]}
    recipe = yaml.safe_load((root / "cpu_fmnist_convmixer.yaml").read_text())
    assert recipe["model"]["backbone_kwargs"]["spatial_trainable"] is False  # only the random runs train the filters


def test_submit_dry_run_prints_array_script_and_writes_nothing(recipe: Path, tmp_path: Path, capsys) -> None:
    runs_dir = tmp_path / "runs"
    rc = study.main(["--recipe", str(recipe), "--seeds", "3", "--runs-dir", str(runs_dir), "--submit", "--dry-run",
                     "--time", "00:10:00", "--trainer.max_epochs=1"])
    assert rc == 0
    script = capsys.readouterr().out
    assert "#SBATCH --array=0-5" in script and "#SBATCH --time=00:10:00" in script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    sdir = runs_dir / "tiny_study-study"
    assert f" study --array-task {sdir} fit --recipe {recipe} " in srun
    assert srun.endswith(" --trainer.max_epochs=1") and "--time" not in srun
    assert not runs_dir.exists()


def test_dry_run_without_submit_prints_every_run_s_command_and_writes_nothing(recipe: Path, tmp_path: Path,
                                                                              capsys) -> None:
    """`impulsevit study --dry-run` (no --submit) through the real CLI: one line per plan entry with its --run-index,
    state and fit command (the recipe header's per-method overrides included), and nothing written or run; a done
    run of an existing study says so; a --run-index outside the plan and --then-args without --then are refused."""
    runs_dir = tmp_path / "runs"
    args = ["--recipe", str(recipe), "--seeds", "2", "--runs-dir", str(runs_dir), "--dry-run", "--trainer.max_epochs=1"]
    out = subprocess.run([sys.executable, "-m", "impulsevit.cli", "study", *args], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[study] ")]
    assert [ln.split(" ")[1:3] for ln in lines[:4]] == [["0", "impulse-s0"], ["1", "impulse-s1"], ["2", "torch-s0"],
                                                        ["3", "torch-s1"]]
    cmd = shlex.split(lines[2].split(": ", 1)[1])
    assert cmd[:3] == ["impulsevit", "fit", "--recipe"] and "--model.init.method=torch" in cmd
    assert "--trainer.max_epochs=3" in cmd and cmd[-1] == "--trainer.max_epochs=1"  # header's, then the user's
    assert "(to run)" in lines[0] and "nothing was written or started" in lines[-1]
    assert not runs_dir.exists()

    sdir = runs_dir / "tiny_study-study" / "impulse-s0"
    sdir.mkdir(parents=True)
    (sdir / "status.json").write_text(json.dumps({"state": "done", "returncode": 0}))
    assert study.main([*args, "--run-index", "0"]) == 0
    assert "[study] 0 impulse-s0 (done): impulsevit fit" in capsys.readouterr().out
    assert sorted(p.name for p in (runs_dir / "tiny_study-study").iterdir()) == ["impulse-s0"]
    with pytest.raises(ConfigError, match=re.escape("--run-index 4: the plan has 4 runs (0..3)")):
        study.main([*args, "--run-index", "4"])
    with pytest.raises(ConfigError, match="--then-args: the downstream stage's overrides need --then"):
        study.main([*args, "--then-args=--trainer.max_epochs=1"])


@pytest.mark.slow
def test_array_task_runs_its_plan_entry_like_slurm_would(recipe: Path, tmp_path: Path, monkeypatch) -> None:
    """``--submit`` without ``sbatch`` on PATH writes the plan and the script (and fails, naming sbatch); then the
    script's command for array task 3 runs here with the variables SLURM would set."""
    runs_dir, empty = tmp_path / "runs", tmp_path / "empty_path"
    empty.mkdir()
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(empty))  # no sbatch
    assert study.main(["--recipe", str(recipe), "--seeds", "2", "--runs-dir", str(runs_dir), "--submit",
                       "--trainer.max_epochs=1"]) == 1
    monkeypatch.setenv("PATH", path)
    sdir = runs_dir / "tiny_study-study"
    plan = json.loads((sdir / "study.json").read_text())
    assert plan["runs"][3]["name"] == "torch-s1"
    script = (sdir / "submit.sbatch").read_text()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    command = re.sub(r"^srun \S+ ", "", srun)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "3", "SLURM_PROCID": "0"}
    assert Path(shlex.split(command)[0]).parent == Path(sys.executable).parent
    proc = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    status = json.loads((sdir / "torch-s1" / "status.json").read_text())
    assert status["state"] == "done"
    # the header's torch override (3 epochs) came before the job's own override (1 epoch), which wins
    assert len(val_acc1(sdir / "torch-s1")) == 1
    config = (sdir / "torch-s1" / "config.yaml").read_text()
    assert re.search(r"method: torch", config) and re.search(r"seed_everything: 1", config)
    assert not (sdir / "task3").exists()
    results = {r.name: r.state for r in study.collect(sdir)}
    assert results == {"impulse-s0": "missing", "impulse-s1": "missing", "torch-s0": "missing", "torch-s1": "done"}
    assert shlex.split(command)[1:4] == ["study", "--array-task", str(sdir)]


@pytest.mark.slow
@pytest.mark.slurm
def test_submit_runs_the_plan_as_a_real_slurm_array(recipe: Path, tmp_path: Path, slurm_cluster) -> None:  # noqa: F811
    """``study --submit`` on a loopback SLURM cluster: both array tasks run their plan entries, then ``--collect``."""
    env = {**slurm_cluster.env, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "impulsevit.cli", "study", "--recipe", str(recipe), "--methods", "impulse,torch",
           "--seeds", "1", "--runs-dir", str(tmp_path / "runs")]
    proc = subprocess.run([*cli, "--submit", "--trainer.max_epochs=1"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "Submitted batch job" in proc.stdout, proc.stdout + proc.stderr
    sdir = tmp_path / "runs" / "tiny_study-study"
    states: dict[str, str] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < 300:
        states = {n: json.loads((sdir / n / "status.json").read_text())["state"]
                  for n in ("impulse-s0", "torch-s0") if (sdir / n / "status.json").exists()}
        if len(states) == 2 and "running" not in states.values():
            break
        time.sleep(1)
    logs = "\n".join(p.read_text() for p in (sdir / "slurm").glob("*.out"))
    assert states == {"impulse-s0": "done", "torch-s0": "done"}, f"{states}\n{logs}\n{slurm_cluster.logs()}"
    proc = subprocess.run([*cli, "--collect"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = table_rows((sdir / "report.md").read_text(), "| run |")
    for name in ("impulse-s0", "torch-s0"):
        assert rows[name][:3] == ["done", f"{100 * val_acc1(sdir / name)[-1]:.2f}",
                                  f"{100 * val_acc1(sdir / name)[-1]:.2f}"]


def _real_attention_run(tmp_path: Path) -> Path:
    """A finished tiny run (tiny synthetic recipe, 2 epochs: records at steps 0, 4, 8 = init, epoch_1, epoch_2) written
    by the real ``AttentionEvolution`` through the CLI."""
    from _cli_helpers import run_cli, tiny

    run_cli(*tiny(tmp_path, "real"))
    return tmp_path / "real"


def _study_of(sdir: Path, runs: dict[str, list[dict]]) -> None:
    """A study folder whose runs (``<method>-s<seed>``) are done and hold exactly ``runs[name]`` as attention records
    (and one val/acc1 each, so that ``collect`` keeps them as done)."""
    from torch.utils.tensorboard import SummaryWriter

    plan = {"recipe": "tiny", "methods": sorted({n.split("-")[0] for n in runs}), "seeds": 2, "overrides": [],
            "runs": [{"method": n.split("-")[0], "seed": int(n.split("-s")[1]), "name": n, "args": []} for n in runs]}
    sdir.mkdir(parents=True)
    (sdir / "study.json").write_text(json.dumps(plan))
    for name, records in runs.items():
        (sdir / name / "attention").mkdir(parents=True)
        (sdir / name / "status.json").write_text(json.dumps({"state": "done", "returncode": 0}))
        with SummaryWriter(str(sdir / name)) as w:
            w.add_scalar("val/acc1", 0.5, 1)
        for rec in records:
            (sdir / name / "attention" / f"step_{rec['step']:08d}.json").write_text(json.dumps(rec))


def test_attention_figure_and_table_use_the_recorded_epochs(tmp_path: Path) -> None:
    """Seeds with different records (one lost epoch_1, as a run preempted at the last step of epoch 1 and resumed
    does; one that kept an earlier life's second epoch_2 record at another step): the figure's x is each record's
    epoch, each point the mean over the seeds that recorded it, and the table's "end" is the figure's last point."""
    import matplotlib

    matplotlib.use("Agg")
    from unittest import mock

    import matplotlib.axes

    from impulsevit.study.report import collect, read_attention, render_attention_plot, render_report

    real = _real_attention_run(tmp_path)
    recs = [json.loads(f.read_text()) for f in sorted((real / "attention").glob("step_*.json"))]
    assert [(r["point"], r["step"]) for r in recs] == [("init", 0), ("epoch_1", 4), ("epoch_2", 8)]

    def shifted(rec: dict, by: float, **fields) -> dict:  # the same record with every per-layer mean moved by ``by``
        out = json.loads(json.dumps(rec)) | fields
        means = out["sources"]["images"]["means"]
        out["sources"]["images"]["means"] = {k: [v + by for v in vs] for k, vs in means.items()}
        return out

    init, e1, e2 = recs
    stale_e2 = shifted(e2, 5.0, step=6)  # an earlier life's epoch_2 at step 6: the later one (step 8) counts
    sdir = tmp_path / "study"
    _study_of(sdir, {"impulse-s0": [init, e1, e2], "impulse-s1": [shifted(init, 0.1), shifted(e2, 0.1), stale_e2],
                     "torch-s0": [init, e1, e2], "torch-s1": [init, e1, e2]})
    assert sorted(read_attention(sdir / "impulse-s1")["distance"]) == [0, 2]  # one record per epoch, no epoch 1

    results = collect(sdir)
    drawn: dict[str, list[tuple[list[float], list[float]]]] = {}
    real_plot = matplotlib.axes.Axes.plot

    def spy(self, x, y, *args, **kwargs):  # noqa: ANN001, ANN202
        drawn.setdefault(kwargs.get("label"), []).append((list(x), list(y)))
        return real_plot(self, x, y, *args, **kwargs)

    with mock.patch.object(matplotlib.axes.Axes, "plot", spy):
        png = render_attention_plot(results)
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"
    d0 = [r["sources"]["images"]["means"]["distance"][0] for r in (init, e1, e2)]
    x, y = drawn["impulse"][0]  # distance, layer 0
    assert x == [0, 1, 2]
    assert y == pytest.approx([d0[0] + 0.05, d0[1], d0[2] + 0.05])  # epoch 1: seed 0 alone
    assert drawn["torch"][0][0] == [0, 1, 2]

    md = render_report("s", {"recipe": "tiny", "seeds": 2}, results, {})
    assert "impulse: init (2 of 2 runs) → epoch 2 (2 of 2 runs)" in md
    row = next(line for line in md.splitlines() if line.startswith("| impulse | 0 |")).strip("|").split("|")
    end = statistics.mean([d0[2], d0[2] + 0.1])
    assert row[2].strip().endswith(f"→ {end:.3f} ± {statistics.stdev([d0[2], d0[2] + 0.1]):.3f}")
    assert f"{y[-1]:.3f}" == f"{end:.3f}"  # the table's end is the figure's last point


def test_plan_conflicts_name_what_a_continued_study_would_change() -> None:
    from impulsevit.study.plan import plan_conflicts

    runs = [{"name": "impulse-s0", "args": ["--model.init.method=impulse"]}]
    then = {"recipe": "r.yaml", "recipe_sha256": "a", "args": ["--trainer.max_epochs=2"], "runs": []}
    old = {"recipe": "r.yaml", "recipe_sha256": "x", "overrides": [], "runs": runs, "then": then}
    more = {**old, "runs": [*runs, {"name": "impulse-s1", "args": ["--model.init.method=impulse"]}]}
    assert plan_conflicts(old, more) == [] and plan_conflicts(old, {**old, "runs": []}) == []
    assert plan_conflicts({k: v for k, v in old.items() if k != "recipe_sha256"}, {**old, "recipe_sha256": "y"}) == []
    changed = {**old, "recipe_sha256": "y", "overrides": ["--a=1"], "runs": [{"name": "impulse-s0", "args": ["--b"]}],
               "then": {**then, "recipe_sha256": "b", "args": []}}
    found = plan_conflicts(old, changed)
    assert [f.split(" ")[0] for f in found] == ["overrides", "the", "--then-args", "the", "run"], found
    assert "run impulse-s0: ['--model.init.method=impulse'] then, ['--b'] now" in found
