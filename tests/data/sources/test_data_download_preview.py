"""Datasets from nothing and ``impulsevit data preview``, end to end on real files.

Download: a real HTTP server (``http.server`` on 127.0.0.1, in a thread) serves a small CIFAR-10 python tarball built
here in the release's format (python-2 style pickles with str keys); torchvision's ``CIFAR10`` class is pointed at it
by overriding its URL and checksum attributes in this test only (the MD5s are computed from the small files), so the
real torchvision download, MD5 check and extraction run. Preview: the real CLI parser and recipe, the FFCV backend
(real ``.beton``) and the torchvision backend on an ImageFolder of photos of several sizes.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets
from _image_files import cifar10_release_tarball
from PIL import Image

from impulsevit.cli.data_preview import main as preview_main
from impulsevit.data.sources import download as dl

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

N_TRAIN, N_TEST = 10, 5


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture(scope="module")
def cifar_server(tmp_path_factory):
    """A real HTTP server on 127.0.0.1 serving the small tarball; yields (url, members, test images, test labels)."""
    served = tmp_path_factory.mktemp("www")
    tarball, members, test_imgs, test_labels = cifar10_release_tarball(n_train=N_TRAIN, n_test=N_TEST)
    (served / "cifar-10-python.tar.gz").write_bytes(tarball)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
    yield url, _md5(tarball), members, test_imgs, test_labels
    server.shutdown()
    thread.join()


@pytest.fixture
def local_cifar10(cifar_server, monkeypatch):
    """torchvision's CIFAR10 pointed at the local server, with the small files' checksums (this test only)."""
    url, tar_md5, members, test_imgs, test_labels = cifar_server
    cls = torchvision.datasets.CIFAR10
    monkeypatch.setattr(cls, "url", url)
    monkeypatch.setattr(cls, "tgz_md5", tar_md5)
    monkeypatch.setattr(cls, "train_list", [[f"data_batch_{i}", _md5(members[f"data_batch_{i}"])] for i in range(1, 6)])
    monkeypatch.setattr(cls, "test_list", [["test_batch", _md5(members["test_batch"])]])
    monkeypatch.setattr(cls, "meta", {"filename": "batches.meta", "key": "label_names",
                                      "md5": _md5(members["batches.meta"])})
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return test_imgs, test_labels


def test_download_cli_fetches_cifar10_into_the_readers_layout(tmp_path, local_cifar10, capsys):
    test_imgs, test_labels = local_cifar10
    root = tmp_path / "cifar"
    assert dl.main(["cifar10", str(root), "--verify", "warn"]) == 0
    out = capsys.readouterr().out
    assert "train 10, test 5 images" in out and f"--data.init_args.root={root.resolve()}" in out
    from impulsevit.data.sources.registry import get_dataset

    with pytest.warns(UserWarning, match="expected 10000"):
        source = get_dataset("cifar10").load(root, "test", verify="warn")
    assert np.array_equal(np.stack([source.load(i) for i in range(N_TEST)]), test_imgs)
    assert source.labels.tolist() == test_labels.tolist() and source.classes[3] == "class3"
    # published counts are checked by default: 10 train images are not CIFAR-10
    assert dl.main(["cifar10", str(root)]) == 1
    assert "found 10 images, expected 50000" in capsys.readouterr().err


def test_download_of_a_corrupted_archive_fails_with_the_checksum(tmp_path, local_cifar10, monkeypatch, capsys):
    monkeypatch.setattr(torchvision.datasets.CIFAR10, "tgz_md5", "0" * 32)
    assert dl.main(["cifar10", str(tmp_path / "c"), "--verify", "off"]) == 1
    assert "RuntimeError" in capsys.readouterr().err


@pytest.mark.parametrize("name, needles", [
    ("imagenet", ("image-net.org", "ILSVRC2012_devkit_t12", "ILSVRC2012_validation_ground_truth.txt",
                  "LOC_val_solution.csv", "train/<wnid>/*.JPEG")),
    ("imagenet21k", ("winter21_whole", "fall11_whole", "13,153,500", "min(50, n // 2)")),
])
def test_imagenet_cannot_download_and_says_what_to_obtain(tmp_path, name, needles, capsys):
    assert dl.main([name, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, needle
    assert not any(tmp_path.iterdir())


def test_every_downloadable_dataset_has_a_torchvision_class():
    from impulsevit.data.sources.registry import TorchvisionDownload, downloadable, get_dataset

    for name in downloadable():
        fetch = get_dataset(name).download
        assert isinstance(fetch, TorchvisionDownload) and hasattr(torchvision.datasets, fetch.cls)
    assert set(downloadable()) == {"cifar10", "cifar100", "stl10", "flowers102", "pets", "food101", "fashion_mnist"}


def _preview(out: Path, split: str, num: int, *overrides: str) -> dict:
    assert preview_main(["preview", "--split", split, "--num", str(num), "--out", str(out), *overrides]) == 0
    assert (out / f"{split}.png").is_file()
    result = torch.load(out / f"{split}.pt", weights_only=False)
    assert result["images"].dtype == torch.float32 and result["labels"].dtype == torch.int64
    assert result["images"].min() >= 0 and result["images"].max() <= 1
    return result


@pytest.mark.slow
def test_recipe_with_download_true_previews_what_the_model_sees(tmp_path, local_cifar10):
    """vit_tiny_cifar10 (FFCV backend) from an empty folder: download: true fetches, prepare_data converts, and the
    val preview at 32 px with crop_pct 1 is the test split itself, in order; train previews carry the recipe's
    augmentation (RandAugment, erasing) and keep labels and sizes aligned with the source."""
    test_imgs, test_labels = local_cifar10
    root = tmp_path / "data" / "cifar10"
    common = ["--recipe", "vit_tiny_cifar10", f"--data.init_args.root={root}", "--data.init_args.download=true",
              "--data.init_args.verify=warn", "--data.init_args.image_size=32", "--data.init_args.num_workers=1",
              f"--data.init_args.cache_dir={tmp_path / 'ffcv'}", "--trainer.devices=1"]
    with pytest.warns(UserWarning):
        val = _preview(tmp_path / "out", "val", 4, *common, "--data.init_args.crop_pct=1.0")
    assert (root / "cifar-10-batches-py" / "test_batch").is_file()
    expected = torch.from_numpy(test_imgs[:4]).permute(0, 3, 1, 2).float() / 255
    assert torch.allclose(val["images"], expected, atol=1e-6)
    assert val["labels"].tolist() == test_labels[:4].tolist() and val["indices"].tolist() == [0, 1, 2, 3]
    assert val["paths"] == [None] * 4 and val["source_hw"].tolist() == val["stored_hw"].tolist() == [[32, 32]] * 4
    assert val["mean"] == (0.485, 0.456, 0.406)  # the recipe's ImageNet statistics, undone in `images`
    with pytest.warns(UserWarning):
        train = _preview(tmp_path / "out", "train", 6, *common)
    assert train["images"].shape == (6, 3, 32, 32)
    assert len(set(train["indices"].tolist())) == 6 and all(0 <= i < N_TRAIN for i in train["indices"].tolist())
    assert train["labels"].tolist() == [int(i) % 10 for i in train["indices"].tolist()]  # labels follow indices


@pytest.mark.parametrize("split", ["train", "val"])
def test_preview_synthetic_data_reports_the_generated_images(tmp_path, split):
    """tiny_synthetic has no source files: the in-memory samples are the source (their (h, w), labels following the
    reported indices into the split) and the grid is labelled with the datamodule's class names."""
    from impulsevit.cli.fit_datamodule import build_datamodule

    result = _preview(tmp_path / "out", split, 5, "--recipe", "tiny_synthetic")
    assert result["backend"] is None and result["paths"] == [None] * 5
    assert result["source_hw"].tolist() == result["stored_hw"].tolist() == [[32, 32]] * 5
    dm = build_datamodule(["--recipe", "tiny_synthetic"])
    dm.setup("fit")
    samples = dm.train_set if split == "train" else dm.val_set
    indices = result["indices"].tolist()
    assert len(set(indices)) == 5 and result["labels"].tolist() == [int(samples[i][1]) for i in indices]
    assert (indices == list(range(5))) == (split == "val")  # val in order, train in the epoch's shuffled order


