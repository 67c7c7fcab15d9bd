"""Fault suite: hostile names and existing outputs, for every subcommand that turns a name into a path or writes an
output a user names.

- Names (``fit`` / ``submit`` run names, ``study --name``, ``study --methods``, a link that leads out of the runs
  directory): ``../x``, an absolute path and ``a/b`` are refused with exit 2 and one line naming the option, and
  nothing is created — neither beside the runs directory nor inside it (one resolver: ``impulsevit.io.child_path``).
- Outputs (``export`` file and folder, ``predict --out``, ``data preview --out``, ``convert`` DST, ``download`` ROOT):
  an existing file is left byte for byte as it was without ``--overwrite`` (exit 2, one line naming the path and the
  flag) and replaced with it; a file where a folder goes is one line (one policy: ``impulsevit.io.claim_output``).
  What the commands themselves wrote and refresh (``convert``'s ``.beton`` with its manifest) is still skipped or
  rebuilt without the flag.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from impulsevit.errors import ConfigError
from impulsevit.io import check_child_name, child_path, claim_output
from tests.faults.harness import TINY, assert_one_line_error, run, snapshot

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

HOSTILE = ["../x", "/abs", "a/b"]


def _hostile(name: str, tmp_path: Path) -> str:
    """``/abs`` becomes an absolute path under ``tmp_path`` (so a wrong write would be seen, not land in ``/``)."""
    return str(tmp_path / "abs") if name == "/abs" else name


def _refused_and_nothing_written(tmp_path: Path, before: dict[str, str], res, *needles: str) -> None:
    assert_one_line_error(res, 2, *needles)
    assert snapshot(tmp_path) == before, "a refused name created or changed files"
    assert not (tmp_path / "abs").exists() and not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------------ names (no work)
@pytest.mark.parametrize("name", HOSTILE)
def test_fit_refuses_a_run_name_that_leaves_runs_dir(tmp_path, name):
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, f"--runs_dir={work / 'runs'}", f"--name={_hostile(name, tmp_path)}",
              cwd=work)
    _refused_and_nothing_written(tmp_path, before, res, "--name", "single folder name")


@pytest.mark.parametrize("name", HOSTILE)
def test_study_refuses_a_study_name_that_leaves_runs_dir(tmp_path, name):
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(tmp_path)
    res = run("study", "--recipe", TINY, "--runs-dir", work / "runs", "--name", _hostile(name, tmp_path),
              "--seeds", "1", "--methods", "impulse", cwd=work)
    _refused_and_nothing_written(tmp_path, before, res, "impulsevit study: error:", "--name")


@pytest.mark.parametrize("method", ["../../x", "/abs", "a/b"])
def test_study_refuses_a_method_that_would_become_a_folder_outside(tmp_path, method):
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(tmp_path)
    res = run("study", "--recipe", TINY, "--runs-dir", work / "runs", "--seeds", "1",
              "--methods", f"impulse,{_hostile(method, tmp_path)}", cwd=work)
    _refused_and_nothing_written(tmp_path, before, res, "--methods", "one folder name")


@pytest.mark.parametrize(("args", "needles"), [
    (["--seeds", "0"], ["--seeds 0", ">= 1"]),
    (["--seeds", "-2"], ["--seeds -2", ">= 1"]),
    (["--methods", ","], ["--methods is empty"]),
])
def test_study_refuses_bad_seeds_and_methods_in_one_line(tmp_path, args, needles):
    before = snapshot(tmp_path)
    res = run("study", "--recipe", TINY, "--runs-dir", tmp_path / "runs", *args, cwd=tmp_path)
    _refused_and_nothing_written(tmp_path, before, res, "impulsevit study: error:", *needles)


def test_study_unknown_recipe_is_one_short_line(tmp_path):
    res = run("study", "--recipe", "tiny_synthetc", "--runs-dir", tmp_path / "runs", cwd=tmp_path)
    line = assert_one_line_error(res, 2, "unknown recipe 'tiny_synthetc'", "Did you mean 'tiny_synthetic'",
                                 "`impulsevit recipes`")
    assert len(res.err_lines) == 1 and len(line) < 400, res.err
    assert not any(tmp_path.iterdir())


def test_submit_refuses_a_run_name_that_leaves_runs_dir(tmp_path):
    before = snapshot(tmp_path)
    res = run("submit", "--recipe", TINY, "--runs-dir", tmp_path / "runs", "--name", "../x", "--dry-run",
              cwd=tmp_path)
    _refused_and_nothing_written(tmp_path, before, res, "--name")


@pytest.mark.parametrize("split", ["../x", "a/b"])
def test_convert_refuses_a_split_name_that_would_put_the_beton_elsewhere(images, tmp_path, split):
    work = tmp_path / "work"
    work.mkdir()
    before = snapshot(tmp_path)
    res = run("convert", images, work / "dst", "--split", split, "--no-progress", cwd=work)
    _refused_and_nothing_written(tmp_path, before, res, "--split", "one name")


def test_a_run_name_that_is_a_link_out_of_runs_dir_is_refused(tmp_path):
    """``runs/evil -> ../outside``: the name is one component, but the folder it names is elsewhere."""
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    runs.mkdir()
    outside.mkdir()
    (runs / "evil").symlink_to(outside)
    before = snapshot(tmp_path)
    res = run("fit", "--recipe", TINY, f"--runs_dir={runs}", "--name=evil", cwd=tmp_path)
    assert_one_line_error(res, 2, "--name 'evil'", "leads outside")
    assert snapshot(tmp_path) == before and not any(outside.iterdir())


# ------------------------------------------------------------------------------------------------ the resolver
@pytest.mark.parametrize("name", ["", " ", ".", "..", "..x", "../x", "/abs", "a/b", "a\\b", "a\0b", "a\nb", "-x",
                                  None, 3])
def test_child_path_refuses_anything_but_one_folder_name(tmp_path, name):
    with pytest.raises(ConfigError) as e:
        child_path(tmp_path, name, "--opt")
    assert str(e.value).startswith("--opt ") and "\n" not in str(e.value)
    assert not any(tmp_path.iterdir())


def test_child_path_accepts_plain_names_and_links_that_stay_inside(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    for ok in ("exp-a", "impulse-s0", "a.b", "a..b", "alias", "not-yet"):
        assert child_path(tmp_path, ok, "--name") == tmp_path / ok
        assert check_child_name(ok, "--name") == ok


# ------------------------------------------------------------------------------------------------ outputs
@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """One training step of the tiny recipe: its checkpoint."""
    runs = tmp_path_factory.mktemp("runs")
    res = run("fit", "--recipe", TINY, f"--runs_dir={runs}", "--name=one", "--trainer.max_steps=1",
              "--trainer.max_epochs=1", cwd=runs, timeout=600)
    assert res.rc == 0, res.err[-3000:]
    found = sorted((runs / "one" / "checkpoints").glob("*.ckpt"))
    assert found, list((runs / "one").rglob("*"))
    return found[-1]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Six small RGB images in two class folders (an ImageFolder tree)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def test_export_state_dict_never_replaces_an_existing_file_without_overwrite(ckpt, tmp_path):
    target = tmp_path / "model.pth"
    target.write_bytes(b"my own weights")
    before = snapshot(tmp_path)
    res = run("export", ckpt, target, cwd=tmp_path)
    assert_one_line_error(res, 2, str(target), "already exists", "--overwrite")
    assert snapshot(tmp_path) == before
    res = run("export", ckpt, target, "--overwrite", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert target.read_bytes() != b"my own weights" and sorted(p.name for p in tmp_path.iterdir()) == ["model.pth"]


def test_export_folder_keeps_a_users_folder_even_with_overwrite_and_a_file_there_is_one_line(ckpt, tmp_path):
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (tmp_path / "afile").write_text("a file")
    before = snapshot(tmp_path)
    for extra in ([], ["--overwrite"]):
        res = run("export", ckpt, mine, *extra, cwd=tmp_path)
        assert_one_line_error(res, 2, str(mine), "not empty")
    res = run("export", ckpt, tmp_path / "afile", cwd=tmp_path)  # a file where the folder goes
    assert_one_line_error(res, 2, "afile", "existing file")
    assert snapshot(tmp_path) == before


def test_predict_never_replaces_an_existing_csv_without_overwrite(ckpt, images, tmp_path):
    out = tmp_path / "predictions.csv"
    out.write_text("my own table\n")
    before = snapshot(tmp_path)
    res = run("predict", ckpt, images, "--out", out, cwd=tmp_path)
    assert_one_line_error(res, 2, str(out), "--overwrite")
    res = run("predict", ckpt, images, "--out", tmp_path, cwd=tmp_path)  # a folder where the CSV goes
    assert_one_line_error(res, 2, str(tmp_path), "folder")
    assert snapshot(tmp_path) == before
    res = run("predict", ckpt, images, "--out", out, "--overwrite", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert out.read_text().startswith("path,class_1,prob_1") and sorted(os.listdir(tmp_path)) == [out.name]


def test_data_preview_never_replaces_existing_files_and_a_file_out_is_one_line(tmp_path):
    out = tmp_path / "preview"
    out.mkdir()
    (out / "val.png").write_bytes(b"not a preview")
    (tmp_path / "afile").write_text("a file")
    before = snapshot(tmp_path)
    res = run("data", "preview", "--recipe", TINY, "--split", "val", "--num", "4", "--out", out, cwd=tmp_path)
    assert_one_line_error(res, 2, str(out / "val.png"), "--overwrite")
    res = run("data", "preview", "--recipe", TINY, "--split", "val", "--num", "4", "--out", tmp_path / "afile",
              cwd=tmp_path)
    assert_one_line_error(res, 2, "afile", "existing file")
    assert snapshot(tmp_path) == before
    res = run("data", "preview", "--recipe", TINY, "--split", "val", "--num", "4", "--out", out, "--overwrite",
              cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert (out / "val.png").read_bytes()[:4] == b"\x89PNG" and sorted(os.listdir(out)) == ["val.png", "val.pt"]


def test_convert_replaces_only_its_own_outputs_without_overwrite(images, tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    beton = dst / "train.beton"
    beton.write_bytes(b"someone else's file")
    (tmp_path / "afile").write_text("a file")
    before = snapshot(tmp_path)
    args = ("convert", images, dst, "--split", "train", "--no-progress", "--workers", "1")
    res = run(*args, cwd=tmp_path)
    assert_one_line_error(res, 2, str(beton), "--overwrite")
    res = run("convert", images, tmp_path / "afile", "--split", "train", "--no-progress", cwd=tmp_path)
    assert_one_line_error(res, 2, "afile", "existing file")
    assert snapshot(tmp_path) == before
    res = run(*args, "--overwrite", cwd=tmp_path)
    assert res.rc == 0, res.err[-3000:]
    assert beton.read_bytes() != b"someone else's file" and (dst / "train.manifest.json").is_file()
    ours = snapshot(dst)
    res = run(*args, cwd=tmp_path)  # its own up-to-date output: skipped, no --overwrite needed
    assert res.rc == 0 and "up to date" in res.out + res.err, res.err[-3000:]
    assert snapshot(dst) == ours


def test_download_into_a_file_is_one_line_before_any_download(tmp_path):
    (tmp_path / "afile").write_text("a file")
    before = snapshot(tmp_path)
    for root in (tmp_path / "afile", tmp_path / "afile" / "cifar"):
        res = run("download", "cifar10", root, cwd=tmp_path)
        assert_one_line_error(res, 2, "afile", "ROOT")
    assert snapshot(tmp_path) == before


def test_claim_output_policy(tmp_path):
    """The policy itself: free paths, files (only with overwrite), folders (empty, ours with overwrite, never a
    user's), and kinds that do not match (never, even with overwrite)."""
    f, d, e = tmp_path / "f.txt", tmp_path / "d", tmp_path / "e"
    f.write_text("x")
    (d / "sub").mkdir(parents=True)
    e.mkdir()
    assert claim_output(tmp_path / "new", False, "file") is False
    assert claim_output(tmp_path / "new", False, "folder") is False
    assert claim_output(f, True, "file") is True
    assert claim_output(e, False, "folder") is True and claim_output(d, False, "into") is True
    assert claim_output(d, True, "folder", replaceable=lambda p: True) is True
    for args in [(f, False, "file"), (f, True, "folder"), (f, True, "into"), (d, True, "file"), (d, True, "folder"),
                 (d, False, "folder", "out", lambda p: True), (f / "x", True, "file")]:
        with pytest.raises(ConfigError) as err:
            claim_output(*args)
        assert "\n" not in str(err.value)
    assert f.read_text() == "x" and (d / "sub").is_dir()
