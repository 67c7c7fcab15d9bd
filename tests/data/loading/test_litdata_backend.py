"""The litdata backend against a real object store (moto's S3 server on 127.0.0.1, ``tests/_s3.py``) and local
folders: ``impulsevit convert --format litdata`` uploads, the loaders give the torchvision backend's batches byte for
byte (train and eval, per rank), mismatching shard sets are refused before work, and every store failure is one line.

Data: 64 training / 32 validation Fashion-MNIST images (28 px, ``raw`` preset), batches of 8."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from _cli_helpers import subprocess_env
from _s3 import BUCKET, free_port, loopback_s3

from impulsevit.data import ImageDataModule
from impulsevit.data.loading.position import LoaderPosition
from impulsevit.data.storage import convert_cli
from impulsevit.data.storage.convert import subset_indices
from impulsevit.data.storage.presets import PRESETS
from impulsevit.data.storage.shards import MANIFEST_NAME, read_shards_manifest, write_shards
from impulsevit.errors import ConfigError, StoreError

pytestmark = pytest.mark.slow  # a server thread, conversions, subprocesses

KW = dict(dataset="fashion_mnist", image_size=16, batch_size=8, num_workers=0, train_subset=64, val_subset=32)


def _convert(dst: str, *extra: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = 0
        for split, k in (("train", 64), ("test", 32)):
            code = code or convert_cli.main(["fashion_mnist", dst, "--format", "litdata", "--split", split,
                                             "--subset", str(k), "--no-progress", *extra])
    return code, err.getvalue()


def _keys(store, prefix: str = "") -> dict[str, str]:
    listed = store.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: o["ETag"] for o in listed}


@pytest.fixture(scope="module")
def store():
    with loopback_s3() as s3:
        yield s3


@pytest.fixture(scope="module")
def local_set(tmp_path_factory) -> str:
    dst = str(tmp_path_factory.mktemp("shards") / "fm")
    assert _convert(dst) == (0, "")
    return dst


@pytest.fixture(scope="module")
def remote_set(store) -> str:
    dst = f"s3://{BUCKET}/fm"
    assert _convert(dst) == (0, "")
    return dst


@pytest.fixture(scope="module")
def torchvision_dm() -> ImageDataModule:
    dm = ImageDataModule(backend="torchvision", **KW)
    dm.setup("fit")
    return dm


def _batches(dm: ImageDataModule, train: bool, epoch: int = 1, rank: int = 0, world: int = 1) -> list:
    return list(dm.loader(train, LoaderPosition(epoch=epoch, batches_done=0, rank=rank, world_size=world)))


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) > 0 and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_convert_uploads_exactly_the_shard_sets_and_skips_them_when_up_to_date(store, remote_set, tmp_path):
    keys = _keys(store)
    for split in ("train", "test"):
        names = {k.rsplit("/", 1)[1] for k in keys if k.startswith(f"fm/{split}/")}
        assert names == {"index.json", "labels.npy", MANIFEST_NAME, "chunk-0-0.bin"}
    assert all(k.startswith(("fm/train/", "fm/test/")) for k in keys)  # nothing else written to the store
    manifest = read_shards_manifest(f"{remote_set}/train")
    assert manifest["num_samples"] == 64 and manifest["request"]["dataset"] == "fashion_mnist"
    assert manifest["preset"]["name"] == "raw" and manifest["normalization"]["mean"] == [0.286] * 3
    code, _ = _convert(remote_set)
    assert code == 0 and _keys(store) == keys  # up to date: nothing uploaded again


def _crops(dm: ImageDataModule, torchvision_dm: ImageDataModule, epoch: int = 1, rank: int = 0, world: int = 1) -> list:
    """The training batches of ``epoch`` as the fast path makes them from the torchvision backend's pixels: its
    order and labels, each image through the litdata backend's :class:`CropPlan` (the FFCV decoder's draws)."""
    plan = dm.data_backend.sets["train"].plan
    source = torchvision_dm.data_backend.sets["train"].source
    loader = torchvision_dm.loader(True, LoaderPosition(epoch=epoch, batches_done=0, rank=rank, world_size=world))
    out = []
    for batch in loader.batch_sampler:
        xs = [torch.from_numpy(plan(np.ascontiguousarray(source.load(k.index)), k.index, k.epoch, k.position))
              .permute(2, 0, 1) for k in batch]
        out.append([torch.stack(xs), torch.tensor([int(source.labels[k.index]) for k in batch])])
    return out


@pytest.mark.parametrize("where", ["local", "s3"])
def test_batches_are_the_torchvision_backends_with_the_fast_crop(where, local_set, remote_set, torchvision_dm,
                                                                 tmp_path, store):
    """Same order, labels and eval pixels as the torchvision backend, byte for byte; the training crops are the
    fast path's (the FFCV decoder's draws and resample, ``test_fast_path_equals_the_ffcv_loader``)."""
    root = local_set if where == "local" else remote_set
    before = _keys(store)
    dm = ImageDataModule(backend="litdata", root=root, cache_dir=str(tmp_path / "cache"), order="global", **KW)
    assert dm.num_classes == 10
    dm.setup("fit")
    assert dm.class_names == torchvision_dm.class_names
    assert dm.data_backend.sets["train"].plan is not None  # numba is installed with the litdata extra
    assert _same(_batches(dm, True), _crops(dm, torchvision_dm))  # order, labels, the fast path's crops and flips
    assert _same(_batches(dm, False), _batches(torchvision_dm, False))  # the eval transform: timm's pixels
    assert _keys(store) == before  # reading writes nothing to the store
    if where == "s3":
        assert any((tmp_path / "cache").rglob("chunk-0-0.bin"))  # read through the local cache


def test_the_training_loader_is_threaded_on_the_fast_path_with_the_same_batches(local_set):
    """``data.storage.loader``: ``threads`` (the default) on the fast path, ``processes`` (a ``DataLoader``) when
    asked for or when timm's transforms follow the crop; threads and processes give the same batches."""
    from impulsevit.data.loading.threaded_loader import ThreadedLoader

    made = {}
    for name, extra in (("threads", {}), ("processes", {"storage": {"loader": "processes"}}),
                        ("rand", {"augment": {"auto_augment": "rand-m9-mstd0.5"}})):
        dm = ImageDataModule(backend="litdata", root=local_set, order="global", **KW, **extra)
        dm.setup("fit")
        made[name] = dm.loader(True, LoaderPosition(epoch=1))
    assert isinstance(made["threads"], ThreadedLoader)
    assert not isinstance(made["processes"], ThreadedLoader) and not isinstance(made["rand"], ThreadedLoader)
    assert _same(list(made["threads"]), list(made["processes"]))