def _photo(path: Path, h: int, w: int, seed: int) -> None:
    """A smooth photo-like image (gradients + blobs), saved as high-quality JPEG."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    chans = [np.sin(6 * xx * rng.uniform(0.5, 2) + rng.uniform(0, 6)) * np.cos(5 * yy * rng.uniform(0.5, 2))
             for _ in range(3)]
    arr = ((np.stack(chans, -1) + 1) * 127.5).clip(0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, quality=95)


@pytest.fixture
def photo_folder(tmp_path):
    sizes = [(300, 400), (500, 260), (256, 256), (180, 320), (640, 480), (333, 500)]
    for k, (h, w) in enumerate(sizes):
        for split in ("train", "val"):
            _photo(tmp_path / "photos" / split / ("b_cls" if k % 2 else "a_cls") / f"img{k}.jpg", h, w, k)
    return tmp_path / "photos", sizes


def test_preview_torchvision_backend_val_is_timms_eval_transform_in_folder_order(tmp_path, photo_folder):
    root, sizes = photo_folder
    val = _preview(tmp_path / "tv", "val", 6, "--recipe", "deit_tiny_in1k", "--data.init_args.dataset=imagefolder",
                   f"--data.init_args.root={root}", "--data.init_args.backend=torchvision",
                   "--data.init_args.num_workers=0", "--data.init_args.augment.repeated_aug=1")
    names = [Path(p).relative_to(root / "val").as_posix() for p in val["paths"]]
    assert names == sorted(names) and names[0].startswith("a_cls/")  # sorted classes, sorted files
    assert val["labels"].tolist() == [0, 0, 0, 1, 1, 1]
    from timm.data import create_transform

    tf = create_transform(224, is_training=False, interpolation="bicubic", crop_pct=0.875)
    for i, path in enumerate(val["paths"]):
        with Image.open(path) as im:
            ref = tf(im.convert("RGB"))
            assert val["source_hw"][i].tolist() == [im.height, im.width] == val["stored_hw"][i].tolist()
        std, mean = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1), torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        ref = ref * std + mean
        assert (val["images"][i] - ref).abs().max() < 1e-5


def test_preview_ffcv_backend_reports_stored_sizes(tmp_path, photo_folder):
    root, sizes = photo_folder
    val = _preview(tmp_path / "ff", "val", 6, "--recipe", "deit_tiny_in1k", "--data.init_args.dataset=imagefolder",
                   f"--data.init_args.root={root}", "--data.init_args.num_workers=1",
                   f"--data.init_args.cache_dir={tmp_path / 'ffcv'}",
                   "--data.init_args.augment.repeated_aug=1")
    assert val["backend"] == "ffcv" and val["images"].shape == (6, 3, 224, 224)
    for i, path in enumerate(val["paths"]):
        with Image.open(path) as im:
            assert val["source_hw"][i].tolist() == [im.height, im.width]
    from impulsevit.data.storage.convert import read_manifest

    beton = next((tmp_path / "ffcv").glob("imagefolder-val-*.beton"))
    from impulsevit.data.storage.convert import Preset

    preset = Preset(**read_manifest(beton)["preset"])
    resized = 0
    for (h, w), (sh, sw) in zip(val["source_hw"].tolist(), val["stored_hw"].tolist()):
        assert preset.stored_size(w, h) == (sw, sh), ((h, w), (sh, sw), preset)
        resized += (sh, sw) != (h, w)
    assert resized > 0  # the recipe's preset stores most of these photos smaller than their source
    # bad keys fail as in fit, naming the key
    with pytest.raises(SystemExit):
        preview_main(["preview", "--split", "val", "--recipe", "deit_tiny_in1k", "--data.init_args.imag_size=3"])


FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")


@pytest.mark.skipif(not FASHION.exists(), reason="Debian package dataset-fashion-mnist not installed")
@pytest.mark.parametrize("backend", ["ffcv", "torchvision"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_preview_quickstart_on_every_backend_and_split(tmp_path, backend, split):
    """The quickstart recipe on Debian's real Fashion-MNIST (200 / 100 image subsets): every backend × split writes
    its files and the labels follow the reported indices into the real split (val: in order; train: the epoch's
    shuffled order, which the torchvision backend's sampler yields as index keys)."""
    from impulsevit.data.sources.registry import get_dataset

    out = tmp_path / "out"
    result = _preview(out, split, 8, "--recipe", "quickstart", f"--data.init_args.backend={backend}",
                      "--data.init_args.train_subset=200", "--data.init_args.val_subset=100",
                      f"--data.init_args.num_workers={0 if backend == 'torchvision' else 1}",
                      f"--data.init_args.cache_dir={tmp_path / 'ffcv'}")
    assert result["backend"] == backend and result["images"].shape == (8, 3, 28, 28)
    info = get_dataset("fashion_mnist")
    source = info.load(None, info.train_split if split == "train" else info.val_split, verify="off")
    from impulsevit.data.storage.convert import subset_indices

    sub = subset_indices(len(source), 200 if split == "train" else 100)
    indices = result["indices"].numpy()
    assert len(set(indices.tolist())) == 8 and indices.max() < len(sub)
    assert result["labels"].tolist() == np.asarray(source.labels)[sub][indices].tolist()
    if split == "val":
        assert indices.tolist() == list(range(8))  # the split's order
    else:
        assert indices.tolist() != list(range(8))  # the epoch's shuffled order


# ------------------------------------------------------------------ Fashion-MNIST: the system copy, else the data home
def _idx_gz(array: np.ndarray) -> bytes:
    """``array`` (uint8, (N, H, W) or (N,)) as a gzipped idx file, the format Fashion-MNIST is published in."""
    import gzip
    import struct

    head = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    return gzip.compress(head + np.ascontiguousarray(array, dtype=np.uint8).tobytes(), mtime=0)


@pytest.fixture
def local_fashion_mnist(tmp_path, monkeypatch):
    """torchvision's FashionMNIST pointed at a real HTTP server on 127.0.0.1 that serves 12 train / 6 test images in
    the published idx.gz format (checksums of these files); Debian's system folder made absent for the registry;
    ``$IMPULSEVIT_DATA`` in ``tmp_path``. Yields (data home, test images, test labels)."""
    import dataclasses

    from impulsevit.data.sources import registry

    served = tmp_path / "www"
    served.mkdir()
    rng = np.random.default_rng(1)
    arrays = {"train": (rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), np.arange(12) % 10),
              "t10k": (rng.integers(0, 256, (6, 28, 28), dtype=np.uint8), np.arange(6)[::-1] % 10)}
    resources = []
    for prefix, (images, labels) in arrays.items():
        for kind, arr in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels.astype(np.uint8))):
            data = _idx_gz(arr)
            (served / f"{prefix}-{kind}.gz").write_bytes(data)
            resources.append((f"{prefix}-{kind}.gz", _md5(data)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "mirrors", [f"http://127.0.0.1:{server.server_address[1]}/"])
    monkeypatch.setattr(torchvision.datasets.FashionMNIST, "resources", resources)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    info = registry.get_dataset("fashion_mnist")
    absent = dataclasses.replace(info, default_root=str(tmp_path / "no-system-copy"))
    for key in [k for k, v in registry.DATASETS.items() if v is info]:
        monkeypatch.setitem(registry.DATASETS, key, absent)
    home = tmp_path / "data-home"
    monkeypatch.setenv("IMPULSEVIT_DATA", str(home))
    yield home, arrays["t10k"][0], arrays["t10k"][1]
    server.shutdown()
    thread.join()


def test_fashion_mnist_without_a_system_copy_downloads_into_the_data_home(local_fashion_mnist):
    """No root and no system copy: the datamodule's root is ``$IMPULSEVIT_DATA/fashion_mnist``; ``download: true``
    fetches the published files there (torchvision's download and checksum, from the local server) and the test split
    reads back as served. Without ``download`` the same settings stop in one line saying how to get the data."""
    from impulsevit.data import ImageDataModule
    from impulsevit.errors import ConfigError

    home, test_imgs, test_labels = local_fashion_mnist
    kw = {"dataset": "fashion_mnist", "backend": "torchvision", "image_size": 28, "num_workers": 0, "verify": "warn"}
    with pytest.raises(ConfigError, match=r"dataset 'fashion_mnist' is not at .*data-home/fashion_mnist .*"
                                          r"--data.init_args.download=true"):
        ImageDataModule(**kw)
    dm = ImageDataModule(**kw, download=True)
    assert dm.root == str(home / "fashion_mnist") and dm.hparams["root"] == dm.root
    with pytest.warns(UserWarning, match="expected 60000"):
        dm.prepare_data()
    assert (home / "fashion_mnist" / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte.gz").is_file()
    with pytest.warns(UserWarning, match="expected 10000"):
        source = dm.load_source("test")
    loaded = np.stack([source.load(i) for i in range(6)])  # (N, 28, 28, 3): grey repeated into RGB
    assert np.array_equal(loaded, np.repeat(test_imgs[..., None], 3, axis=-1))
    assert np.asarray(source.labels).tolist() == test_labels.tolist()
    dm.prepare_data()  # there now: nothing is fetched again (the markers are found)


@pytest.mark.skipif(not FASHION.exists(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_reads_the_system_copy_when_installed(tmp_path, monkeypatch):
    """With Debian's copy installed, no root means that folder, and ``download: true`` finds it there: nothing is
    written into the user's data home."""
    from impulsevit.data import ImageDataModule
    from impulsevit.data.sources.formats import FASHION_MNIST_SYSTEM_DIR

    monkeypatch.setenv("IMPULSEVIT_DATA", str(tmp_path / "home"))
    dm = ImageDataModule(dataset="fashion_mnist", backend="torchvision", image_size=28, num_workers=0, download=True,
                         train_subset=8, val_subset=8)
    assert dm.root == FASHION_MNIST_SYSTEM_DIR
    dm.prepare_data()
    assert len(dm.load_source("test")) == 8 and not (tmp_path / "home").exists()
