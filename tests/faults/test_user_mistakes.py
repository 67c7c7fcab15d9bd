"""A user's mistakes, through the real ``impulsevit`` command (a child process, :mod:`tests.faults.harness`): every
subcommand, given bad numbers, missing or unreadable files, paths of the wrong kind, a plugin module that raises, an
accelerator this machine lacks, prints ONE line ``impulsevit SUB: error: ...`` naming what to fix and exits 2 (the
command cannot work as given) or 1 (the environment or the data failed), never a traceback; ``--debug`` keeps it.

Most cases fail before any work (seconds each); one module-scoped ``fit`` provides the checkpoint and exported folder
the ``export`` / ``predict`` cases read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from impulsevit.data.loading.base import check_batch_size, check_num_workers
from impulsevit.run.preflight import check_epochs
from impulsevit.training.config import MixupConfig, OptimizerConfig, SchedulerConfig
from tests.faults.harness import TINY, assert_one_line_error, run, small_tmpfs, snapshot

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

SHORT = ("--trainer.max_epochs=1", "--data.init_args.num_train=32", "--data.init_args.num_val=16")


@dataclass
class Ctx:
    """Paths a case's command line may name."""

    tmp: Path
    ckpt: Path
    exported: Path

    @property
    def runs(self) -> str:
        return f"--runs_dir={self.tmp / 'runs'}"


