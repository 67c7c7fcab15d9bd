"""The torchvision backend names the bad inputs it finds while listing a split (an empty class folder: the model
gets an output for a class with no image) in the words of the conversions (``image_source.bad_input_report``), through
the real ``impulsevit fit``; the FFCV conversion of the same tree prints the same lines."""

from __future__ import annotations

import json

import pytest
from _image_files import save_jpeg
from faults.harness import TINY, run

from impulsevit.data.sources.image_source import bad_input_report, image_folder_source

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


def test_an_empty_class_folder_is_named_by_every_backend(tmp_path):
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        for c, name in enumerate(("cat", "dog")):
            for j in range(4):
                save_jpeg(tree / split / name / f"{j}.jpg", h=32, w=32, seed=c * 100 + j)
        (tree / split / "bird").mkdir()  # a class with no image
    problems = image_folder_source(tree / "train").problems
    assert [(p.kind, p.path) for p in problems] == [("empty-class", str(tree / "train" / "bird"))]

    data = {"class_path": "impulsevit.data.ImageDataModule", "init_args": {
        "dataset": "imagefolder", "root": str(tree), "backend": "torchvision", "image_size": 32, "batch_size": 4,
        "num_workers": 0}}
    res = run("fit", "--recipe", TINY, f"--runs_dir={tmp_path / 'runs'}", "--name=r", "--trainer.max_steps=1",
              "--trainer.num_sanity_val_steps=0", "--trainer.limit_val_batches=1", f"--data={json.dumps(data)}",
              cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    for split in ("train", "val"):
        report = bad_input_report(image_folder_source(tree / split).problems, f"dataset 'imagefolder', split '{split}'")
        assert "\n".join(report) in res.err, (report, res.err[-3000:])
    assert f"empty-class: {tree / 'train' / 'bird'} (class folder holds no image files)" in res.err

    out = tmp_path / "betons"
    res = run("convert", tree, out, "--split", "train", "--no-progress", "--workers", "1", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert "\n".join(bad_input_report(problems, str(out / "train.beton"))) in res.out, res.out[-3000:]
