"""ImageDataModule on real .beton files: batches of both backends agree (shapes, dtypes, labels, normalisation);
per-epoch seeding; repeated augmentation; a converted ImageFolder with corrupt files trains under Lightning; and
2-process gloo DDP shards the FFCV loader (distributed=True) with Lightning's default use_distributed_sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ffcv")

from _image_files import save_jpeg  # noqa: E402

from impulsevit.data.loading.datamodule import ImageDataModule  # noqa: E402
from impulsevit.data.loading.ffcv_loader import build_ffcv_loader  # noqa: E402
from impulsevit.data.sources.image_source import ArraySource  # noqa: E402
from impulsevit.data.storage.convert import PRESETS, convert_split  # noqa: E402

pytestmark = [pytest.mark.ffcv, pytest.mark.slow]
FASHION = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
needs_fashion = pytest.mark.skipif(not FASHION.exists(), reason="Debian package dataset-fashion-mnist not installed")


def index_beton(path: Path, n: int = 64, size: int = 12) -> Path:
    """A .beton whose label is the sample index (so the order a loader visits is observable)."""
    imgs = np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    src = ArraySource(imgs, np.arange(n), [str(i) for i in range(n)], "index")
    convert_split(src, path, PRESETS["raw"], workers=1, progress=False, log=lambda _: None)
    return path


@pytest.fixture(scope="module")
def fashion_dms(tmp_path_factory):
    cache = tmp_path_factory.mktemp("ffcv-cache")
    kw = dict(image_size=32, batch_size=50, num_workers=1, train_subset=300, val_subset=200, cache_dir=str(cache),
              seed=0)
    ffcv_dm = ImageDataModule("fashion_mnist", backend="ffcv", **kw)
    ffcv_dm.prepare_data()
    ffcv_dm.setup("fit")
    tv_dm = ImageDataModule("fashion_mnist", backend="torchvision", **{**kw, "num_workers": 0})
    tv_dm.setup("fit")
    return ffcv_dm, tv_dm


def _epoch(loader) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    xs, ys = zip(*[(x.clone(), y.clone()) for x, y in loader])
    return torch.cat(xs), torch.cat(ys)


@needs_fashion
def test_both_backends_agree_on_shapes_dtypes_labels_and_normalisation(fashion_dms):
    ffcv_dm, tv_dm = fashion_dms
    assert ffcv_dm.num_classes == tv_dm.num_classes == 10
    beton = ffcv_dm.data_backend.beton_path("train")
    assert beton.is_file() and json.loads(beton.with_name(beton.stem + ".manifest.json").read_text())[
        "num_samples"] == 300
    xf, yf = _epoch(ffcv_dm.val_dataloader())
    xt, yt = _epoch(tv_dm.val_dataloader())
    assert xf.shape == xt.shape == (200, 3, 32, 32) and xf.dtype == xt.dtype == torch.uint8
    assert yf.dtype == yt.dtype == torch.int64
    assert torch.equal(yf, yt)  # same subset, same (file) order
    nf = ffcv_dm.on_after_batch_transfer((xf, yf), 0)[0]
    nt = tv_dm.on_after_batch_transfer((xt, yt), 0)[0]
    assert nf.dtype == nt.dtype == torch.float32
    for a, b in ((nf.mean((0, 2, 3)), nt.mean((0, 2, 3))), (nf.std((0, 2, 3)), nt.std((0, 2, 3)))):
        assert torch.allclose(a, b, atol=0.05), (a, b)
    assert abs(nf.mean().item()) < 0.3 and 0.7 < nf.std().item() < 1.3  # Fashion-MNIST statistics applied
    assert torch.equal(nf[:, 0], nf[:, 2])  # grayscale replicated
    (xa, ya), (xb, yb) = next(iter(ffcv_dm.train_dataloader())), next(iter(tv_dm.train_dataloader()))
    assert xa.shape == xb.shape == (50, 3, 32, 32) and xa.dtype == xb.dtype == torch.uint8
    assert ya.dtype == yb.dtype == torch.int64 and set(ya.tolist()) <= set(range(10))
    out, labels = ffcv_dm.batch_augment(xa, ya)
    assert out.dtype == torch.float32 and torch.equal(labels, ya)


@needs_fashion
def test_train_order_is_seeded_per_epoch(fashion_dms):
    ffcv_dm, _ = fashion_dms
    loader = ffcv_dm.train_dataloader()
    assert len(loader) == 6  # 300 // 50, drop_last
    loader.sampler.set_epoch(3)
    y3 = _epoch(loader)[1]
    loader.sampler.set_epoch(3)
    assert torch.equal(_epoch(loader)[1], y3)
    loader.sampler.set_epoch(4)
    assert not torch.equal(_epoch(loader)[1], y3)


def test_repeated_augmentation_order_in_ffcv(tmp_path):
    path = index_beton(tmp_path / "idx.beton")
    loader = build_ffcv_loader(path, train=True, image_size=8, batch_size=12, num_workers=1, repeated_aug=3, seed=1)
    labels = _epoch(loader)[1].tolist()
    assert len(labels) == 60  # 64 samples -> 64 kept (below 256), 5 full batches of 12
    triples = [labels[i:i + 3] for i in range(0, 60, 3)]
    assert all(t[0] == t[1] == t[2] for t in triples)
    assert len({t[0] for t in triples}) == 20


def _make_corrupt_tree(root: Path, per_class: int = 24) -> None:
    colors = {"red": (200, 40, 40), "blue": (40, 40, 200)}
    for split, n in (("train", per_class), ("val", per_class // 2)):
        for name, col in colors.items():
            for j in range(n):
                save_jpeg(root / split / name / f"{j}.jpg", h=36, w=44, color=col)
    good = (root / "train" / "red" / "0.jpg").read_bytes()
    (root / "train" / "red" / "cut.jpg").write_bytes(good[: len(good) // 3])
    (root / "train" / "blue" / "junk.jpg").write_bytes(os.urandom(300))


LIGHTNING_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import lightning as L
    import torch
    from impulsevit.data.loading.datamodule import ImageDataModule

    class Tiny(L.LightningModule):
        def __init__(self, num_classes):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
                                           torch.nn.Linear(48, num_classes))
            self.seen, self.correct, self.total = [], 0, 0
        def training_step(self, batch, _):
            x, y = batch
            assert x.dtype == torch.float32 and x.shape[1:] == (3, 16, 16) and y.dtype == torch.int64, x.dtype
            self.seen.append((self.current_epoch, y.tolist()))
            return torch.nn.functional.cross_entropy(self.net(x), y)
        def on_validation_epoch_start(self):  # accuracy of the last validation run only (not the sanity check)
            self.correct = self.total = 0
        def validation_step(self, batch, _):
            x, y = batch
            self.correct += int((self.net(x).argmax(1) == y).sum()); self.total += len(y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)
        def on_train_end(self):  # inside the DDP process group: the plain (RANDOM, distributed=True) order too
            if self.trainer.world_size > 1:
                from impulsevit.data.loading.ffcv_loader import build_ffcv_loader
                loader = build_ffcv_loader(sys.argv[3], train=True, image_size=8, batch_size=4, num_workers=1)
                self.plain = [(epoch, [y.tolist() for _, y in loader]) for epoch in (0, 1)]

    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    if mode == "train":
        dm = ImageDataModule("imagefolder", backend="ffcv", image_size=16, batch_size=8, num_workers=1,
                             storage={"train_beton": sys.argv[3], "val_beton": sys.argv[4]},
                             augment={"scale": (0.5, 1.0)})
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
    else:
        dm = ImageDataModule("imagefolder", backend="ffcv", image_size=16, batch_size=4, num_workers=1,
                             storage={"train_beton": sys.argv[3], "val_beton": sys.argv[3]},
                             augment={"repeated_aug": 3})
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, limit_val_batches=0)
    model = Tiny(dm.num_classes)
    trainer.fit(model, dm)
    with open(f"{out}.{trainer.global_rank}.json", "w") as fh:
        json.dump({"seen": model.seen, "acc": model.correct / max(1, model.total),
                   "plain": [(e, sum(b, [])) for e, b in getattr(model, "plain", [])]}, fh)
""")


