"""Shard sets written shuffled (``impulsevit convert --format litdata --shuffle``): the stored order is the seed's
permutation, recorded beside the labels, so chunks mix classes; the block order's one-line warning tells a class-ordered
set from a shuffled one; ``--chunk-bytes`` takes plain bytes and refuses a unit LitData would misread, in one line.

Data: a class-sorted in-memory source of 240 tiny images (10 classes × 24), ~20 images per chunk."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import pytest
from _image_files import make_tree

from impulsevit.data.loading.litdata_backend import ShardSource, warn_unmixed
from impulsevit.data.sources.image_source import ArraySource
from impulsevit.data.storage import convert_cli
from impulsevit.data.storage.presets import PRESETS
from impulsevit.data.storage.shards import LABELS_NAME, SOURCE_INDEX_NAME, write_order, write_shards

pytest.importorskip("litdata")
def _sorted_source() -> ArraySource:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 24)
    return ArraySource(rng.integers(0, 256, (240, 8, 8, 3), dtype=np.uint8), labels, [f"c{k}" for k in range(10)],
                       "sorted")


def _write(dst: Path, shuffle_seed: int | None) -> dict:
    return write_shards(_sorted_source(), str(dst), PRESETS["raw"], progress=False, log=lambda _: None,
                        chunk_bytes=4000, shuffle_seed=shuffle_seed)


def _shard_source(dst: Path, manifest: dict) -> ShardSource:
    labels = np.load(dst / LABELS_NAME, allow_pickle=False)
    return ShardSource(str(dst), manifest["classes"], labels, np.arange(len(labels)), None, "1GB", 5.0)


def _warned(source: ShardSource, where: Path) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_unmixed(source, block_size=24, batch_size=8, where=str(where))
    return [str(w.message) for w in caught]


def test_a_shuffled_set_stores_the_seeds_permutation_and_the_block_order_sees_it_mixed(tmp_path):
    source = _sorted_source()
    manifest = _write(tmp_path / "shuffled", shuffle_seed=3)
    order = np.load(tmp_path / "shuffled" / SOURCE_INDEX_NAME, allow_pickle=False)
    assert np.array_equal(order, write_order(np.arange(240), 3))
    assert not np.array_equal(order, np.arange(240)) and np.array_equal(np.sort(order), np.arange(240))
    assert manifest["request"]["shuffle_seed"] == 3
    shards = _shard_source(tmp_path / "shuffled", manifest)
    assert np.array_equal(shards.labels, source.labels[order])
    for k in (0, 97, 239):  # stored sample k is the source's image order[k], pixel for pixel
        assert np.array_equal(shards.load(k), source.load(int(order[k])))
    assert _warned(shards, tmp_path / "shuffled") == []

    kept = _write(tmp_path / "kept", shuffle_seed=None)
    assert "shuffle_seed" not in kept["request"] and not (tmp_path / "kept" / SOURCE_INDEX_NAME).exists()
    sorted_shards = _shard_source(tmp_path / "kept", kept)
    assert np.array_equal(sorted_shards.labels, source.labels)
    (line,) = _warned(sorted_shards, tmp_path / "kept")
    assert str(tmp_path / "kept") in line and "--shuffle" in line and "\n" not in line


def test_a_conversion_into_small_chunks_prints_no_litdata_chunk_size_warnings(tmp_path):
    """LitData warns "An item was larger than the target chunk size" for every chunk that ends over 10 % past the
    target (no item being larger): the converter keeps that off the user's terminal, and the chunks are as written."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manifest = _write(tmp_path / "set", shuffle_seed=None)
    assert [str(w.message) for w in caught if "chunk size" in str(w.message)] == []
    shards = _shard_source(tmp_path / "set", manifest)
    assert len(shards.chunk_table()) > 10 and np.array_equal(shards.load(5), _sorted_source().load(5))


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = convert_cli.main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code)
    return code, err.getvalue()


def test_convert_shuffle_is_one_request_its_rerun_skips_and_other_formats_refuse_it(tmp_path):
    make_tree(tmp_path / "folder", per_class=4, size=(12, 12))
    dst = tmp_path / "shards"
    common = (str(tmp_path / "folder"), str(dst), "--format", "litdata", "--split", "train", "--no-progress")
    assert _cli(*common, "--shuffle") == (0, "")
    first = (dst / "train" / SOURCE_INDEX_NAME).read_bytes()
    assert _cli(*common, "--shuffle") == (0, "")  # the same request: up to date, not "another conversion"
    assert (dst / "train" / SOURCE_INDEX_NAME).read_bytes() == first
    code, err = _cli(*common)  # the source's order is another request
    assert code == 2 and "shuffle_seed" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    code, err = _cli(str(tmp_path / "folder"), str(tmp_path / "b"), "--split", "train", "--shuffle", "--no-progress")
    assert code == 2 and "--format litdata only" in err and not (tmp_path / "b").exists()


def test_chunk_bytes_takes_plain_bytes_and_refuses_a_unit_litdata_would_misread(tmp_path):
    parse = convert_cli.build_parser().parse_args
    assert parse(["src", "dst", "--chunk-bytes", "600000"]).chunk_bytes == 600000
    assert parse(["src", "dst", "--chunk-bytes", "1.5MB"]).chunk_bytes == 1_500_000
    assert parse(["src", "dst"]).chunk_bytes == 64_000_000
    for bad in ("64MiB", "0", "lots"):
        code, err = _cli("src", str(tmp_path / "out"), "--format", "litdata", "--chunk-bytes", bad)
        assert code == 2 and "--chunk-bytes must be a positive size in bytes" in err and repr(bad) in err
        assert not (tmp_path / "out").exists()


def test_the_default_order_is_block_on_a_shuffled_set_and_global_on_one_in_source_order(tmp_path):
    """``data.order`` unset (``auto``): the litdata backend reads the training set's manifest when the datamodule is
    built, ``block`` where it was written ``--shuffle``, else ``global``; an explicit order and repeated augmentation
    keep theirs, and the other backends are ``global``. The training loader and its checkpointed state follow."""
    from impulsevit.data import ImageDataModule
    from impulsevit.data.loading.position import LoaderPosition

    make_tree(tmp_path / "folder", per_class=12, size=(12, 12))
    for name, extra in (("shuffled", ["--shuffle"]), ("kept", [])):
        for split in ("train", "val"):
            assert _cli(str(tmp_path / "folder"), str(tmp_path / name), "--format", "litdata", "--split", split,
                        "--chunk-bytes", "2000", "--no-progress", *extra) == (0, "")
    kw = dict(dataset="imagefolder", image_size=8, batch_size=4, num_workers=0, storage={"block_size": 8})

    def order(root: Path | str, backend: str = "litdata", **extra: object) -> str:
        return ImageDataModule(backend=backend, root=str(root), **{**kw, **extra}).order

    assert order(tmp_path / "shuffled") == "block" and order(tmp_path / "kept") == "global"
    assert order(tmp_path / "shuffled", order="auto") == "block"
    assert order(tmp_path / "shuffled", order="global") == "global"
    assert order(tmp_path / "kept", order="block") == "block"
    assert order(tmp_path / "shuffled", augment={"repeated_aug": 2}) == "global"
    assert order(tmp_path / "folder", backend="torchvision") == "global"
    dm = ImageDataModule(backend="litdata", root=str(tmp_path / "shuffled"), **kw)
    loader = dm.loader(True, LoaderPosition(epoch=0, batches_done=0, rank=0, world_size=1))
    assert sum(len(images) for images, _ in loader) > 0
    assert loader.state_dict()["order"] == "block"