def _images(root: Path, per_class: int = 4, bad: dict[str, bytes] | None = None) -> Path:
    """An ImageFolder tree ``root/{train,val}/{a,b}/`` of 32 px JPEGs, plus ``bad`` files (relative path -> bytes)."""
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for j in range(per_class):
                pixels = (np.random.RandomState(j + 7 * len(c)).rand(32, 32, 3) * 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{j}.jpg")
    for rel, data in (bad or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _folder_data(root: Path, **extra: object) -> str:
    init = {"dataset": "imagefolder", "root": str(root), "backend": "torchvision", "image_size": 32, "batch_size": 2,
            "num_workers": 0, **extra}
    return f"--data={json.dumps({'class_path': 'impulsevit.data.ImageDataModule', 'init_args': init})}"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Ctx:
    """A trained tiny checkpoint and its exported folder, and the files the cases name."""
    tmp = tmp_path_factory.mktemp("mistakes")
    res = run("fit", "--recipe", TINY, f"--runs_dir={tmp / 'trained'}", "--name=t", *SHORT, cwd=tmp)
    assert res.rc == 0, res.err[-3000:]
    ckpt = tmp / "trained" / "t" / "checkpoints" / "last.ckpt"
    res = run("export", ckpt, tmp / "exported", cwd=tmp)
    assert res.rc == 0, res.err[-3000:]
    (tmp / "afile").write_text("not a folder\n")
    (tmp / "adir").mkdir()
    (tmp / "adir" / "notes.txt").write_text("no model here\n")
    (tmp / "plug").mkdir()
    (tmp / "plug" / "raising_plugin.py").write_text("REGISTERED = True\nraise RuntimeError('boom at import')\n")
    _images(tmp / "imgs")
    # an exported folder whose config no longer fits its weights (one block more than the weights hold)
    mismatch = tmp / "mismatch"
    mismatch.mkdir()
    for f in (tmp / "exported").iterdir():
        (mismatch / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((mismatch / "config.json").read_text())
    assert cfg["model_args"]["depth"] == 2, cfg["model_args"]
    cfg["model_args"]["depth"] = 3
    (mismatch / "config.json").write_text(json.dumps(cfg))
    # a checkpoint whose state-dict keys were renamed (its hyperparameters still name the model they came from)
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    saved["state_dict"] = {k.replace(".blocks.1.attn.", ".blocks.1.attention."): v
                           for k, v in saved["state_dict"].items()}
    torch.save(saved, tmp / "renamed.ckpt")
    return Ctx(tmp, ckpt, tmp / "exported")


def _fit(sub: str = "fit") -> Callable[[Ctx], list[str]]:
    return lambda c: [sub, "--recipe", str(TINY), c.runs, "--name=bad", *SHORT]


# (id, argv from the context, extra argv, exit status, substrings of the error line)
CASES: list[tuple[str, Callable[[Ctx], list[str]], list[str], int, tuple[str, ...]]] = [
    # ---- fit: bad numbers, declared once in the typed blocks / before work
    ("fit-lr-negative", _fit(), ["--model.optimizer.lr=-1"], 2,
     ("impulsevit fit: error:", "model.optimizer.lr must be > 0")),
    ("fit-epochs-infinite", _fit(), ["--trainer.max_epochs=-1"], 2, ("trainer.max_epochs=-1", "trainer.max_steps")),
    ("fit-workers-negative", _fit(), ["--data.init_args.num_workers=-1"], 2, ("data.num_workers must be >= 0",)),
    ("fit-batch-zero", _fit(), ["--data.init_args.batch_size=0"], 2, ("data.batch_size must be >= 1",)),
    ("fit-unknown-optimizer", _fit(), ["--model.optimizer.name=adamx"], 2,
     ("model.optimizer.name 'adamx' is not a timm optimizer", "'adamax'")),
    # ---- fit: init options, checked by the one schema check (init/options.py) before any work ({{ }}: format)
    ("fit-init-option-misspelt", _fit(), ['--model.init.options={{"gain_qq": 7.0}}'], 2,
     ("impulsevit fit: error:", "model.init.options: unknown option(s) ['gain_qq'] for init method 'impulse'",
      "did you mean 'gain_qk'?")),
    ("fit-init-option-bad-choice", _fit(), ['--model.init.options={{"kernel_size": 4}}'], 2,
     ("impulsevit fit: error:", "option 'kernel_size' of init method 'impulse' (vit) must be one of (3, 5), got 4")),
    ("fit-init-option-wrong-type", _fit(), ["--model.init.method=timm", '--model.init.options={{"mode": 3}}'], 2,
     ("impulsevit fit: error:", "option 'mode' of init method 'timm' (any) must be str, got 3")),
    # ---- fit: files and paths of the wrong kind
    ("fit-cache-dir-is-a-file", lambda c: ["fit", "--recipe", str(TINY), c.runs, "--name=bad",
                                           _folder_data(c.tmp / "imgs", cache_dir=str(c.tmp / "afile"))], [], 2,
     ("data.cache_dir", "afile is a file, not a folder")),
    ("fit-resume-a-folder", _fit(), ["--resume={tmp}/adir"], 2, ("--resume", "adir: a folder, not a checkpoint")),
    ("fit-plugin-raises", _fit(), ["--plugins", "raising_plugin"], 2,
     ("plugin module 'raising_plugin'", "RuntimeError", "boom at import", "raising_plugin.py:2")),
    # ---- validate / test / predict (LightningCLI)
    ("validate-lr-negative", _fit("validate"), ["--untrained", "--model.optimizer.lr=-1"], 2,
     ("impulsevit validate: error:", "model.optimizer.lr must be > 0")),
    ("test-missing-checkpoint", _fit("test"), ["--resume={tmp}/missing.ckpt"], 2,
     ("impulsevit test: error:", "no such checkpoint")),
    ("predict-batch-zero", _fit("predict"), ["--untrained", "--data.init_args.batch_size=0"], 2,
     ("impulsevit predict: error:", "data.batch_size must be >= 1")),
    # ---- predict MODEL IMAGES
    ("predict-folder-without-config", lambda c: ["predict", str(c.tmp / "adir"), str(c.tmp / "imgs")], [], 2,
     ("adir is not an exported model folder (no config.json), a run folder (no checkpoints/) nor a checkpoint",)),
    ("predict-missing-images", lambda c: ["predict", str(c.ckpt), str(c.tmp / "nothere")], [], 2,
     ("impulsevit predict: error:", "nothere")),
    ("predict-state-dict-mismatch", lambda c: ["predict", str(c.tmp / "mismatch"), str(c.tmp / "imgs"),
                                               f"--out={c.tmp / 'p.csv'}"], [], 2,
     ("the weights do not fit the model VisionTransformer", "tensor(s) missing from the weights (first: "
      "blocks.2.norm1.weight")),
    ("predict-renamed-keys", lambda c: ["predict", str(c.tmp / "renamed.ckpt"), str(c.tmp / "imgs"),
                                        f"--out={c.tmp / 'p.csv'}"], [], 2,
     ("impulsevit predict: error: checkpoint {tmp}/renamed.ckpt (backbone weights): the weights do not fit "
      "the model VisionTransformer: 4 tensor(s) missing from the weights (first: blocks.1.attn.qkv.weight, ",
      "4 tensor(s) unexpected (first: blocks.1.attention.qkv.weight")),
    # ---- export
    *[(f"export-renamed-keys-{fmt}", lambda c, out=out: ["export", str(c.tmp / "renamed.ckpt"), str(c.tmp / out)],
       [], 2, ("impulsevit export: error: checkpoint {tmp}/renamed.ckpt (backbone weights): the weights do "
               "not fit the model VisionTransformer: 4 tensor(s) missing from the weights (first: "
               "blocks.1.attn.qkv.weight, ", "4 tensor(s) unexpected (first: blocks.1.attention.qkv.weight"))
      for fmt, out in (("folder", "renamed-out"), ("state-dict", "renamed.pth"))],
    ("fit-resume-renamed-keys", _fit(), ["--resume={tmp}/renamed.ckpt"], 2,
     ("impulsevit fit: error: --resume {tmp}/renamed.ckpt does not fit the model: 8 tensor(s) missing from the "
      "weights (first: backbone.blocks.1.attn.qkv.weight, ", "8 tensor(s) unexpected (first: "
      "backbone.blocks.1.attention.qkv.weight")),
    ("export-missing-checkpoint", lambda c: ["export", str(c.tmp / "missing.ckpt"), str(c.tmp / "out")], [], 2,
     ("impulsevit export: error:", "missing.ckpt")),
    ("export-a-folder-that-is-no-checkpoint", lambda c: ["export", str(c.tmp / "adir"), str(c.tmp / "out")], [], 2,
     ("adir is a folder but not a checkpoint",)),
    # ---- convert
    ("convert-check-a-folder", lambda c: ["convert", "--check", str(c.tmp / "adir")], [], 1,
     ("adir is a folder, not a .beton file",)),
    ("convert-missing-source", lambda c: ["convert", str(c.tmp / "nothere"), str(c.tmp / "conv")], [], 2,
     ("nothere",)),
    # ---- download, data preview, study, submit, init, demo, recipes
    ("download-unknown-dataset", lambda c: ["download", "nosuchdataset", str(c.tmp / "dl")], [], 2,
     ("nosuchdataset",)),
    ("download-into-a-file", lambda c: ["download", "cifar10", str(c.tmp / "afile")], [], 2,
     ("afile is a file, not a folder",)),
    ("preview-batch-zero", lambda c: ["data", "preview", "--recipe", str(TINY), "--split", "train",
                                      f"--out={c.tmp / 'prev'}", "--data.init_args.batch_size=0"], [], 2,
     ("data.batch_size must be >= 1",)),
    ("submit-lr-negative", lambda c: ["submit", "--recipe", str(TINY), "--dry-run", "--model.optimizer.lr=-1"], [], 2,
     ("model.optimizer.lr must be > 0",)),
    ("study-plugin-raises", lambda c: ["study", "--recipe", str(TINY), "--plugins", "raising_plugin"], [], 2,
     ("plugin module 'raising_plugin'",)),
    ("study-owns-the-seed", lambda c: ["study", "--recipe", str(TINY), c.runs, "--seed_everything=3"], [], 2,
     ("impulsevit study: error:", "--seed_everything cannot be passed to a study", "--seeds")),
    ("study-owns-the-method", lambda c: ["study", "--recipe", str(TINY), c.runs, "--model.init.method", "torch"], [],
     2, ("--model.init.method cannot be passed to a study", "--methods")),
    ("init-plugin-raises", lambda c: ["init", "list", "--plugins", "raising_plugin"], [], 2,
     ("plugin module 'raising_plugin'",)),
    ("demo-img-size", lambda c: ["demo", "--img-size=40"], [], 2, ("impulsevit demo: error:", "--img-size 40")),
    ("recipes-plugin-raises", lambda c: ["recipes", "--plugins=raising_plugin"], [], 2, ("boom at import",)),
]


@pytest.mark.parametrize(("argv", "extra", "rc", "needles"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_its_exit_status(ctx: Ctx, argv, extra, rc, needles):  # noqa: ANN001
    """One line, the exit status of the policy, no traceback, and nothing written under the runs folder."""
    args = [*argv(ctx), *(a.format(tmp=ctx.tmp) for a in extra)]
    before = snapshot(ctx.tmp / "runs")
    res = run(*args, cwd=ctx.tmp, extra_env={"PYTHONPATH": _pythonpath(ctx)})
    assert_one_line_error(res, rc, *(n.format(tmp=ctx.tmp) for n in needles))
    assert snapshot(ctx.tmp / "runs") == before
    assert not (ctx.tmp / "renamed-out").exists() and not (ctx.tmp / "renamed.pth").exists()


def _pythonpath(ctx: Ctx) -> str:
    return os.pathsep.join([str(ctx.tmp / "plug"), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: OptimizerConfig(lr=0.0), "model.optimizer.lr must be > 0, got 0.0"),
        (lambda: OptimizerConfig(base_lr=-1e-3), "model.optimizer.base_lr must be > 0"),
        (lambda: OptimizerConfig(weight_decay=-0.1), "model.optimizer.weight_decay must be >= 0"),
        (lambda: OptimizerConfig(betas=(0.9, 1.5)), "model.optimizer.betas must be two numbers in [0, 1)"),
        (lambda: OptimizerConfig(layer_decay=0.0), "model.optimizer.layer_decay must be in (0, 1]"),
        (lambda: OptimizerConfig(name="sgdd"), "model.optimizer.name 'sgdd' is not a timm optimizer; did you mean"),
        (lambda: SchedulerConfig(warmup_epochs=-1), "model.scheduler.warmup_epochs must be >= 0"),
        (lambda: SchedulerConfig(epochs=0), "model.scheduler.epochs must be > 0"),
        (lambda: MixupConfig(prob=1.5), "model.mixup.prob must be in [0, 1]"),
        (lambda: MixupConfig(mode="pairs"), "model.mixup.mode must be 'batch', 'pair' or 'elem'"),
        (lambda: check_epochs(0, None), "trainer.max_epochs must be >= 1"),
        (lambda: check_epochs(-1, -1), "trainer.max_epochs=-1 means no epoch limit"),
        (lambda: check_num_workers(-2), "data.num_workers must be >= 0"),
        (lambda: check_batch_size(0), "data.batch_size must be >= 1"),
    ],
    ids=["lr-zero", "base-lr", "weight-decay", "betas", "layer-decay", "optimizer-name", "warmup", "sched-epochs",
         "mixup-prob", "mixup-mode", "epochs-zero", "epochs-infinite", "workers", "batch"],
)
def test_numeric_settings_are_checked_where_declared(make, expected):  # noqa: ANN001
    """The typed blocks' ``__post_init__`` and the data / trainer checks (in process: the same code every subcommand
    runs before work), each a one-line error naming the key; -1 epochs with max_steps is Lightning's meaning."""
    with pytest.raises(ValueError) as err:  # ConfigError (a ValueError) where impulsevit.errors may be imported
        make()
    assert expected in str(err.value) and "\n" not in str(err.value)
    check_epochs(-1, 100)  # no epoch limit, bounded by max_steps: allowed
    assert OptimizerConfig(name="AdamW", lr=1e-3).lr == 1e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_an_accelerator_this_machine_lacks_is_one_line(ctx: Ctx):
    res = run(*_fit()(ctx), "--trainer.accelerator=gpu", cwd=ctx.tmp)
    assert_one_line_error(res, 2, "trainer.accelerator='gpu'", "cannot run here", "no CUDA device")


def test_debug_keeps_the_traceback(ctx: Ctx):
    for how in (["--debug"], []):
        env = {} if how else {"IMPULSEVIT_DEBUG": "1"}
        res = run(*_fit()(ctx), "--model.optimizer.lr=-1", *how, cwd=ctx.tmp, extra_env=env)
        assert res.rc == 1 and "Traceback (most recent call last)" in res.err, res.err[-2000:]
        assert "ConfigError: model.optimizer.lr must be > 0" in res.err


def test_export_on_a_full_disk_is_one_line_naming_the_path(ctx: Ctx):
    """A tmpfs too small for the weights: one line naming the output, and no partial output left."""
    with small_tmpfs(ctx.tmp / "full", "64k") as full:
        res = run("export", ctx.ckpt, full / "model", cwd=ctx.tmp)
        line = assert_one_line_error(res, 1, "no space left on device")
        assert str(full) in line
        assert not [p for p in full.iterdir()], list(full.iterdir())


def test_corrupt_images_on_the_torchvision_backend_are_named_and_skipped(tmp_path):
    """A 0-byte and a truncated JPEG among good ones: the fit finishes and names both files (as the FFCV conversion
    lists its bad inputs); a tree of nothing but unreadable images is one DataError line."""
    bad = {"train/a/empty.jpg": b"", "train/b/truncated.jpg": b"\xff\xd8\xff\xe0" + b"\x00" * 64}
    root = _images(tmp_path / "imgs", bad=bad)
    res = run("fit", "--recipe", TINY, f"--runs_dir={tmp_path / 'runs'}", "--name=c", "--trainer.max_epochs=1",
              _folder_data(root), cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    for rel in bad:
        named = [ln for ln in res.err.splitlines() if "skipped unreadable image" in ln and str(root / rel) in ln]
        assert len(named) == 1, res.err[-3000:]
    assert (tmp_path / "runs" / "c" / "checkpoints" / "last.ckpt").is_file()

    only_bad = tmp_path / "only_bad"
    for split in ("train", "val"):
        for c in ("a", "b"):
            (only_bad / split / c).mkdir(parents=True)
            (only_bad / split / c / "x.jpg").write_bytes(b"")
    res = run("fit", "--recipe", TINY, f"--runs_dir={tmp_path / 'runs'}", "--name=d", "--trainer.max_epochs=1",
              _folder_data(only_bad), cwd=tmp_path)
    assert_one_line_error(res, 1, "none of the 2 images of this split can be read", "x.jpg")


@pytest.mark.parametrize(("argv", "needles"), [
    (["convert", "--preset", "res265", "a", "b"], ("impulsevit convert: error: argument --preset: invalid choice: "
                                                   "'res265' (choose from ", "'res256'", "did you mean 'res256'?")),
    (["convert", "--preset", "unknown", "a", "b"], ("invalid choice: 'unknown' (choose from ", "'short384')")),
    (["export", "a.ckpt", "out", "--format", "fodler"], ("impulsevit export: error:", "did you mean 'folder'?")),
    (["init", "lst"], ("impulsevit init: error:", "invalid choice: 'lst'", "did you mean 'list'?")),
    (["data", "previw"], ("impulsevit data: error: unknown command 'previw' (choose from preview); did you mean "
                          "'preview'?",)),
    (["data", "preview", "--recipe", "tiny_synthetic", "--split", "trian"], ("did you mean 'train'?",)),
    (["runs", "--sort", "top"], ("impulsevit runs: error: argument --sort: invalid choice: 'top'",)),
    (["study", "--recipe", "tiny_synthetic", "--methods"], ("impulsevit study: error: argument --methods: expected",)),
    (["submit", "--dry-run"], ("impulsevit submit: error: the following arguments are required: --recipe",)),
    (["predict", "m", "i", "--batch-size", "0"], ("impulsevit predict: error: argument --batch-size: must be >= 1",)),
    (["download", "cifar10"], ("impulsevit download: error: the following arguments are required: root",)),
    (["demo", "--layers", "x"], ("impulsevit demo: error: argument --layers: invalid int value: 'x'",)),
    (["fitt"], ("impulsevit: error: unknown subcommand 'fitt' (choose from ", "did you mean 'fit'?")),
], ids=lambda v: "-".join(v) if isinstance(v, list) else None)
def test_argument_errors_of_every_subcommand_are_one_line(tmp_path, argv, needles):  # noqa: ANN001
    """argparse prints its usage before the error; impulsevit's parser (impulsevit.argparser) prints the error alone,
    with the choices and the closest one."""
    res = run(*argv, cwd=tmp_path)
    assert len(res.err_lines) == 1, res.err
    assert_one_line_error(res, 2, *needles)
    assert list(tmp_path.iterdir()) == []