def _run(tmp_path: Path, *args: str) -> list[dict]:
    script = tmp_path / "run.py"
    script.write_text(LIGHTNING_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob(f"{Path(args[1]).name}.*.json"))]


@pytest.mark.slow
def test_converted_folder_with_corrupt_files_trains(tmp_path):
    from impulsevit.data.storage.convert_cli import main

    _make_corrupt_tree(tmp_path / "src")
    assert main([str(tmp_path / "src"), str(tmp_path / "out"), "--workers", "1", "--no-progress"]) == 0
    skipped = json.loads((tmp_path / "out" / "train.manifest.json").read_text())["skipped"]
    assert sorted(Path(p["path"]).name for p in skipped) == ["cut.jpg", "junk.jpg"]
    (res,) = _run(tmp_path, "train", str(tmp_path / "res"), str(tmp_path / "out" / "train.beton"),
                  str(tmp_path / "out" / "val.beton"))
    assert res["acc"] > 0.9  # red vs blue is learnable: the converted data reaches the model intact


@pytest.mark.slow
def test_ddp_shards_ffcv_loader(tmp_path):
    """2 gloo ranks under Lightning DDP (use_distributed_sampler left at its default True): the repeated-augmentation
    train loader and a plain RANDOM distributed loader each split an epoch between the ranks, and epochs differ."""
    path = index_beton(tmp_path / "idx.beton", n=40)
    ranks = _run(tmp_path, "ddp", str(tmp_path / "seen"), str(path))
    assert len(ranks) == 2
    for epoch in (0, 1):
        ra = [[y for e, ys in r["seen"] if e == epoch for y in ys] for r in ranks]
        assert len(ra[0]) == len(ra[1]) == 20  # 40 samples / 2 ranks, batches of 4
        # the first 40 of the tripled order, dealt round-robin: 13 images x 3 copies + 1, copies on both ranks
        counts = np.bincount(ra[0] + ra[1], minlength=40)
        assert sorted(counts[counts > 0].tolist()) == [1] + [3] * 13
        assert set(ra[0]) & set(ra[1])
        plain = [dict(r["plain"])[epoch] for r in ranks]
        assert len(plain[0]) == len(plain[1]) == 20
        assert set(plain[0]).isdisjoint(plain[1]) and set(plain[0]) | set(plain[1]) == set(range(40))
    for key in ("seen", "plain"):
        rows = ranks[0][key]
        e0 = [y for e, ys in rows if e == 0 for y in ys]
        e1 = [y for e, ys in rows if e == 1 for y in ys]
        assert e0 != e1, key  # a new order every epoch


