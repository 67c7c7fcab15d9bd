"""`impulsevit convert`: real .beton files from ImageFolder trees with bad inputs, registry datasets and presets;
atomic output, manifest contents, reruns and interrupted runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ffcv")

from _image_files import (  # noqa: E402
    make_cifar,  # noqa: E402
    make_tree,
    save_jpeg,
)

from impulsevit.data.storage.convert import PRESETS, manifest_path  # noqa: E402
from impulsevit.data.storage.convert_cli import main  # noqa: E402

pytestmark = [pytest.mark.ffcv, pytest.mark.slow]


def read_beton(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, heights, widths) of every sample, in file order, from the file's metadata table (FFCV's Reader)."""
    from ffcv.reader import Reader

    r = Reader(str(path))
    names = list(r.handlers)
    image, label = r.metadata[f"f{names.index('image')}"], r.metadata[f"f{names.index('label')}"]
    return label.copy(), image["height"].copy(), image["width"].copy()


def test_image_folder_with_bad_files_is_reported_and_skipped(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src)
    assert main([str(src), str(out), "--workers", "1", "--no-progress"]) == 0
    log = capsys.readouterr().out
    for name in ("truncated.jpg", "readme.txt", "fake.jpg", "dangling.jpg", "empty"):
        assert name in log, name
    assert "expected size ~" in log
    manifest = json.loads(manifest_path(out / "train.beton").read_text())
    kinds = sorted((p["kind"], Path(p["path"]).name) for p in manifest["skipped"])
    assert kinds == [("corrupt", "truncated.jpg"), ("empty-class", "empty"), ("not-an-image", "fake.jpg"),
                     ("not-an-image", "readme.txt"), ("unreadable", "dangling.jpg")]
    assert manifest["class_counts"] == {"cat": 3, "dog": 3, "empty": 0}
    assert manifest["num_samples"] == 6 and manifest["preset"]["name"] == "short256"
    assert len(manifest["source_checksum"]) == 64
    labels, heights, widths = read_beton(out / "train.beton")
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert heights.tolist() == [40] * 6 and widths.tolist() == [48] * 6
    assert manifest["bytes"] == (out / "train.beton").stat().st_size
    assert sorted(p.name for p in out.iterdir()) == ["train.beton", "train.manifest.json", "val.beton",
                                                     "val.manifest.json"]


def test_on_error_fail_writes_nothing(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src)
    assert main([str(src), str(out), "--split", "train", "--on-error", "fail", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "5 bad input(s)" in err and "--on-error skip" in err
    assert not out.exists() or list(out.iterdir()) == []


def test_rerun_skips_up_to_date_and_rebuilds_on_change(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src)
    args = [str(src), str(out), "--no-progress", "--workers", "1"]
    assert main(args) == 0
    first = manifest_path(out / "val.beton").read_text()
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count("up to date") == 2
    assert manifest_path(out / "val.beton").read_text() == first
    save_jpeg(src / "val" / "cat" / "new.jpg", seed=9)
    assert main(args) == 0
    log = capsys.readouterr().out
    assert log.count("up to date") == 1
    assert json.loads(manifest_path(out / "val.beton").read_text())["num_samples"] == 7


def test_interrupted_write_leaves_nothing_and_rerun_cleans_stale_temp(tmp_path, monkeypatch, capsys):
    from ffcv.writer import DatasetWriter

    src, out = tmp_path / "src", tmp_path / "out"
    make_tree(src)

    def interrupted(self, allocations):  # noqa: ANN001 - called after the samples are written
        raise KeyboardInterrupt

    monkeypatch.setattr(DatasetWriter, "finalize", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main([str(src), str(out), "--split", "val", "--no-progress", "--workers", "1"])
    assert list(out.iterdir()) == []
    monkeypatch.undo()
    # a temp file from a process that died (killed before its cleanup ran)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    stale = out / f"val.beton.tmp-{socket.gethostname()}-{int(dead.stdout)}"
    stale.write_bytes(b"partial")
    assert main([str(src), str(out), "--split", "val", "--no-progress", "--workers", "1"]) == 0
    assert "left by an interrupted conversion" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["val.beton", "val.manifest.json"]


def test_registry_dataset_with_root_and_presets(tmp_path, capsys):
    make_cifar(tmp_path / "cifar", 10, n_train=20, n_test=10)
    out = tmp_path / "c10.beton"
    assert main(["cifar10", str(out), "--root", str(tmp_path / "cifar"), "--no-progress", "--workers", "1"]) == 0
    assert (tmp_path / "c10_train.beton").exists() and (tmp_path / "c10_test.beton").exists()
    m = json.loads(manifest_path(tmp_path / "c10_train.beton").read_text())
    assert m["preset"]["write_mode"] == "raw" and m["num_samples"] == 20 and m["num_classes"] == 10
    labels, h, w = read_beton(tmp_path / "c10_test.beton")
    assert labels.tolist() == [i % 10 for i in range(10)] and set(h) == {32} and set(w) == {32}
    # detection from the folder itself and a JPEG preset with an explicit cap
    assert main([str(tmp_path / "cifar"), str(tmp_path / "cap.beton"), "--split", "train", "--preset", "res256",
                 "--max-resolution", "16", "--jpeg-proportion", "1.0", "--no-progress"]) == 0
    _, h, w = read_beton(tmp_path / "cap.beton")
    assert set(h) == {16} and set(w) == {16}
    m = json.loads(manifest_path(tmp_path / "cap.beton").read_text())
    assert m["preset"] == {**vars(PRESETS["res256"]), "name": "res256+custom", "max_resolution": 16,
                           "jpeg_proportion": 1.0}


def test_large_images_are_capped_by_preset(tmp_path):
    for j in range(3):
        save_jpeg(tmp_path / "src" / "x" / f"{j}.jpg", h=300, w=520, seed=j)
    assert main([str(tmp_path / "src"), str(tmp_path / "o.beton"), "--preset", "res256", "--no-progress"]) == 0
    _, h, w = read_beton(tmp_path / "o.beton")
    assert set(w) == {256} and set(h) == {147}  # longer side capped, aspect kept (int(300 * 256 / 520))


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), str(tmp_path / "o")]) == 2
    assert "neither an existing folder nor a registry dataset" in capsys.readouterr().err
    assert main(["cifar10", str(tmp_path / "o"), "--root", str(tmp_path)]) == 2
    assert "data_batch_1" in capsys.readouterr().err