def test_without_numba_the_batches_are_the_torchvision_backends_byte_for_byte(local_set, torchvision_dm, tmp_path,
                                                                              monkeypatch):
    """The PIL fallback (no numba, or a transform the fast path does not cover): timm's transforms and draws."""
    from impulsevit.data.loading import litdata_backend

    monkeypatch.setattr(litdata_backend, "crop_plans", lambda spec, tf, largest=None: (None, None))
    dm = ImageDataModule(backend="litdata", root=local_set, order="global", **KW)
    dm.setup("fit")
    assert _same(_batches(dm, True), _batches(torchvision_dm, True))
    assert _same(_batches(dm, False), _batches(torchvision_dm, False))


def test_stored_bytes_are_litdatas_and_jpegs_decode_to_pils_pixels(tmp_path):
    """:meth:`ShardSource.stored` (the chunk file's Arrow column, no LitData item lookup) returns LitData's bytes for
    every sample of a set of several chunks; its JPEGs decode (libjpeg-turbo via torchvision) to PIL's pixels."""
    from litdata import StreamingDataset
    from PIL import Image

    from impulsevit.data.loading.litdata_backend import ShardSource
    from impulsevit.data.sources.image_source import ArraySource

    rng = np.random.default_rng(0)
    low = rng.integers(0, 256, (24, 4, 5, 3), dtype=np.uint8)
    imgs = np.stack([np.asarray(Image.fromarray(x).resize((90, 70), Image.Resampling.BICUBIC)) for x in low])
    src = ArraySource(imgs, np.arange(24) % 3, ["a", "b", "c"], "test")
    write_shards(src, str(tmp_path / "set"), PRESETS["short256"], progress=False, log=lambda _: None,
                 chunk_bytes=60000)
    source = ShardSource(str(tmp_path / "set"), ["a", "b", "c"], np.arange(24) % 3, np.arange(24), None, "1GB", 5.0)
    assert len(source.chunk_table()) > 2
    litdata = StreamingDataset(str(tmp_path / "set"))
    kinds = set()
    for i in range(24):
        stored = bytes(source.stored(i))
        assert stored == litdata[i:i + 1][0]["image"], i
        kinds.add(stored[:1])
        if stored[:1] == b"J":
            with Image.open(io.BytesIO(stored[1:])) as im:
                np.testing.assert_array_equal(source.load(i), np.asarray(im.convert("RGB")))
    assert kinds == {b"J", b"R"}  # short256 stores about half the images as JPEG