def test_bad_arguments_are_clear(tmp_path):
    with pytest.raises(ValueError, match="both data.storage.train_beton and data.storage.val_beton"):
        ImageDataModule("imagefolder", storage={"train_beton": str(tmp_path / "a.beton")})
    with pytest.raises(ValueError, match="needs root"):
        ImageDataModule("imagefolder")
    with pytest.raises(ValueError, match="backend must be"):
        ImageDataModule("digits", backend="dali")
    dm = ImageDataModule("digits", backend="ffcv", cache_dir=str(tmp_path), image_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(FileNotFoundError, match="prepare_data"):
            dm.setup("fit")


def test_transfer_skips_tensors_already_on_the_device():
    """On GPU runs the FFCV pipeline ends in ToDevice, so batches arrive on the device: the datamodule passes them
    through as they are (no copy); a batch elsewhere is still moved."""
    dm = ImageDataModule("digits", backend="torchvision", image_size=8, num_workers=0)
    x, y = torch.zeros(2, 3, 8, 8, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64)
    out = dm.transfer_batch_to_device((x, y), torch.device("cpu"), 0)
    assert out[0] is x and out[1] is y
    moved = dm.transfer_batch_to_device((x.to(torch.float64), y), torch.device("meta"), 0)
    assert moved[0].device.type == "meta" and moved[1].device.type == "meta"


def test_a_cached_beton_of_a_folder_whose_images_changed_is_converted_again_not_trusted(tmp_path):
    """The cache name of a folder's ``.beton`` hashes the root path, not its images: after the user replaces the
    images, the old file's manifest must not answer the checks made before conversion (``impulsevit fit``'s batch
    check, ``impulsevit submit``'s conversion job). Through the real CLI: 6 images, then 14 in the same folder with
    a batch of 8 (the stale count would refuse it); the file is converted again and training reads the 14."""
    from faults import harness

    from impulsevit.data.loading.ffcv_backend import beton_path
    from impulsevit.data.storage.manifest import read_manifest

    root, cache = tmp_path / "my_folder", tmp_path / "cache"
    for c in ("a", "b"):
        for j in range(3):
            save_jpeg(root / "train" / c / f"{j}.jpg", seed=j + 10 * len(c))
        save_jpeg(root / "val" / c / "0.jpg", seed=99)

    def fit(batch: int, name: str) -> harness.Result:
        return harness.run("fit", "--recipe", "cpu_fmnist_vit", "--data.init_args.dataset=imagefolder",
                           f"--data.init_args.root={root}", "--data.init_args.backend=ffcv",
                           f"--data.init_args.cache_dir={cache}", f"--data.init_args.batch_size={batch}",
                           "--data.init_args.num_workers=1", "--trainer.max_epochs=1",
                           f"--runs_dir={tmp_path / 'runs'}", f"--name={name}", cwd=tmp_path)

    first = fit(4, "six")
    assert first.rc == 0, first.err[-3000:]
    dm = ImageDataModule("imagefolder", root=str(root), backend="ffcv", batch_size=8, cache_dir=str(cache),
                         image_size=28, train_subset=4000, val_subset=2000)
    assert dm.train_samples() == 6 and dm.splits_to_convert() == []
    for c in ("a", "b"):
        for j in range(3, 7):
            save_jpeg(root / "train" / c / f"{j}.jpg", seed=j + 10 * len(c))
    assert dm.train_samples() == 14 and dm.splits_to_convert() == ["train"]
    # `impulsevit submit`'s conversion job, planned from the same check: the train split again, not nothing
    from impulsevit.cli.convert_job import conversion_commands
    from impulsevit.cluster.sbatch import FitJob

    job = FitJob(recipe="cpu_fmnist_vit", run_name="sub", runs_dir=tmp_path / "runs", workdir=tmp_path,
                 fit_overrides=("--data.init_args.dataset=imagefolder", f"--data.init_args.root={root}",
                                "--data.init_args.backend=ffcv", f"--data.init_args.cache_dir={cache}"),
                 launcher="impulsevit", data_workers=1)
    planned = conversion_commands(job)
    assert len(planned) == 1 and "train" in planned[0], planned
    second = fit(8, "fourteen")
    assert second.rc == 0, second.err[-3000:]
    assert read_manifest(beton_path(dm.spec, "train"))["num_samples"] == 14
    assert json.loads((tmp_path / "runs" / "fourteen" / "run.json").read_text())["total_steps"] == 1  # 14 // 8
