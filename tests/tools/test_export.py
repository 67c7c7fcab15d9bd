"""``impulsevit export`` and ``impulsevit predict``: real runs → timm model folders that plain timm loads in a fresh
process (ViT / Swin / Mixer; ConvMixer after ``import impulsevit.models``), with the run's head, data config and
logits; model cards; outputs that never replace what the program did not write; plain state dicts (single file and
FSDP2 folder); a folder of images → top-5 CSV whose accuracy is the ``test`` subcommand's.

One short run per family (module fixtures): a quickstart-like ViT on a Fashion-MNIST image folder (torchvision
backend, 24 px, bilinear, crop_pct 0.875, the dataset's mean / std), and ConvMixer / Swin / Mixer on the tiny
synthetic recipe.
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from _cli_helpers import REPO, TINY, run_cli, subprocess_env, tiny
from PIL import Image
from safetensors.torch import load_file

from impulsevit.cli import main
from impulsevit.training.module import ImageClassifier

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

KWARGS = {"img_size": 32, "patch_size": 4, "embed_dim": 64, "depth": 2, "num_heads": 2}  # tiny_synthetic's backbone
FMNIST_MEAN, FMNIST_STD = 0.2860, 0.3530
CLASSES = ["T-shirt-top", "Trouser", "Pullover", "Dress"]  # the first four Fashion-MNIST classes ('/' is a separator)
FAMILIES = {  # tiny_synthetic with another backbone: (backbone, kwargs, needs `import impulsevit.models`)
    "convmixer": ("convmixer_cifar", {"dim": 32, "depth": 2, "kernel_size": 3, "patch_size": 2}, True),
    "swin": ("swin_tiny_patch4_window7_224",
             {"img_size": 32, "patch_size": 2, "window_size": 4, "embed_dim": 24, "depths": [1, 1],
              "num_heads": [2, 4]}, False),
    # timm's registered Mixers fix patch_size / embed_dim / depth: Mixer-S/16 at 32 px (2 x 2 tokens), narrow MLPs
    "mixer": ("mixer_s16_224", {"img_size": 32, "mlp_ratio": [0.5, 1.0]}, False),
}


def _fmnist_folder(root: Path) -> Path:
    """``root/{train,val}/<class>/<n>.png``: 48 train and 16 val images of each of four Fashion-MNIST classes."""
    from impulsevit.data.sources.registry import get_dataset

    source = get_dataset("fashion_mnist").load(None, "test", verify="off")
    labels = np.asarray(source.labels)
    for c, name in enumerate(CLASSES):
        idx = np.flatnonzero(labels == c)[:64]
        for j, i in enumerate(idx):
            split = "train" if j < 48 else "val"
            (root / split / name).mkdir(parents=True, exist_ok=True)
            Image.fromarray(source.load(int(i))).save(root / split / name / f"{j}.png")
    return root


def _recipe(path: Path, root: Path) -> Path:
    path.write_text(textwrap.dedent(f"""\
        seed_everything: 0
        trainer: {{accelerator: cpu, devices: 1, precision: 32-true, max_epochs: 2, log_every_n_steps: 1,
                  enable_progress_bar: false, enable_model_summary: false}}
        model:
          backbone: vit_tiny_patch16_224
          backbone_kwargs: {{img_size: 24, patch_size: 4, embed_dim: 32, depth: 2, num_heads: 2, mlp_ratio: 2.0}}
          init: {{method: impulse, seed: 0}}
          optimizer: {{name: adamw, lr: 2.0e-3, weight_decay: 0.05}}
          scheduler: {{name: cosine, warmup_epochs: 0.2, warmup_lr: 1.0e-5, min_lr: 1.0e-5}}
          mixup: null
          label_smoothing: 0.1
          ema_decay: 0.9
          log_attention: false
        data:
          class_path: impulsevit.data.ImageDataModule
          init_args:
            dataset: imagefolder
            root: {root}
            backend: torchvision
            image_size: 24
            batch_size: 16
            num_workers: 0
            crop_pct: 0.875
            interpolation: bilinear
            mean: [{FMNIST_MEAN}, {FMNIST_MEAN}, {FMNIST_MEAN}]
            std: [{FMNIST_STD}, {FMNIST_STD}, {FMNIST_STD}]
            augment: {{scale: [0.6, 1.0], hflip: 0.5}}
        """))
    return path


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    """The quickstart-like run: ``(cli, run_dir, recipe, image root)``."""
    base = tmp_path_factory.mktemp("vit")
    root = _fmnist_folder(base / "fmnist")
    recipe = _recipe(base / "fmnist_vit.yaml", root)
    cli = run_cli("fit", "--recipe", str(recipe), f"--runs_dir={base / 'runs'}", "--name=vit")
    return cli, base / "runs" / "vit", recipe, root


@pytest.fixture(scope="module")
def family_runs(tmp_path_factory):
    """One epoch (4 steps) of the tiny recipe per family: ``{family: (cli, run_dir)}``."""
    runs = tmp_path_factory.mktemp("families")
    out = {}
    for family, (backbone, kwargs, _) in FAMILIES.items():
        cli = run_cli(*tiny(runs, family, "--trainer.max_epochs=1", f"--model.backbone={backbone}",
                            f"--model.backbone_kwargs={json.dumps(kwargs)}"))
        out[family] = (cli, runs / family)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One epoch of the tiny recipe (which has an EMA with decay 0.9): the run directory."""
    runs = tmp_path_factory.mktemp("runs")
    run_cli(*tiny(runs, "exp", "--trainer.max_epochs=1"))
    return runs / "exp"


