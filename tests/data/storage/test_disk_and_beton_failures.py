"""Full disks and damaged ``.beton`` files: real small tmpfs mounts, real FFCV writers, the real CLI.

A full filesystem must fail `convert` / `fit` within seconds with one line naming the path and the bytes needed (FFCV's
writer alone waits forever); a truncated, foreign or partly zeroed ``.beton`` must be named on open / by the check.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("ffcv")

from _image_files import make_tree  # noqa: E402
from faults.harness import small_tmpfs  # noqa: E402

from impulsevit.cli import main as cli_main  # noqa: E402
from impulsevit.data.sources.registry import get_dataset  # noqa: E402
from impulsevit.data.storage.convert import PRESETS, convert_split, manifest_path  # noqa: E402
from impulsevit.data.storage.convert_cli import main  # noqa: E402
from impulsevit.data.storage.integrity import BetonError, check_header, verify_beton  # noqa: E402
from impulsevit.io import WriteError, atomic_write_text  # noqa: E402

pytestmark = [pytest.mark.ffcv, pytest.mark.slow]


def _no_temps(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if ".tmp-" in p.name or ".errors-" in p.name or ".failed-" in p.name]


def test_convert_into_a_full_filesystem_fails_fast_naming_path_and_bytes(tmp_path, capsys):
    make_tree(tmp_path / "src", per_class=4)
    with small_tmpfs(tmp_path / "small", "2m") as mnt:
        t0 = time.monotonic()
        status = cli_main(["convert", str(tmp_path / "src"), str(mnt / "out"), "--workers", "1", "--no-progress"])
        elapsed = time.monotonic() - t0
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 1, err
        assert f"cannot write {mnt / 'out' / 'train.beton'}: no space left on device (needs ~" in err[-1]
        assert "free)" in err[-1]
        assert elapsed < 60
        assert not _no_temps(mnt) and not list(mnt.rglob("*.beton"))


def test_writer_process_failing_on_a_full_disk_is_reported_not_waited_on(tmp_path):
    """The free-space pre-check off: a writer process hits ENOSPC in the middle of the file (FFCV alone hangs)."""
    make_tree(tmp_path / "src", per_class=4)
    source = get_dataset("imagefolder").load(tmp_path / "src", "train")
    with small_tmpfs(tmp_path / "small", "3m") as mnt:
        out = mnt / "train.beton"
        t0 = time.monotonic()
        with pytest.raises(WriteError, match=r"cannot write .*train\.beton: no space left on device") as err:
            convert_split(source, out, PRESETS["raw"], workers=2, progress=False, log=lambda _: None,
                          check_free_space=False)
        assert time.monotonic() - t0 < 60
        assert "\n" not in str(err.value)
        assert not _no_temps(mnt) and not out.exists() and not manifest_path(out).exists()


def test_atomic_write_on_full_and_read_only_filesystems(tmp_path):
    with small_tmpfs(tmp_path / "small", "64k") as mnt:
        atomic_write_text(mnt / "old.txt", "old")
        with pytest.raises(WriteError, match=r"cannot write .*old\.txt: no space left on device \(needs ~"):
            atomic_write_text(mnt / "old.txt", "x" * 200_000)
        assert (mnt / "old.txt").read_text() == "old" and not _no_temps(mnt)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        with pytest.raises(WriteError, match=r"cannot write .*new\.txt: read-only file system"):
            atomic_write_text(mnt / "new.txt", "x")


def test_commit_never_deletes_an_output_of_another_kind(tmp_path):
    """A file committed over a directory (or a directory over a file, or a directory over a directory its caller does
    not own) is a one-line error naming the path; what was there stays, the temp goes."""
    from impulsevit.io import commit, temp_path

    folder, plain = tmp_path / "out.bin", tmp_path / "plain.txt"
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "keep.txt").write_text("keep")
    plain.write_text("plain")
    for path, make_tmp in ((folder, lambda t: t.write_text("new")), (plain, lambda t: t.mkdir()),
                           (folder, lambda t: t.mkdir())):
        tmp = temp_path(path)
        make_tmp(tmp)
        with pytest.raises(WriteError, match=f"cannot write {path}: it is an existing (directory|file)"):
            commit(tmp, path)
        assert not tmp.exists()
    assert (folder / "deep" / "keep.txt").read_text() == "keep" and plain.read_text() == "plain"
    tmp = temp_path(folder)  # a directory the caller owns (a distributed checkpoint) is replaced
    (tmp / "new").mkdir(parents=True)
    commit(tmp, folder, replace_dir=True)
    assert [p.name for p in folder.iterdir()] == ["new"] and not _no_temps(tmp_path)


@pytest.fixture(scope="module")
def beton(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("beton")
    make_tree(root / "src", per_class=6, size=(64, 64))
    assert main([str(root / "src"), str(root / "out"), "--workers", "1", "--no-progress", "--split", "train"]) == 0
    return root / "out" / "train.beton"


def _copy(beton: Path, dst: Path) -> Path:
    out = dst / beton.name
    out.write_bytes(beton.read_bytes())
    manifest_path(out).write_bytes(manifest_path(beton).read_bytes())
    return out


def test_truncated_and_random_betons_are_named_on_open(beton, tmp_path):
    trunc = _copy(beton, tmp_path)
    data = trunc.read_bytes()
    trunc.write_bytes(data[: len(data) // 3])
    with pytest.raises(BetonError, match=rf"{trunc} is not a readable \.beton file: truncated"):
        check_header(trunc)
    rand = tmp_path / "random.beton"
    rand.write_bytes(os.urandom(100_000))
    with pytest.raises(BetonError, match=rf"{rand} is not a readable \.beton file: format version"):
        check_header(rand)
    assert check_header(beton) == 6 * 2


def test_zeroed_region_is_detected_by_the_checksum(beton, tmp_path, capsys):
    verify_beton(beton, __import__("json").loads(manifest_path(beton).read_text()), "full")
    bad = _copy(beton, tmp_path)
    size = bad.stat().st_size
    with open(bad, "r+b") as fh:  # zero 64 KiB inside the data region, keeping header and allocation table intact
        fh.seek(size // 2)
        fh.write(bytes(65536))
    check_header(bad)  # the structure is still fine
    assert cli_main(["convert", "--check", str(bad), "--full"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: bytes" in err and "differ from the checksum in its manifest" in err
    assert cli_main(["convert", "--check", str(beton)]) == 0
    assert "ok (sampled)" in capsys.readouterr().out


def _fit_args(tmp_path: Path, data: dict) -> list[str]:
    import json

    from _cli_helpers import TINY

    data = {"class_path": "impulsevit.data.ImageDataModule",
            "init_args": {"dataset": "imagefolder", "image_size": 32, "batch_size": 2, "num_workers": 1, **data}}
    return ["fit", "--recipe", str(TINY), f"--runs_dir={tmp_path / 'runs'}", "--name=r", "--trainer.max_epochs=1",
            f"--data={json.dumps(data)}"]


def test_fit_with_the_ffcv_cache_on_a_full_filesystem_fails_fast(tmp_path, capsys):
    make_tree(tmp_path / "src", per_class=3, size=(32, 32))
    with small_tmpfs(tmp_path / "small", "2m") as mnt:
        t0 = time.monotonic()
        status = cli_main(_fit_args(tmp_path, {"root": str(tmp_path / "src"), "cache_dir": str(mnt / "cache")}))
        assert time.monotonic() - t0 < 120
        err = capsys.readouterr().err
        line = [ln for ln in err.splitlines() if ln.startswith("impulsevit fit: error: ")]
        assert status == 1 and len(line) == 1 and "Traceback" not in err, err
        assert f"cannot write {mnt / 'cache'}" in line[0] and "no space left on device (needs ~" in line[0]
        assert not _no_temps(mnt) and not list(mnt.rglob("*.beton"))
        assert not (tmp_path / "runs" / "r").exists()  # nothing half-made


def test_fit_on_a_truncated_beton_names_the_file(beton, tmp_path, capsys):
    trunc = _copy(beton, tmp_path)
    trunc.write_bytes(beton.read_bytes()[:5000])
    status = cli_main(_fit_args(tmp_path, {"storage": {"train_beton": str(trunc), "val_beton": str(beton)}}))
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if ln.startswith("impulsevit fit: error: ")]
    assert status == 2 and len(line) == 1 and "Traceback" not in err, err
    assert f"{trunc} is not a readable .beton file" in line[0]
    assert not (tmp_path / "runs").exists()


def test_first_use_of_a_beton_checks_every_chunk_then_later_uses_are_sampled(beton, tmp_path):
    """A damaged chunk of a real .beton (its manifest re-chunked at 4 KiB so the small file has many chunks, as a
    74 MB one has at 4 MiB) is found at the datamodule's first use wherever it lies; a sampled check alone finds it
    with the stated probability only. A passed full check is recorded, and later uses of that same file are sampled."""
    import json
    import random

    from impulsevit.data.loading.datamodule import ImageDataModule
    from impulsevit.data.storage.integrity import file_digests, sampled_detection_probability, verified_path

    def setup(train: Path, val: Path) -> None:
        dm = ImageDataModule("imagefolder", backend="ffcv", image_size=32, batch_size=2, num_workers=1,
                             storage={"train_beton": str(train), "val_beton": str(val)})
        dm.setup("fit")

    chunk = 4096
    (tmp_path / "good").mkdir()
    good = _copy(beton, tmp_path / "good")
    manifest = json.loads(manifest_path(good).read_text())
    manifest["checksum"] = {**manifest["checksum"], "chunk_bytes": chunk, "chunks": file_digests(good, None, chunk)}
    manifest_path(good).write_text(json.dumps(manifest))
    n = len(manifest["checksum"]["chunks"])
    assert n > 12, n
    setup(good, good)
    assert verified_path(good).is_file()  # first use: full, passed, recorded
    missed_by_sampling = 0
    for i in range(1, n - 1):
        folder = tmp_path / f"bad{i}"
        folder.mkdir()
        bad = folder / good.name
        bad.write_bytes(good.read_bytes())
        manifest_path(bad).write_text(json.dumps(manifest))
        with open(bad, "r+b") as fh:  # flip 16 bytes in the middle of chunk i
            fh.seek(i * chunk + chunk // 2)
            old = fh.read(16)
            fh.seek(i * chunk + chunk // 2)
            fh.write(bytes(b ^ 0xFF for b in old))
        try:
            verify_beton(bad, manifest, "sampled", rng=random.Random(i))
        except BetonError:
            pass
        else:
            missed_by_sampling += 1
        with pytest.raises(BetonError, match=rf"{bad}: bytes {i * chunk}-{(i + 1) * chunk} differ"):
            setup(bad, good)
        assert not verified_path(bad).exists()
    assert missed_by_sampling > 0 and sampled_detection_probability(n) == 8 / (n - 2)
    # the recorded file: later uses re-hash only the sampled chunks (a damaged unsampled chunk is not read)
    record = verified_path(good).read_text()
    setup(good, good)
    assert verified_path(good).read_text() == record


def test_fit_on_a_damaged_beton_leaves_no_run_behind(beton, tmp_path, capsys):
    """A ``.beton`` whose data fails its checksum at setup (after Lightning opened the event file): one line naming the
    file, and no run directory left that would refuse the retry as "already holds a run"."""
    bad = _copy(beton, tmp_path)
    with open(bad, "r+b") as fh:  # zero 64 KiB inside the data region; header and allocation table intact
        fh.seek(bad.stat().st_size // 2)
        fh.write(bytes(65536))
    storage = {"train_beton": str(bad), "val_beton": str(beton), "beton_check": "full"}
    status = cli_main(_fit_args(tmp_path, {"storage": storage}))
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if ln.startswith("impulsevit fit: error: ")]
    assert status == 1 and len(line) == 1 and "Traceback" not in err, err
    assert f"{bad}: bytes" in line[0] and "differ from the checksum in its manifest" in line[0]
    assert not (tmp_path / "runs").exists()


def test_a_full_disk_under_the_tensorboard_writer_is_one_line_and_keeps_the_run(tmp_path, capsys):
    """TensorBoard's event writer (a thread) hitting a full disk: one line naming the run directory (was a thread
    traceback, then Lightning's "you tried to log 9.60 which is not supported" after ~150 lines); the run's files stay
    (it trained)."""
    from _cli_helpers import TINY

    with small_tmpfs(tmp_path / "small", "1m") as mnt:
        (mnt / "filler").write_bytes(bytes(1024 * 1024 - 40 * 1024))  # 40 KiB left: config, hparams, run.json, events
        run = mnt / "runs" / "r"
        status = cli_main(["fit", "--recipe", str(TINY), f"--runs_dir={mnt / 'runs'}", "--name=r",
                           "--trainer.max_epochs=100", "--checkpoint.save_last=false", "--checkpoint.save_top_k=0",
                           "--model.attention_every_n_epochs=null"])  # its records would fill the 40 KiB first
        err = capsys.readouterr().err
        line = [ln for ln in err.splitlines() if ln.startswith("impulsevit fit: error: ")]
        assert status == 1 and len(line) == 1 and "Traceback" not in err and "you tried to log" not in err, err
        # the first run file written after the disk filled (events, run.json, ...) is named, inside the run
        assert f"cannot write {run}" in line[0] and "no space left on device" in line[0], line
        assert (run / "config.yaml").is_file() and list(run.glob("events.out.tfevents.*"))