@pytest.mark.ffcv
def test_fast_path_equals_the_ffcv_loader(tmp_path):
    """Two real loaders on the same stored pixels (the ``raw`` preset; FFCV's own JPEG decode differs from
    libjpeg-turbo's accurate one): the litdata backend's training dataset in a ``DataLoader`` and the FFCV loader
    give every image the same crop, flip and bicubic pixels, byte for byte (each image its own label)."""
    pytest.importorskip("ffcv")
    from PIL import Image

    from impulsevit.data.loading.ffcv_loader import build_ffcv_loader
    from impulsevit.data.loading.litdata_backend import CropPlan, ShardDataset, ShardSource
    from impulsevit.data.loading.sampling import EpochSampler
    from impulsevit.data.sources.image_source import ArraySource
    from impulsevit.data.storage.convert import convert_split

    rng = np.random.default_rng(1)
    low = rng.integers(0, 256, (16, 4, 5, 3), dtype=np.uint8)
    imgs = np.stack([np.asarray(Image.fromarray(x).resize((45, 38), Image.Resampling.BICUBIC)) for x in low])
    src = ArraySource(imgs, np.arange(16), [str(i) for i in range(16)], "test")
    convert_split(src, tmp_path / "s.beton", PRESETS["raw"], workers=1, progress=False, log=lambda _: None)
    write_shards(src, str(tmp_path / "set"), PRESETS["raw"], progress=False, log=lambda _: None)
    ffcv = build_ffcv_loader(tmp_path / "s.beton", train=True, image_size=24, batch_size=4, num_workers=1,
                             in_memory=True, seed=3)
    source = ShardSource(str(tmp_path / "set"), src.classes, src.labels, np.arange(16), None, "1GB", 5.0)
    ds = ShardDataset(source, None, seed=3, plan=CropPlan(24, train=True, interpolation="bicubic", seed=3))
    sampler = EpochSampler(ds, seed=3, batch_size=4)
    ours = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=0, collate_fn=ds.collate_fn)
    for epoch in (0, 2):
        ffcv.set_epoch(epoch)
        sampler.set_epoch(epoch)
        theirs = {int(b): a.permute(1, 2, 0).numpy().copy() for x, y in ffcv for a, b in zip(x, y)}
        mine = {int(b): a.permute(1, 2, 0).numpy().copy() for x, y in ours for a, b in zip(x, y)}
        assert sorted(mine) == sorted(theirs) == list(range(16))
        for i in range(16):
            np.testing.assert_array_equal(mine[i], theirs[i], err_msg=f"epoch {epoch}, image {i}")


def test_two_ranks_share_out_an_epoch_without_duplicates(local_set, torchvision_dm, tmp_path):
    # the recipes' data.download (fetch the raw dataset) does not apply to a shard set: prepare_data fetches nothing
    # into it (it tried to download Fashion-MNIST into the shard set's URL, offline a network error)
    dm = ImageDataModule(backend="litdata", root=local_set, download=True, order="global", **KW)
    before = sorted(p.name for p in Path(local_set).rglob("*"))
    dm.prepare_data()
    assert dm.download is False and sorted(p.name for p in Path(local_set).rglob("*")) == before
    dm.setup("fit")
    plans = []
    for rank in (0, 1):
        loader = dm.loader(True, LoaderPosition(epoch=0, batches_done=0, rank=rank, world_size=2))
        plans.append(loader.sampler.plan()[0])
        assert _same(list(loader), _crops(dm, torchvision_dm, epoch=0, rank=rank, world=2))
    assert len(set(plans[0]) & set(plans[1])) == 0 and sorted([*plans[0], *plans[1]]) == list(range(64))