def _last(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.ckpt"


def _export(ckpt: Path, out: Path, *extra: str) -> None:
    assert main(["export", str(ckpt), str(out), *extra]) == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "README.md"}


def _module_logits(ckpt: Path, x: torch.Tensor) -> torch.Tensor:
    module = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu").eval()
    with torch.no_grad():
        return module(x)


# ---------------------------------------------------------------------------------------------- plain timm loading
def test_plain_timm_loads_every_family_from_the_folder_in_a_fresh_process(vit_run, family_runs, tmp_path):
    """ViT / Swin / Mixer load with ``timm.create_model("local-dir:…", pretrained=True)`` in a process that never
    imports impulsevit; ConvMixer after ``import impulsevit.models``, as its card says. Each has the run's head, class
    names and data config, and gives the LightningModule's logits on the same batch."""
    runs = {"vit": _last(vit_run[1]), **{f: _last(d) for f, (_, d) in family_runs.items()}}
    sizes = {"vit": 24, "convmixer": 32, "swin": 32, "mixer": 32}
    folders, inputs = {}, {}
    for family, ckpt in runs.items():
        folders[family] = tmp_path / family
        _export(ckpt, folders[family])
        inputs[family] = torch.randn(3, 3, sizes[family], sizes[family], generator=torch.Generator().manual_seed(1))
    torch.save(inputs, tmp_path / "inputs.pt")
    script = textwrap.dedent(f"""\
        import json, sys
        import timm, torch
        from timm.data import resolve_data_config
        folders = {json.dumps({k: str(v) for k, v in folders.items()})}
        inputs = torch.load({str(tmp_path / 'inputs.pt')!r})
        out = {{}}
        for family in ("vit", "swin", "mixer", "convmixer"):
            if family == "convmixer":
                assert "impulsevit" not in sys.modules, "impulsevit was imported before ConvMixer"
                import impulsevit.models  # what the ConvMixer card says to do first
            m = timm.create_model("local-dir:" + folders[family], pretrained=True).eval()
            with torch.no_grad():
                logits = m(inputs[family])
            out[family] = dict(logits=logits, cfg=resolve_data_config({{}}, model=m),
                               labels=m.pretrained_cfg.get("label_names"), num_classes=m.num_classes)
        torch.save(out, {str(tmp_path / 'out.pt')!r})
        """)
    env = {k: v for k, v in subprocess_env().items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = torch.load(tmp_path / "out.pt", weights_only=False)
    for family, ckpt in runs.items():
        torch.testing.assert_close(loaded[family]["logits"], _module_logits(ckpt, inputs[family]), rtol=1e-5,
                                   atol=1e-6, msg=lambda m, f=family: f"{f}: {m}")
        cli = vit_run[0] if family == "vit" else family_runs[family][0]
        dm = cli.datamodule
        assert loaded[family]["num_classes"] == dm.num_classes
        assert loaded[family]["labels"] == dm.class_names
        expected = {k: tuple(v) if isinstance(v, tuple | list) else v for k, v in dm.eval_data_config().items()}
        got = {k: tuple(v) if isinstance(v, tuple | list) else v for k, v in loaded[family]["cfg"].items()}
        assert got.keys() == expected.keys(), family
        for key in ("mean", "std"):
            assert got[key] == pytest.approx(expected[key]), (family, key)
        assert {k: v for k, v in got.items() if k not in ("mean", "std")} == \
            {k: v for k, v in expected.items() if k not in ("mean", "std")}, family
    assert loaded["vit"]["labels"] == sorted(CLASSES)  # ImageFolder order
    assert loaded["vit"]["cfg"]["input_size"] == (3, 24, 24) and loaded["vit"]["cfg"]["interpolation"] == "bilinear"


def test_the_folders_data_config_builds_the_runs_evaluation_transform(vit_run, tmp_path):
    """``create_transform(**resolve_data_config({}, model=m))`` gives the pixels the run evaluated on: the datamodule's
    eval transform (torchvision backend, uint8) normalised as the datamodule does."""
    from impulsevit.data.augment.device import normalize

    cli, run_dir, _, root = vit_run
    _export(_last(run_dir), tmp_path / "vit")
    m = timm.create_model(f"local-dir:{tmp_path / 'vit'}", pretrained=True)
    ours = timm.data.create_transform(**timm.data.resolve_data_config({}, model=m))
    dm = cli.datamodule
    _, theirs = dm._timm_transforms()
    img = Image.open(next((root / "val" / CLASSES[1]).glob("*.png"))).convert("RGB").resize((37, 31))
    expected = normalize(theirs(img).unsqueeze(0), dm.mean, dm.std)[0]
    torch.testing.assert_close(ours(img), expected, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- the model card
def test_model_card_carries_the_run(vit_run, tmp_path):
    _, run_dir, _, _ = vit_run
    ckpt = _last(run_dir)
    _export(ckpt, tmp_path / "vit")
    card = (tmp_path / "vit" / "README.md").read_text()
    rec = torch.load(ckpt, map_location="cpu", weights_only=True)["callbacks"]["RunRecord"]
    init = next(v for k, v in torch.load(ckpt, map_location="cpu", weights_only=True)["callbacks"].items()
                if k.startswith("Initializer"))
    assert card.startswith("---\ntags:\n") and "library_name: timm" in card  # timm's hub card format
    for needle in ("# Model card for vit", "vit_tiny_patch16_224", "Structured Initialization for Vision Transformers",
                   "NeurIPS 2025", "Zheng", "Lucey", "**impulse** initialization", "local-dir:vit",
                   "resolve_data_config", "imagefolder", "interpolation: bilinear", "crop_pct: 0.875",
                   "Seed (seed_everything): 0", "Epochs: 2", "```bibtex", "Versions: impulsevit",
                   f"timm {timm.__version__}", f"torch {torch.__version__}", "Wall time: ", "Device: 1 x cpu",
                   "init=impulse family=vit", f"val/acc1: {100 * rec['metrics']['val/acc1']:.2f} %",
                   f"val_ema/acc1: {100 * rec['metrics']['val_ema/acc1']:.2f} %", ", ".join(sorted(CLASSES)),
                   "Resolved recipe", "backbone_kwargs"):
        assert needle in card, needle
    for key, value in init["report"]["options"].items():
        assert f"{key:<22} {value!r}" in card  # the init report's resolved options
    assert "import impulsevit.models" not in card  # ViT is timm's own
    cfg = json.loads((tmp_path / "vit" / "config.json").read_text())
    assert cfg["architecture"] == "vit_tiny_patch16_224" and cfg["num_classes"] == 4
    assert cfg["label_names"] == sorted(CLASSES)
    assert {k: cfg["model_args"][k] for k in ("img_size", "patch_size", "embed_dim", "depth", "num_heads",
                                              "mlp_ratio")} == {"img_size": [24, 24], "patch_size": 4,
                                                                "embed_dim": 32, "depth": 2, "num_heads": 2,
                                                                "mlp_ratio": 2.0}
    pc = cfg["pretrained_cfg"]
    assert pc["input_size"] == [3, 24, 24] and pc["mean"] == pytest.approx([FMNIST_MEAN] * 3)
    assert pc["std"] == pytest.approx([FMNIST_STD] * 3) and pc["crop_pct"] == 0.875


def test_convmixer_card_says_to_import_impulsevit_models(family_runs, tmp_path):
    _export(_last(family_runs["convmixer"][1]), tmp_path / "cm")
    card = (tmp_path / "cm" / "README.md").read_text()
    assert "import impulsevit.models" in card and "not in timm's registry" in card


def test_ema_export_holds_the_ema_weights(vit_run, tmp_path):
    ckpt = _last(vit_run[1])
    _export(ckpt, tmp_path / "ema", "--ema")
    sd = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    exported = load_file(tmp_path / "ema" / "model.safetensors")
    assert all(torch.equal(v, sd[f"ema.module.{k}"]) for k, v in exported.items())
    assert any(not torch.equal(v, sd[f"backbone.{k}"]) for k, v in exported.items())
    assert "Weights: the EMA copy" in (tmp_path / "ema" / "README.md").read_text()


# ---------------------------------------------------------------------------------------------- outputs and inputs
def test_export_never_replaces_what_it_did_not_write(trained, tmp_path, capsys):
    ckpt = _last(trained)
    mine = tmp_path / "project"
    (mine / "src").mkdir(parents=True)
    (mine / "src" / "notes.txt").write_text("keep me")
    assert main(["export", str(ckpt), str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not empty" in err and str(mine) in err
    assert (mine / "src" / "notes.txt").read_text() == "keep me" and {p.name for p in mine.iterdir()} == {"src"}
    assert main(["export", str(ckpt), str(mine), "--overwrite"]) == 2  # --overwrite replaces only an export
    assert (mine / "src" / "notes.txt").read_text() == "keep me"
    assert main(["export", str(ckpt), str(mine / "src" / "notes.txt")]) == 2  # a file is not a folder
    assert (mine / "src" / "notes.txt").read_text() == "keep me"
    assert main(["export", str(ckpt), str(mine), "--format", "state-dict"]) == 2  # nor a folder a file
    assert "is a folder" in capsys.readouterr().err and (mine / "src" / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]  # no temp folder left behind

    empty = tmp_path / "empty"
    empty.mkdir()
    _export(ckpt, empty)  # an empty folder is fine
    before = (empty / "model.safetensors").read_bytes()
    assert main(["export", str(ckpt), str(empty), "--ema"]) == 2
    assert "earlier impulsevit export; pass --overwrite" in capsys.readouterr().err
    assert (empty / "model.safetensors").read_bytes() == before
    _export(ckpt, empty, "--ema", "--overwrite")
    assert (empty / "model.safetensors").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "project"]


def test_a_truncated_checkpoint_fails_in_one_line_naming_it(trained, tmp_path, capsys):
    data = _last(trained).read_bytes()
    bad = tmp_path / "cut.ckpt"
    bad.write_bytes(data[: len(data) // 2])
    for fmt in ("folder", "state-dict"):
        assert main(["export", str(bad), str(tmp_path / "out"), "--format", fmt]) == 2  # no exception escapes
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(bad) in err and "cannot be read (truncated" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.ckpt"]


def test_export_errors_name_the_problem(trained, tmp_path, capsys):
    no_ema = tmp_path / "run"
    run_cli(*tiny(tmp_path, "run", "--model.ema_decay=null", "--trainer.max_epochs=1"))
    assert main(["export", str(_last(no_ema)), str(tmp_path / "x"), "--ema"]) == 2
    assert "no EMA weights" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.ckpt"), str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
    torch.save({"weights": torch.ones(2)}, tmp_path / "plain.pt")
    assert main(["export", str(tmp_path / "plain.pt"), str(tmp_path / "x")]) == 2
    assert "not a Lightning checkpoint" in capsys.readouterr().err
    assert main(["export", str(_last(trained)), str(tmp_path / "x"), "--push-to-hub", "no-slash"]) == 2
    assert "expected ORG/NAME" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_run_folder_stands_for_the_checkpoint_resume_auto_picks(trained, vit_run, tmp_path, capsys):
    """export (both formats), predict and fit --model.pretrained take a run folder where they take a checkpoint: its
    latest complete checkpoint (what --resume auto picks), said in one line by export; a run folder with no
    checkpoint is one line, exit 2, nothing written."""
    from impulsevit.training.checkpointing import latest_checkpoint, run_folder_checkpoint

    assert run_folder_checkpoint(trained) == latest_checkpoint(trained) is not None
    assert run_folder_checkpoint(_last(trained)) is None and run_folder_checkpoint(tmp_path) is None
    _export(trained, tmp_path / "from_run")
    assert f"{trained} is a run folder: exporting {latest_checkpoint(trained)}" in capsys.readouterr().out
    _export(_last(trained), tmp_path / "from_ckpt")
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("from_run", "from_ckpt"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert main(["export", str(trained), str(tmp_path / "sd.pth")]) == 0
    assert torch.load(tmp_path / "sd.pth", weights_only=True).keys() == a.keys()

    run_dir, root = vit_run[1], vit_run[3]
    by_run, by_ckpt = tmp_path / "run.csv", tmp_path / "ckpt.csv"
    assert main(["predict", str(run_dir), str(root / "val"), "--out", str(by_run)]) == 0
    assert main(["predict", str(latest_checkpoint(run_dir)), str(root / "val"), "--out", str(by_ckpt)]) == 0
    assert by_run.read_text() == by_ckpt.read_text()

    runs = tmp_path / "runs"
    run_cli(*tiny(runs, "ft", "--trainer.max_epochs=1", f"--model.pretrained={trained}"))
    record = json.loads((runs / "ft" / "run.json").read_text())["pretrained"]
    assert record["source"] == str(trained)
    assert record["sha256"] == hashlib.sha256(latest_checkpoint(trained).read_bytes()).hexdigest()

    empty = tmp_path / "stopped"
    (empty / "checkpoints").mkdir(parents=True)
    capsys.readouterr()
    assert main(["export", str(empty), str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a run folder with no complete checkpoint" in err[0], err
    assert not (tmp_path / "none").exists()


def test_run_record_survives_a_resume(tmp_path):
    """The ``RunRecord`` in a checkpoint: wall time summed over the resumed segments, first start kept, metrics of the
    latest validation; loadable with ``weights_only=True`` (plain types only)."""
    run_cli(*tiny(tmp_path, "r", "--trainer.max_epochs=1"))
    first = torch.load(_last(tmp_path / "r"), map_location="cpu", weights_only=True)["callbacks"]["RunRecord"]
    run_cli(*tiny(tmp_path, "r", "--trainer.max_epochs=2", "--resume=auto"))
    second = torch.load(_last(tmp_path / "r"), map_location="cpu", weights_only=True)["callbacks"]["RunRecord"]
    assert second["started"] == first["started"] and second["wall_seconds"] > first["wall_seconds"]
    assert second["metrics"]["val/acc1"] != first["metrics"]["val/acc1"] or \
        second["metrics"]["val/loss"] != first["metrics"]["val/loss"]
    assert second["class_names"] == ["blob_0", "blob_1", "blob_2", "blob_3"] and second["seed"] == 0
    assert second["data_config"]["input_size"] == (3, 32, 32) and second["versions"]["timm"] == timm.__version__


# ---------------------------------------------------------------------------------------------- state-dict format
def _timm_model(path, num_classes=4):
    return timm.create_model("vit_tiny_patch16_224", checkpoint_path=str(path), num_classes=num_classes,
                             **KWARGS).eval()


def test_state_dict_export_loads_in_timm_with_the_same_outputs(trained, tmp_path, capsys):
    ckpt = _last(trained)
    out = tmp_path / "vit.pth"
    assert main(["export", str(ckpt), str(out), "--format", "state-dict"]) == 0
    printed = capsys.readouterr().out
    assert "timm.create_model('vit_tiny_patch16_224', num_classes=4" in printed and "patch_size=4" in printed
    plain = torch.load(out, map_location="cpu", weights_only=True)
    assert "pos_embed" in plain and not any(k.startswith(("backbone.", "ema.")) for k in plain)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(_timm_model(out)(x), _module_logits(ckpt, x))
    with pytest.raises(RuntimeError):  # a timm model of another shape refuses the file (strict load)
        _timm_model(out, num_classes=7)
    ema = tmp_path / "ema.pth"
    assert main(["export", str(ckpt), str(ema), "--ema"]) == 0  # an OUT ending in .pth means --format state-dict
    assert ema.is_file()
    sd = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    exported = torch.load(ema, map_location="cpu", weights_only=True)
    assert all(torch.equal(exported[k], sd[f"ema.module.{k}"]) for k in exported)


def test_export_from_an_fsdp2_distributed_checkpoint_folder(tmp_path):
    cli = run_cli(*tiny(tmp_path, "fsdp", "--trainer.strategy=fsdp2", "--model.ema_decay=null",
                        "--trainer.max_epochs=1"))
    folder = _last(tmp_path / "fsdp")
    assert folder.is_dir() and (folder / "meta.pt").is_file()
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in cli.model.backbone.state_dict().items()}
    out = tmp_path / "fsdp.pth"
    assert main(["export", str(folder), str(out), "--format", "state-dict"]) == 0
    exported = torch.load(out, map_location="cpu", weights_only=True)
    assert exported.keys() == full.keys() and all(torch.equal(exported[k], full[k].cpu()) for k in full)
    _export(folder, tmp_path / "fsdp_folder")  # the folder format reads the same checkpoint (and its RunRecord)
    m = timm.create_model(f"local-dir:{tmp_path / 'fsdp_folder'}", pretrained=True)
    assert all(torch.equal(v, full[k].cpu()) for k, v in m.state_dict().items())
    assert timm.data.resolve_data_config({}, model=m)["input_size"] == (3, 32, 32)


# ---------------------------------------------------------------------------------------------- predict
def _csv_accuracy(path: Path) -> tuple[float, list[dict[str, str]]]:
    rows = list(csv.DictReader(path.open()))
    hits = [r["class_1"] == Path(r["path"]).parent.name for r in rows]
    return sum(hits) / len(hits), rows


def test_predict_on_a_folder_matches_test_accuracy(vit_run, tmp_path, capsys):
    cli, run_dir, recipe, root = vit_run
    ckpt = _last(run_dir)
    tested = run_cli("test", "--recipe", str(recipe), f"--runs_dir={run_dir.parent}", "--name=vit",
                     f"--resume={ckpt}")
    test_acc = float(tested.trainer.callback_metrics["test/acc1"])

    images = tmp_path / "images"
    shutil.copytree(root / "val", images)
    (images / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (images / CLASSES[0] / "empty.jpg").write_bytes(b"")
    out = tmp_path / "from_ckpt.csv"
    assert main(["predict", str(ckpt), str(images), "--out", str(out), "--batch-size", "7"]) == 0
    captured = capsys.readouterr()
    assert "skipped 2 unreadable image(s) of 66" in captured.err and "broken.png" in captured.err
    assert "empty.jpg" in captured.err and "Traceback" not in captured.err
    acc, rows = _csv_accuracy(out)
    assert len(rows) == 64 and acc == pytest.approx(test_acc, abs=1e-6)
    assert list(rows[0]) == ["path", "class_1", "prob_1", "class_2", "prob_2", "class_3", "prob_3",
                             "class_4", "prob_4"]
    assert all({r[f"class_{j}"] for j in range(1, 5)} == set(CLASSES) for r in rows)
    assert all(float(r["prob_1"]) >= float(r["prob_2"]) for r in rows)

    folder = tmp_path / "vit"
    _export(ckpt, folder)
    again = tmp_path / "from_folder.csv"
    assert main(["predict", str(folder), str(images), "--out", str(again)]) == 0
    assert again.read_text() == out.read_text()  # the exported folder predicts exactly as the checkpoint


def test_predict_bad_inputs_fail_in_one_line(vit_run, tmp_path, capsys):
    ckpt = _last(vit_run[1])
    assert main(["predict", str(ckpt), str(tmp_path / "nowhere")]) == 2
    assert "is not a folder of images" in capsys.readouterr().err
    (tmp_path / "none").mkdir()
    assert main(["predict", str(ckpt), str(tmp_path / "none")]) == 2
    assert "holds no image files" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "missing.ckpt"), str(vit_run[3] / "val")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.png").write_bytes(b"junk")
    assert main(["predict", str(ckpt), str(tmp_path / "bad"), "--out", str(tmp_path / "p.csv")]) == 1
    assert "none of the 1 images" in capsys.readouterr().err and not (tmp_path / "p.csv").exists()


def test_recipe_predict_stays_lightnings_subcommand(trained, capsys):
    """``impulsevit predict --recipe …`` still goes to LightningCLI (here: its refusal without a checkpoint)."""
    assert main(["predict", "--recipe", str(TINY), f"--runs_dir={trained.parent}", "--name=exp"]) == 2
    assert "give --resume auto" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the hub
def _push(ckpt: Path, out: Path, endpoint: str, home: Path) -> subprocess.CompletedProcess:
    """``impulsevit export CKPT OUT --push-to-hub my-lab/vit-test`` in a fresh process talking to ``endpoint``."""
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN="hf_test_token", HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.run([sys.executable, "-m", "impulsevit.cli", "export", str(ckpt), str(out), "--push-to-hub",
                           "my-lab/vit-test"], env=env, capture_output=True, text=True, timeout=300)


def test_push_to_hub_uploads_the_folder_through_timm(trained, tmp_path):
    """Everything up to and including the upload, against a local HTTP server standing in for the hub (the real hub
    cannot be reached from the tests): timm's ``push_to_hf_hub`` creates the repo and commits the same weights and
    config as the local folder and the model card; the committed files load in timm."""
    from _fake_hub import FakeHub

    with FakeHub() as hub:
        done = _push(_last(trained), tmp_path / "out", hub.url, tmp_path / "hf")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pushed to my-lab/vit-test" in done.stdout
    assert hub.created == [{"name": "vit-test", "organization": "my-lab", "visibility": "public"}]
    assert set(hub.files) == {"config.json", "model.safetensors", "README.md"}
    for name in ("config.json", "model.safetensors"):
        assert hub.files[name] == (tmp_path / "out" / name).read_bytes(), name
    card = hub.files["README.md"].decode()
    assert "# Model card for vit-test" in card and "init=impulse family=vit" in card
    (tmp_path / "pulled").mkdir()
    for name, data in hub.files.items():
        (tmp_path / "pulled" / name).write_bytes(data)
    m = timm.create_model(f"local-dir:{tmp_path / 'pulled'}", pretrained=True)
    assert m.num_classes == 4 and m.pretrained_cfg["label_names"] == ["blob_0", "blob_1", "blob_2", "blob_3"]


def test_push_unauthenticated_or_offline_fails_in_one_line(trained, tmp_path):
    import socket

    from _fake_hub import FakeHub

    with FakeHub(status=401) as hub:
        done = _push(_last(trained), tmp_path / "a", hub.url, tmp_path / "hf")
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0
    assert "push to my-lab/vit-test: not authenticated" in done.stderr and "HF_TOKEN" in done.stderr
    assert (tmp_path / "a" / "model.safetensors").is_file()  # the local folder is written first and stays

    with socket.socket() as s:  # a port nothing listens on: connection refused, as offline
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    done = _push(_last(trained), tmp_path / "b", closed, tmp_path / "hf")
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0
    assert f"cannot reach {closed}" in done.stderr