def test_small_images_stored_raw_and_conversion_is_deterministic(tmp_path):
    """A JPEG-mixing preset stores an all-small split raw (no lossy 32 px images), and a large-image split converted
    twice (1 and 2 writer processes) gives byte-identical files: the JPEG/raw choice depends on the sample index."""
    pytest.importorskip("ffcv")
    from PIL import Image

    from impulsevit.data.sources.image_source import image_folder_source
    from impulsevit.data.storage.convert import PRESETS, convert_split

    rng = np.random.default_rng(0)
    for name, side in (("small", 32), ("large", 120)):
        for c in range(2):
            d = tmp_path / name / f"c{c}"
            d.mkdir(parents=True)
            for k in range(6):
                Image.fromarray(rng.integers(0, 256, (side, side + 8, 3), dtype=np.uint8)).save(d / f"{k}.png")
    small = convert_split(image_folder_source(tmp_path / "small"), tmp_path / "small.beton", PRESETS["short256"])
    assert small["preset"]["write_mode"] == "proportion"  # the manifest keeps the requested preset (cache key)
    from ffcv.reader import Reader

    modes = Reader(str(tmp_path / "small.beton")).metadata["f0"]["mode"]
    assert set(modes.tolist()) == {1}  # 1 = raw in FFCV's IMAGE_MODES (0 = jpg)
    a = tmp_path / "a.beton"
    b = tmp_path / "b.beton"
    np.random.seed(1)  # the writer processes inherit the parent's global numpy state: make it differ
    convert_split(image_folder_source(tmp_path / "large"), a, PRESETS["short256"], workers=1)
    np.random.seed(2)
    convert_split(image_folder_source(tmp_path / "large"), b, PRESETS["short256"], workers=2)
    ma = Reader(str(a)).metadata["f0"]["mode"]
    assert 0 < int(ma.sum()) < len(ma)  # some JPEG, some raw
    assert np.array_equal(ma, Reader(str(b)).metadata["f0"]["mode"])


def test_output_that_is_a_directory_is_refused_and_kept(tmp_path, capsys):
    """`convert SRC X.beton` where X.beton is a folder: one line naming it, exit 2, the folder and its files intact;
    the library call (no CLI check) is refused at the commit, after the work, and also keeps the folder."""
    from impulsevit.data.sources.registry import get_dataset
    from impulsevit.data.storage.convert import convert_split
    from impulsevit.io import WriteError

    src, out = tmp_path / "src", tmp_path / "X.beton"
    make_tree(src, per_class=2)
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "keep.txt").write_text("precious")
    assert main([str(src), str(out), "--split", "train", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "directory" in err[0], err
    assert (out / "sub" / "keep.txt").read_text() == "precious"
    source = get_dataset("imagefolder").load(src, "train")
    with pytest.raises(WriteError, match=f"cannot write {out}: it is an existing directory"):
        convert_split(source, out, PRESETS["raw"], workers=1, progress=False)
    assert (out / "sub" / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X.beton", "src"]  # no temp file left either