def test_shard_sets_that_contradict_the_run_are_refused_before_work(local_set, tmp_path):
    dm = ImageDataModule(backend="torchvision", **KW)
    other = tmp_path / "other"
    for split in ("train", "test"):  # the same images, recorded as another dataset's (a real manifest)
        write_shards(dm.load_source(split), str(other / split), PRESETS["raw"], progress=False, log=lambda _: None,
                     request={"dataset": "cifar10", "split": split, "subset": None})
    with pytest.raises(ConfigError, match="converted from dataset 'cifar10' but the run's data.dataset is "
                                          "'fashion_mnist'"):
        ImageDataModule(backend="litdata", root=str(other), **KW)
    with pytest.raises(ConfigError, match="stored with preset 'raw' but the run's data.storage.preset is 'short256'"):
        ImageDataModule(backend="litdata", root=local_set, storage={"preset": "short256"}, **KW)
    with pytest.raises(ConfigError, match="converted with --subset 64 but the run's data.train_subset is 48"):
        ImageDataModule(backend="litdata", root=local_set, **{**KW, "train_subset": 48})
    with pytest.raises(ConfigError, match="no shard set at"):
        ImageDataModule(backend="litdata", root=str(tmp_path), **KW)


def test_store_failures_are_one_line(store, remote_set, tmp_path, monkeypatch):
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist"):
        ImageDataModule(backend="litdata", root="s3://no-such-bucket/fm", **KW)
    # a truncated upload: the chunk is shorter than the manifest records
    client = store.client()
    for split in ("train", "test"):
        for name in ("index.json", "labels.npy", MANIFEST_NAME, "chunk-0-0.bin"):
            body = client.get_object(Bucket=BUCKET, Key=f"fm/{split}/{name}")["Body"].read()
            cut = body[:1000] if name.startswith("chunk") and split == "train" else body
            client.put_object(Bucket=BUCKET, Key=f"cut/{split}/{name}", Body=cut)
    with pytest.raises(StoreError, match=r"chunk-0-0.bin is 1000 bytes, the manifest records \d+ \(a truncated"):
        ImageDataModule(backend="litdata", root=f"s3://{BUCKET}/cut", **KW)
    with monkeypatch.context() as m:  # no endpoint answers there
        m.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
        with pytest.raises(StoreError, match="cannot reach the object store at http://127.0.0.1"):
            ImageDataModule(backend="litdata", root=remote_set, **KW)
    with monkeypatch.context() as m:  # no credentials anywhere
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
            m.delenv(var, raising=False)
        m.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        m.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        m.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with pytest.raises(StoreError, match="no credentials for the object store"):
            ImageDataModule(backend="litdata", root=remote_set, **KW)
    # the command line: one line, exit 2, nothing written
    before = _keys(store)
    done = subprocess.run([sys.executable, "-m", "impulsevit.cli", "convert", "fashion_mnist", "s3://no-such-bucket/x",
                           "--format", "litdata", "--subset", "8", "--no-progress"], env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["impulsevit convert: error: writing s3://no-such-bucket/x: bucket "
                                                "'no-such-bucket' does not exist at " + store.endpoint
                                                + " (create it, or fix the URL / AWS_ENDPOINT_URL)"]
    assert _keys(store) == before


def test_a_remote_set_written_without_a_subset_serves_the_runs_subset(store, torchvision_dm, tmp_path):
    """A set of a whole (here: 128-image) split in many chunks; the run's train_subset picks the seeded subset of it
    that the other backends pick of a split (``subset_indices``), read across chunks through the cache."""
    src = ImageDataModule(backend="torchvision", **{**KW, "train_subset": 128, "val_subset": 32})
    for split in ("train", "test"):
        write_shards(src.load_source(split), f"s3://{BUCKET}/whole/{split}", PRESETS["raw"], progress=False,
                     log=lambda _: None, request={"dataset": "fashion_mnist", "split": split, "subset": None},
                     chunk_bytes="20KB", normalization=(src.mean, src.std))
    assert len(_keys(store, "whole/train/")) > 10  # several chunks
    dm = ImageDataModule(backend="litdata", root=f"s3://{BUCKET}/whole", cache_dir=str(tmp_path / "c"),
                         **{**KW, "train_subset": 100})
    dm.setup("fit")
    whole, shards = src.load_source("train"), dm.data_backend.sets["train"].source
    picked = subset_indices(128, 100)
    assert np.array_equal(shards.indices, picked) and np.array_equal(shards.labels, whole.labels[picked])
    for i in (0, 37, 99):
        assert np.array_equal(shards.load(i), whole.load(int(picked[i])))
    assert len(_batches(dm, True)) == 100 // 8


def test_a_chunk_evicted_from_the_cache_is_read_again_not_reported_as_an_outage(store, remote_set, torchvision_dm,
                                                                                 tmp_path, monkeypatch):
    """Loader workers share a rank's chunk cache, and another worker evicts a chunk (to keep within ``cache_size``)
    between its download and this worker's read of it — the race, injected at LitData's chunk open: the read fetches
    the chunk again from the store; it is not reported as an unreachable store (the store is up)."""
    import litdata.streaming.item_loader as item_loader

    opened = item_loader._open_chunk_file
    evicted: list[str] = []

    def evicting_open(path: str):  # noqa: ANN202 - LitData's file object
        if not evicted:
            evicted.append(path)
            Path(path).unlink()
        return opened(path)

    monkeypatch.setattr(item_loader, "_open_chunk_file", evicting_open)
    dm = ImageDataModule(backend="litdata", root=remote_set, cache_dir=str(tmp_path / "cache"), **KW)
    dm.setup("fit")
    shards, whole = dm.data_backend.sets["train"].source, torchvision_dm.data_backend.sets["train"].source
    assert np.array_equal(shards.load(0), whole.load(0))
    assert evicted and Path(evicted[0]).is_file()  # the race happened, and the chunk was fetched again


def test_a_chunk_wait_that_times_out_while_the_store_answers_is_not_called_an_outage(store, remote_set, tmp_path,
                                                                                       monkeypatch):
    """LitData gives up waiting for a chunk its download thread never wrote (``ChunkWaitTimeoutError``, injected
    at its chunk open) while the store is up: the one line says the download stalled and what to change, not that
    the store cannot be reached (it answers)."""
    import litdata.streaming.item_loader as item_loader
    from litdata.exceptions import ChunkWaitTimeoutError

    from impulsevit.errors import DataError

    def stalled(path: str):  # noqa: ANN202
        raise ChunkWaitTimeoutError(path, 120.0)

    monkeypatch.setattr(item_loader, "_open_chunk_file", stalled)
    dm = ImageDataModule(backend="litdata", root=remote_set, cache_dir=str(tmp_path / "cache"), order="global",
                         **KW)
    dm.setup("fit")
    with pytest.raises(DataError) as caught:
        dm.data_backend.sets["train"].source.load(0)
    line = str(caught.value)
    assert "stalled while the store answers" in line and "data.storage.cache_size" in line and "\n" not in line
    assert "cannot reach" not in line


def test_what_a_killed_reader_left_in_the_chunk_cache_is_cleared_by_the_next_first_reader(store, remote_set,
                                                                                          tmp_path):
    """A process reading a remote set (global order) that dies mid-epoch leaves LitData's reference counts and lock
    files beside the chunks; the next process to open the cache, with no other live reader, deletes them before it
    reads (a count nobody releases pins its chunk in the cache, LitData's prefetch then waits for room and the read
    ~30 s for its chunk) and keeps the chunks."""
    cache = tmp_path / "cache"
    opened = (f"from impulsevit.data import ImageDataModule; dm = ImageDataModule(backend='litdata', "
              f"root={remote_set!r}, cache_dir={str(cache)!r}, order='global', **{KW!r}); dm.setup('fit'); "
              f"dm.data_backend.sets['train'].source.load(0)")
    run = subprocess.run([sys.executable, "-c", f"import os; {opened}; os._exit(0)"], env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    counts = {p: p.read_text() for p in cache.rglob("*.cnt")}
    assert counts and set(counts.values()) == {"1"}, counts  # LitData's layout, as clear_stale_cache_state knows it
    chunks = {p for p in cache.rglob("chunk-*.bin")}
    exec(opened, {})  # this process: the first live reader of the folder
    assert chunks and all(p.is_file() for p in chunks)
    assert not [p for p in counts if p.is_file()]  # the dead reader's counts: gone, not pinning chunk 0


def test_submit_streams_from_the_store_with_no_conversion_job(store, remote_set, tmp_path):
    """``impulsevit submit`` on the litdata backend (a cluster without a shared data disk): one training job whose
    command reads the bucket; no conversion job is chained before it (the shards exist); the AWS variables reach the
    job through sbatch's default ``--export=ALL``."""
    run = subprocess.run([sys.executable, "-m", "impulsevit.cli", "submit", "--recipe", "quickstart", "--nodes", "2",
                          "--gpus-per-node", "1", "--runs-dir", str(tmp_path / "runs"), "--dry-run",
                          "--data.init_args.backend=litdata", f"--data.init_args.root={remote_set}",
                          "--data.init_args.train_subset=64", "--data.init_args.val_subset=32"],
                         env=subprocess_env(), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("#SBATCH --job-name=") == 1 and "convert" not in run.stdout
    assert f"--data.init_args.root={remote_set}" in run.stdout and "--trainer.num_nodes=2" in run.stdout


@pytest.fixture(scope="module")
def block_set(store, tmp_path_factory) -> str:
    """A remote set of 512 training images in ~170 chunks of 8 kB (32 validation images)."""
    dst, local = f"s3://{BUCKET}/blocks", tmp_path_factory.mktemp("blocks") / "blocks"
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        for split, k in (("train", 512), ("test", 32)):
            assert convert_cli.main(["fashion_mnist", str(local), "--format", "litdata", "--split", split,
                                     "--subset", str(k), "--chunk-bytes", "8KB", "--no-progress"]) == 0
    client = store.client()  # one client for the ~170 chunks (the converter's upload opens one per file)
    for path in sorted(local.rglob("*"), key=lambda p: p.name == MANIFEST_NAME):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"blocks/{path.relative_to(local).as_posix()}")
    return dst


@contextlib.contextmanager
def _chunk_gets(prefix: str) -> Iterator[list[str]]:
    """The chunk files of ``<bucket>/<prefix>/train`` the loopback store is asked for meanwhile (its request log)."""
    import logging

    gets: list[str] = []

    class Requests(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            if f'"GET /{BUCKET}/{prefix}/train/chunk-' in text:
                gets.append(text.split(f"/{BUCKET}/{prefix}/train/", 1)[1].split(" ", 1)[0])

    handler = Requests()
    logging.getLogger("werkzeug").addHandler(handler)
    try:
        yield gets
    finally:
        logging.getLogger("werkzeug").removeHandler(handler)


@pytest.mark.parametrize("in_memory", [True, False], ids=["memory", "files"])
def test_block_order_fetches_each_chunk_once_per_epoch_with_a_cache_of_a_few_blocks(store, block_set, tmp_path,
                                                                                     monkeypatch, in_memory):
    """``data.order=block`` on a remote set of ~170 small chunks, read by 2 loader threads: the loopback server's
    request log has at most one GET per chunk in an epoch (every chunk the epoch reads), and the chunks held at once
    — in the process's memory (``data.storage.in_memory``, the threads' default) or in the cache folder — are never
    more than 10 % of the set (the live blocks, not the set). Each prefetch starts 50 ms late, as on a loaded machine:
    one still queued when the reader has fetched, read and dropped its chunk must not download it again."""
    import time

    from impulsevit.data.loading.litdata_backend import ShardSource
    from impulsevit.data.loading.sampling import block_sequence
    from impulsevit.errors import DataError

    prefetch = ShardSource._prefetch
    monkeypatch.setattr(ShardSource, "_prefetch", lambda self, chunk: (time.sleep(0.05), prefetch(self, chunk)))
    cache = tmp_path / "cache"
    with _chunk_gets("blocks") as gets:
        dm = ImageDataModule(backend="litdata", root=block_set, cache_dir=str(cache), order="block",
                             storage={"block_size": 8, "in_memory": in_memory},
                             **{**KW, "train_subset": 512, "num_workers": 2, "batch_size": 4})
        assert dm.spec.order == "block"
        dm.setup("fit")
        source = dm.data_backend.sets["train"].source
        chunks = len(source.chunk_table())
        loader = dm.loader(True, LoaderPosition(epoch=0, batches_done=0, rank=0, world_size=1))
        assert source.in_memory is in_memory
        most, n = 0, 0
        for images, _ in loader:
            n += len(images)
            most = max(most, len(source._held) if in_memory else len(list(cache.rglob("chunk-*.bin"))))
    read = set(source.chunk_of()[loader.sampler.plan()[0][:n]].tolist())
    assert chunks > 100 and n == 512
    assert len(gets) == len(set(gets)) == len(read)  # each chunk the epoch reads, fetched once
    assert 0 < most <= 0.1 * chunks, (most, chunks)
    if in_memory:
        assert not list(cache.rglob("chunk-*.bin"))  # nothing written to the folder
        assert 0 < source.peak_held_bytes <= 0.1 * sum(c["chunk_bytes"] for c in source.chunk_table())

    # entering an epoch (or resuming) downloads the chunks of the block it starts in, not only the next block's
    source.follow(1, 0)
    source._pool.shutdown(wait=True)
    source._pool = None
    order, _ = block_sequence(source.chunk_sizes(), epoch=1, seed=dm.spec.seed, world_size=1, block_size=8)
    first_two = set(source.chunk_of()[order[:16]].tolist())
    table = source.chunk_table()
    if in_memory:
        assert first_two <= set(source._held)
    else:
        assert all((source.cache_dir / table[c]["filename"]).is_file() for c in first_two)
        # a cache file cut short (a power loss: the cache is written without fsync) is fetched again
        c = min(first_two)
        cached = source.cache_dir / table[c]["filename"]
        whole = cached.read_bytes()
        cached.write_bytes(whole[: len(whole) // 2])
        assert source.fetch(c) and cached.read_bytes() == whole
    # an object of another size than index.json's: one line naming the chunk, nothing kept
    other = next(i for i in range(chunks) if i not in first_two and i not in source._fetched)
    name, client = table[other]["filename"], store.client()
    key = f"blocks/train/{name}"
    original = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    client.put_object(Bucket=BUCKET, Key=key, Body=b"short")
    try:
        with pytest.raises(DataError, match=rf"chunk {name} is 5 bytes where index.json says \d+ \(an interrupted"):
            source.fetch(other)
    finally:
        client.put_object(Bucket=BUCKET, Key=key, Body=original)
    assert not (source.cache_dir / name).exists() and other not in source._held


def test_two_ranks_of_a_node_fetch_each_chunk_once_holding_their_own_in_memory(store, block_set, tmp_path):
    """2 ranks of one node (one cache folder), loader threads, chunks in memory: a chunk that the epoch's order cuts
    between the ranks goes through the shared cache folder (both read it at the same time, at the start or the end
    of their shares), every other chunk is held by the one rank that reads it; the store sees one GET per chunk."""
    cache = tmp_path / "cache"
    with _chunk_gets("blocks") as gets:
        loaders, sources = [], []
        for rank in (0, 1):
            dm = ImageDataModule(backend="litdata", root=block_set, cache_dir=str(cache), order="block",
                                 storage={"block_size": 16}, **{**KW, "train_subset": 512, "num_workers": 2,
                                                                "batch_size": 4})
            dm.setup("fit")
            loaders.append(iter(dm.loader(True, LoaderPosition(epoch=0, batches_done=0, rank=rank, world_size=2))))
            sources.append(dm.data_backend.sets["train"].source)
        assert all(s.in_memory for s in sources)  # the default for loader threads and a small window
        n = 0
        for a, b in zip(*loaders):  # the ranks in step, as DDP keeps them
            n += len(a[0]) + len(b[0])
    crossing = sources[0]._crossing & sources[1]._crossing
    assert n == 512 and crossing
    assert len(gets) == len(set(gets)) > 100  # each chunk once per node
    assert not (crossing & set().union(*(s._held for s in sources)))  # the cut chunks went through the folder


def test_a_store_that_stops_answering_stops_every_reader_of_chunks_in_memory_with_one_line(store, block_set, tmp_path,
                                                                                          monkeypatch):
    """Chunks held in memory, the store gone mid-epoch (the chunk client now points at a port nobody listens on): the
    training loader raises one :class:`DataError` naming the endpoint and ``--resume auto``; two readers of one
    chunk share its single failed download and both get the error (neither waits forever)."""
    import threading

    from impulsevit.data.loading.litdata_backend import chunk_client
    from impulsevit.errors import DataError

    dm = ImageDataModule(backend="litdata", root=block_set, cache_dir=str(tmp_path / "cache"), order="block",
                         storage={"block_size": 8, "in_memory": True},
                         **{**KW, "train_subset": 512, "num_workers": 2, "batch_size": 4})
    dm.setup("fit")
    source = dm.data_backend.sets["train"].source
    batches = iter(dm.loader(True, LoaderPosition(epoch=0, batches_done=0, rank=0, world_size=1)))
    next(batches)
    gone = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", gone)
    source._client = chunk_client(2.0)
    with pytest.raises(DataError, match=rf"cannot reach the object store at {gone} .*--resume auto"):
        for _ in batches:
            pass
    # two readers of one chunk nobody holds: one download, both told
    chunk = next(c for c in range(len(source.chunk_table())) if c not in source._held and c not in source._crossing)
    first = int(source.chunk_ends()[chunk - 1]) if chunk else 0
    errors: list[BaseException] = []

    def read() -> None:
        try:
            source.stored(first)
        except DataError as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in readers) and len(errors) == 2
    assert all(gone in str(e) and "\n" not in str(e) for e in errors)
    source._pool.shutdown(wait=True)  # the prefetches of the next block fail too, and leave nothing in flight
    assert not source._pending and chunk not in source._held


def test_chunks_are_held_in_memory_for_loader_threads_when_the_live_window_fits(monkeypatch):
    """``data.storage.in_memory`` None (the default): memory for a remote set read by loader threads whose live
    windows (two blocks and the lag, at the set's mean sample size, on each rank of the node) fit in half the
    available memory; files for worker processes, local sets, a window too big, or chunks of unknown size; a given
    setting is followed (but worker processes always share the folder)."""
    import psutil

    from impulsevit.data.loading.litdata_backend import ShardSource, holds_in_memory, ranks_on_this_node

    def source(where: str, chunk_bytes: int | None = 1000) -> ShardSource:
        src = ShardSource(where, ["a"], np.zeros(100, np.int64), np.arange(100), Path("cache"), "1GB", 30.0)
        src._chunks = [{"filename": f"chunk-{i}.bin", "chunk_size": 10, "chunk_bytes": chunk_bytes}
                       for i in range(10)]  # 100 samples of 100 bytes
        return src

    remote = source(f"s3://{BUCKET}/x")
    assert remote.live_window_bytes(8, 4) == 20 * 100 + 2 * 1000
    assert holds_in_memory(remote, 8, 4, threads=True, setting=None, ranks_here=8)
    assert not holds_in_memory(remote, 8, 4, threads=False, setting=None, ranks_here=1)
    assert not holds_in_memory(remote, 8, 4, threads=False, setting=True, ranks_here=1)
    assert not holds_in_memory(remote, 8, 4, threads=True, setting=False, ranks_here=1)
    assert not holds_in_memory(source("/data/x"), 8, 4, threads=True, setting=True, ranks_here=1)
    assert not holds_in_memory(source(f"s3://{BUCKET}/x", None), 8, 4, threads=True, setting=None, ranks_here=1)
    huge = int(psutil.virtual_memory().available)  # a block this big: each window ~2x the memory
    assert not holds_in_memory(remote, huge // 100, 0, threads=True, setting=None, ranks_here=1)
    assert holds_in_memory(remote, huge // 100, 0, threads=True, setting=True, ranks_here=1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    assert ranks_on_this_node(16) == 16  # nothing says: every rank counted here
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    assert ranks_on_this_node(16) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert ranks_on_this_node(16) == 8


def test_a_set_rewritten_at_the_same_address_is_not_read_from_the_old_sets_cached_chunks(store, tmp_path):
    """The remote chunk cache outlives a run. A set rewritten at the same address (``convert --force``, here with
    another ``--shuffle`` seed: fixed-size raw samples, so every chunk keeps its name and size) must be read from
    the store, not from the old set's cached chunks: a second reader over the same cache folder gives what a reader
    over an empty cache gives. The block order (the default) is the one that read the old chunks; the global order,
    whose cache LitData manages, passed before the fix too and shares the folder's name (``cache_folder``); chunks
    held in memory (``in_memory``, the loader threads' default) do not outlive the process."""
    order = "block"
    src = ImageDataModule(backend="torchvision", **KW)

    def write(seed: int) -> None:
        for split in ("train", "test"):
            write_shards(src.load_source(split), f"s3://{BUCKET}/rewritten/{split}", PRESETS["raw"], progress=False,
                         log=lambda _: None, request={"dataset": "fashion_mnist", "split": split,
                                                      "subset": 64 if split == "train" else 32},
                         chunk_bytes="8KB", normalization=(src.mean, src.std), shuffle_seed=seed, force=True)

    def epoch(cache: Path) -> tuple[list[dict], list]:
        dm = ImageDataModule(backend="litdata", root=f"s3://{BUCKET}/rewritten", cache_dir=str(cache), order=order,
                             storage={"block_size": 8, "in_memory": False}, **KW)
        dm.setup("fit")
        return dm.data_backend.sets["train"].source.chunk_table(), _batches(dm, True)

    write(1)
    old_table, old = epoch(tmp_path / "cache")
    assert any((tmp_path / "cache").rglob("chunk-*.bin"))  # the old set's chunks are still cached
    write(2)
    table, again = epoch(tmp_path / "cache")
    _, fresh = epoch(tmp_path / "empty-cache")
    assert [(c["filename"], c.get("chunk_bytes")) for c in table] == \
        [(c["filename"], c.get("chunk_bytes")) for c in old_table]  # nothing but the content tells the sets apart
    assert not _same(old, fresh)
    assert _same(again, fresh)
