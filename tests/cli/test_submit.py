"""`impulsevit submit`: sbatch script generation (golden files), options, defaults file, dry run, missing sbatch.

No SLURM needed here; the real-cluster tests are in tests/cluster/test_slurm.py. Regenerate the golden files after an
intended change with ``IMPULSEVIT_UPDATE_GOLDEN=1 pytest tests/cli/test_submit.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from impulsevit.cli.submit import main
from impulsevit.cluster.events import append_event, events_path, job_state, read_events
from impulsevit.cluster.sbatch import (
    FitJob,
    SlurmOptions,
    fit_command,
    parse_slurm_time,
    render_sbatch,
    sbatch_word,
)
from impulsevit.cluster.slurm_config import load_defaults

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TINY_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny_synthetic.yaml"

JOB = FitJob(recipe="/scratch/impulsevit/recipes/deit_base_in1k.yaml", run_name="deit_base_in1k",
             runs_dir=Path("/scratch/runs"), workdir=Path("/scratch/impulsevit"),
             fit_overrides=("--trainer.max_epochs=300",), launcher="impulsevit", data_workers=10)
LAYOUTS = {
    "1x8": SlurmOptions(nodes=1, gpus_per_node=8, cpus_per_task=12, mem="0", time="2-00:00:00", partition="gpu",
                        account="proj", exclusive=True, signal_lead_s=300),
    "4x8": SlurmOptions(nodes=4, gpus_per_node=8, cpus_per_task=12, mem="480G", time="1-12:00:00", partition="gpu",
                        qos="high", constraint="h100", exclusive=True, signal_lead_s=300),
}


def sbatch_lines(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.startswith("#SBATCH ")]


def srun_line(script: str) -> str:
    (line,) = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    return line


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_golden_sbatch(layout):
    script = render_sbatch(JOB, LAYOUTS[layout])
    path = GOLDEN / f"submit_{layout}.sbatch"
    if os.environ.get("IMPULSEVIT_UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text(), f"{path} differs; regenerate with IMPULSEVIT_UPDATE_GOLDEN=1 if intended"
    nodes, gpus = (int(x) for x in layout.split("x"))
    lines = sbatch_lines(script)
    assert f"#SBATCH --nodes={nodes}" in lines
    assert f"#SBATCH --ntasks-per-node={gpus}" in lines
    assert f"#SBATCH --gpus-per-node={gpus}" in lines
    assert "#SBATCH --signal=USR1@300" in lines and "#SBATCH --requeue" in lines
    assert "#SBATCH --output=/scratch/runs/deit_base_in1k/slurm/%j.out" in lines
    srun = srun_line(script)
    assert srun.startswith("srun --kill-on-bad-exit=1 impulsevit fit --recipe /scratch/impulsevit/recipes/")
    assert "--name deit_base_in1k --runs-dir /scratch/runs --resume auto" in srun
    assert f"--trainer.devices={gpus} --trainer.num_nodes={nodes}" in srun and "--trainer.accelerator=gpu" in srun
    assert "--trainer.callbacks" not in srun  # SlurmRequeue is one of every fit's standard callbacks
    assert srun.endswith("--trainer.max_epochs=300")
    assert 'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK}"' in script  # srun >= 22.05 does not inherit it
    proc = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_cpu_layout_and_container():
    opts = SlurmOptions(tasks_per_node=2, container_image="nvcr.io#me/impulsevit:latest")
    script = render_sbatch(JOB, opts)
    assert "#SBATCH --ntasks-per-node=2" in sbatch_lines(script)
    assert not any("gpus" in ln for ln in sbatch_lines(script))
    srun = srun_line(script)
    assert "--container-image=nvcr.io#me/impulsevit:latest" in srun
    assert "--container-mounts=/scratch/impulsevit:/scratch/impulsevit,/scratch/runs:/scratch/runs" in srun
    assert "--trainer.accelerator=cpu --trainer.devices=2 --trainer.num_nodes=1" in srun


def test_array_job_runs_each_task_in_its_own_dir():
    job = FitJob(**{**JOB.__dict__, "fit_overrides": ("--model.init.seed=%a", "--x=a b")})
    script = render_sbatch(job, SlurmOptions(array="0-3%2"))
    assert "#SBATCH --array=0-3%2" in sbatch_lines(script)
    assert "#SBATCH --output=/scratch/runs/deit_base_in1k/slurm/%A_%a.out" in sbatch_lines(script)
    srun = srun_line(script)
    assert '--name task"${SLURM_ARRAY_TASK_ID}" --runs-dir /scratch/runs/deit_base_in1k ' in srun
    assert srun.endswith("--model.init.seed=\"${SLURM_ARRAY_TASK_ID}\" '--x=a b'")
    out = subprocess.run(["bash", "-c", f"set -- ; printf '%s\\n' {srun.split(' fit ', 1)[1]}"], text=True,
                         capture_output=True, env={**os.environ, "SLURM_ARRAY_TASK_ID": "3"}, check=True).stdout
    args = out.splitlines()
    assert args[args.index("--name") + 1] == "task3" and "--model.init.seed=3" in args and "--x=a b" in args


@pytest.mark.parametrize(("value", "word"), [
    ("/scratch/runs/x/slurm/%j.out", "/scratch/runs/x/slurm/%j.out"),
    ("/my runs/x/%j.out", '"/my runs/x/%j.out"'),
    ("/r#1/x", '"/r\\#1/x"'),
    ("it's \"q\"", r'"it\'s \"q\""'),
])
def test_sbatch_word_quotes_what_sbatch_would_split(value, word):
    assert sbatch_word(value) == word


def test_output_path_with_space_percent_and_hash_is_one_sbatch_word():
    job = FitJob(**{**JOB.__dict__, "runs_dir": Path("/scratch/my runs #2 50%"), "run_name": "a b"})
    lines = sbatch_lines(render_sbatch(job, SlurmOptions()))
    assert '#SBATCH --output="/scratch/my runs \\#2 50%%/a b/slurm/%j.out"' in lines, lines
    assert '#SBATCH --job-name="a b"' in lines, lines


@pytest.mark.parametrize("value,seconds", [("30", 1800), ("5:30", 330), ("1:00:00", 3600), ("2-00", 172800),
                                           ("1-02:03", 93780), ("1-02:03:04", 93784)])
def test_parse_slurm_time(value, seconds):
    assert parse_slurm_time(value) == seconds


@pytest.mark.parametrize("opts,match", [
    (SlurmOptions(gpus_per_node=8, tasks_per_node=4), "one task per GPU"),
    (SlurmOptions(time="00:01:00", signal_lead_s=120), "signal_lead_s=120"),
    (SlurmOptions(time="forever"), "not a SLURM time"),
    (SlurmOptions(nodes=0), "nodes must be"),
    (SlurmOptions(array="0-3; rm -rf /"), "array="),
    (SlurmOptions(array="0-"), "array='0-': '0-' is not N, N-M or N-M:STEP"),
    (SlurmOptions(array="5-2"), "ends before it starts"),
    (SlurmOptions(mem="lots"), "mem='lots' is not a SLURM memory size"),
    (SlurmOptions(time="99:99"), "time='99:99' is out of range"),
    (SlurmOptions(time="1-25:00:00"), "out of range"),
    (SlurmOptions(partition="gpu\n#SBATCH --x"), "partition="),
])
def test_bad_options_are_named(opts, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        render_sbatch(JOB, opts)


def test_fit_command_matches_allocation():
    argv = fit_command(JOB, SlurmOptions(nodes=2, gpus_per_node=4))
    assert argv[:9] == ["fit", "--recipe", JOB.recipe, "--name", "deit_base_in1k", "--runs-dir", "/scratch/runs",
                        "--resume", "auto"]
    assert "--trainer.devices=4" in argv and "--trainer.num_nodes=2" in argv


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("IMPULSEVIT_SLURM_CONFIG", str(tmp_path / "slurm.yaml"))
    recipe = TINY_RECIPE.read_text()  # a real recipe: the dry run parses the fit configuration as `fit` would
    (tmp_path / "tiny.yaml").write_text(recipe)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "tiny.yaml").write_text(recipe)  # found by name from ./recipes
    return tmp_path


def test_dry_run_prints_and_writes_nothing(workdir, capsys):
    rc = main(["--recipe", "tiny.yaml", "--nodes", "4", "--gpus-per-node", "8", "--time", "10:00:00", "--dry-run",
               "--trainer.max_epochs=2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "#SBATCH --nodes=4" in out and "#SBATCH --ntasks-per-node=8" in out
    assert f"--recipe {workdir / 'tiny.yaml'} --name tiny --runs-dir {workdir / 'runs'} --resume auto" in out
    assert srun_line(out).endswith("--trainer.max_epochs=2")
    assert not (workdir / "runs").exists()


def test_defaults_file_and_flag_precedence(workdir, capsys):
    (workdir / "slurm.yaml").write_text("partition: big\naccount: acme\ngpus-per-node: 4\ntime: 90\n"
                                        "setup: ['module load cuda']\nextra_sbatch: ['--mail-type=END']\n")
    assert main(["--recipe", "tiny", "--partition", "small", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = sbatch_lines(out)
    assert "#SBATCH --partition=small" in lines and "#SBATCH --account=acme" in lines
    assert "#SBATCH --gpus-per-node=4" in lines and "#SBATCH --time=90" in lines
    assert "#SBATCH --mail-type=END" in lines and "\nmodule load cuda\n" in out


@pytest.mark.parametrize("text,match", [("partiton: gpu\n", "unknown key 'partiton'"),
                                        ("nodes: two\n", "nodes must be an integer"),
                                        ("- a\n", "expected a mapping")])
def test_defaults_file_errors_name_file_and_key(workdir, text, match):
    (workdir / "slurm.yaml").write_text(text)
    with pytest.raises(ValueError, match=re.escape(match)) as e:
        load_defaults()
    assert str(workdir / "slurm.yaml") in str(e.value)


def test_bad_input_exit_code_2(workdir, capsys):
    assert main(["--recipe", "nope.yaml", "--dry-run"]) == 2
    assert "unknown recipe 'nope.yaml'" in capsys.readouterr().err
    assert main(["--recipe", "tiny", "--gpus-per-node", "2", "--tasks-per-node", "3", "--dry-run"]) == 2
    assert "one task per GPU" in capsys.readouterr().err
    assert main(["--recipe", "tiny", "--gpus-per-node", "2", "--trainer.devices=4", "--dry-run"]) == 2
    assert "--trainer.devices is set by the batch script" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "expected"), [
    (["--model.init.methd=impulse"], "unknown key 'model.init.methd'; did you mean 'model.init.method'?"),
    (["--trainer.max_epochs=abc"], "trainer.max_epochs"),
    (["--mem", "lots"], "mem='lots' is not a SLURM memory size"),
    (["--array", "0-"], "array='0-'"),
    (["--time", "99:99"], "time='99:99' is out of range"),
    (["--name", "exp/a"], "a run name must be a single folder name"),
])
def test_dry_run_validates_fit_overrides_and_sbatch_values(workdir, capsys, args, expected):
    """The fit overrides are parsed by the real `fit` parser (same errors and suggestions) before anything is
    submitted; every sbatch value is checked; nothing is written."""
    assert main(["--recipe", "tiny", "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "impulsevit submit: error:" in err
    assert not (workdir / "runs").exists()


def test_missing_sbatch_names_the_script(workdir, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(workdir / "empty-bin"))
    assert main(["--recipe", "tiny", "--tasks-per-node", "2"]) == 1
    err = capsys.readouterr().err
    script = workdir / "runs" / "tiny" / "submit.sbatch"
    assert "`sbatch` not found" in err and f"sbatch {script}" in err
    assert script.read_text().startswith("#!/bin/bash\n")
    assert (workdir / "runs" / "tiny" / "slurm").is_dir()  # --output's directory must exist before sbatch


def test_events_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert job_state(tmp_path) == "pending"
    append_event(events_path(tmp_path), event="start", host="n1")
    assert job_state(tmp_path) == "running"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    append_event(events_path(tmp_path), event="exit", rc=0)
    evs = read_events(tmp_path)
    assert [(e["job"], e["restart"], e["event"]) for e in evs] == [("17", "0", "start"), ("17", "1", "exit")]
    assert job_state(tmp_path) == "completed"
    append_event(events_path(tmp_path), event="start")
    append_event(events_path(tmp_path), event="requeue", rc=0)
    append_event(events_path(tmp_path), event="exit", rc=0)
    assert job_state(tmp_path) == "requeued"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    append_event(events_path(tmp_path), event="start")
    append_event(events_path(tmp_path), event="exit", rc=1)
    assert job_state(tmp_path) == "failed"


def test_gpu_jobs_get_data_workers_plus_two_cpus_and_matching_omp_threads(tmp_path, capsys):
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "deit_base_in1k.yaml")  # num_workers: 10
    assert main(["--recipe", recipe, "--nodes", "2", "--gpus-per-node", "8", "--runs-dir", str(tmp_path),
                 "--slurm-config", str(tmp_path / "none.yaml"), "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --cpus-per-task=12" in sbatch_lines(script)
    assert "export OMP_NUM_THREADS=2" in script.splitlines()
    assert "# cpus-per-task = 10 data workers (recipe) + 2 (training process)" in script
    # a fit override of the workers counts; the site's / flag's value wins and the script says so
    assert main(["--recipe", recipe, "--gpus-per-node", "4", "--runs-dir", str(tmp_path), "--slurm-config",
                 str(tmp_path / "none.yaml"), "--dry-run", "--data.init_args.num_workers=4"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --cpus-per-task=6" in sbatch_lines(script) and "export OMP_NUM_THREADS=2" in script
    assert main(["--recipe", recipe, "--gpus-per-node", "4", "--cpus-per-task", "16", "--runs-dir", str(tmp_path),
                 "--slurm-config", str(tmp_path / "none.yaml"), "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --cpus-per-task=16" in sbatch_lines(script) and "export OMP_NUM_THREADS=6" in script
    assert "from the site's settings / --cpus-per-task" in script
    # CPU jobs: no default; torch uses whatever SLURM gives the task
    assert main(["--recipe", recipe, "--gpus-per-node", "0", "--runs-dir", str(tmp_path), "--slurm-config",
                 str(tmp_path / "none.yaml"), "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert not any("--cpus-per-task" in ln for ln in sbatch_lines(script))
    assert 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"' in script


def test_stage_to_copies_betons_once_per_node_and_fit_reads_the_copies(tmp_path, capsys):
    shared, local = tmp_path / "shared", tmp_path / "local"
    shared.mkdir()
    (shared / "train.beton").write_bytes(b"t" * 1000)
    (shared / "val.beton").write_bytes(b"v" * 10)
    (shared / "train.manifest.json").write_text("{}")  # travels with its file (val has none)
    args = ["--recipe", "vit_base_in21k", "--nodes", "2", "--gpus-per-node", "8", "--runs-dir", str(tmp_path),
            "--slurm-config", str(tmp_path / "none.yaml"), "--dry-run", "--stage-to", str(local)]
    assert main([*args, f"--data.init_args.storage.train_beton={shared / 'train.beton'}",
                 f"--data.init_args.storage.val_beton={shared / 'val.beton'}"]) == 0
    script = capsys.readouterr().out
    (srun,) = [ln for ln in script.splitlines() if ln.startswith("srun --kill-on-bad-exit=1 ")]
    assert f"--data.init_args.storage.train_beton={local / 'train.beton'}" in srun
    assert f"--data.init_args.storage.val_beton={local / 'val.beton'}" in srun and str(shared) not in srun
    (stage,) = [ln for ln in script.splitlines() if ln.startswith("srun --ntasks-per-node=1")]
    body = re.search(r"bash -c ('.*') \|\|", stage).group(1)
    # run the node prologue's shell code for real: copies, then keeps a same-size copy, replaces a stale one
    subprocess.run(["bash", "-c", f"bash -c {body}"], check=True)
    assert (local / "train.beton").read_bytes() == b"t" * 1000 and (local / "val.beton").read_bytes() == b"v" * 10
    assert (local / "train.manifest.json").read_text() == "{}" and not (local / "val.manifest.json").exists()
    before = (local / "train.beton").stat().st_mtime_ns
    (local / "val.beton").write_bytes(b"old")
    subprocess.run(["bash", "-c", f"bash -c {body}"], check=True)
    assert (local / "train.beton").stat().st_mtime_ns == before and (local / "val.beton").read_bytes() == b"v" * 10
    assert not list(local.glob("*.partial.*"))
    # without beton overrides there is nothing to stage: a clear error before anything is written
    assert main(args) == 2
    assert "needs the .beton files as fit overrides" in capsys.readouterr().err
