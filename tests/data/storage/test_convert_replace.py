"""``impulsevit convert`` never replaces a finished conversion of another request or preset without ``--overwrite``,
in either format and store (``.beton`` files, LitData shard sets in a local folder or a loopback S3 bucket,
``tests/_s3.py``): one check before any work (``convert_cli.claim_converted`` over
``convert.other_conversion``), through the real command. The same request stays up to date (skipped) without it."""

from __future__ import annotations

import pytest
from _s3 import BUCKET, loopback_s3
from faults.harness import assert_one_line_error, run, snapshot

from impulsevit.data.storage.manifest import read_manifest
from impulsevit.data.storage.shards import read_shards_manifest

pytestmark = pytest.mark.slow  # converts data, starts the real command


@pytest.fixture(scope="module")
def store():
    with loopback_s3() as s3:
        yield s3


@pytest.mark.parametrize(("fmt", "where"), [("ffcv", "local"), ("litdata", "local"), ("litdata", "s3")])
def test_a_finished_conversion_of_another_subset_is_replaced_only_with_overwrite(fmt, where, store, tmp_path):
    dst = str(tmp_path / "out") if where == "local" else f"s3://{BUCKET}/{tmp_path.name}"
    out = f"{dst}/train.beton" if fmt == "ffcv" else f"{dst}/train"

    def state() -> dict:
        if where == "local":
            return snapshot(tmp_path / "out")
        listed = store.client().list_objects_v2(Bucket=BUCKET, Prefix=tmp_path.name).get("Contents", [])
        return {o["Key"]: o["ETag"] for o in listed}

    def manifest() -> dict:
        return read_manifest(out) if fmt == "ffcv" else read_shards_manifest(out)

    args = ("convert", "fashion_mnist", dst, "--format", fmt, "--split", "train", "--no-progress", "--workers", "1")
    res = run(*args, "--subset", "8", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    finished = state()
    assert finished and manifest()["num_samples"] == 8

    res = run(*args, "--subset", "6", cwd=tmp_path)  # another request into the same place: refused, nothing touched
    assert_one_line_error(res, 2, out, "another request (subset: 8, here 6)", "--overwrite")
    if (fmt, where) == ("litdata", "local"):  # the same one check for every format and store: once is enough
        res = run(*args, "--subset", "8", "--preset", "short256", cwd=tmp_path)  # another preset: the same
        assert_one_line_error(res, 2, out, "preset: 'raw', here 'short256'", "--overwrite")
        res = run(*args, "--subset", "8", cwd=tmp_path)  # the same request: up to date, no --overwrite needed
        assert res.rc == 0 and "up to date (8 images), skipped" in res.out, res.err[-3000:]
    assert state() == finished

    res = run(*args, "--subset", "6", "--overwrite", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert manifest()["num_samples"] == 6 and manifest()["request"]["subset"] == 6
