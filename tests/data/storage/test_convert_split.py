"""The conversion library and its command line are separate modules: ``impulsevit.data.storage.convert`` (what the
datamodule
imports) loads without argparse or Lightning, ``impulsevit.data.storage.convert_cli`` is the ``impulsevit convert``
front end
(also ``python -m impulsevit.data.storage.convert_cli``; the library does not import it back); and the scan's worker
pool gives what the in-process scan
gives, without leaving the source in a module global of the parent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _cli_helpers import subprocess_env
from _image_files import save_jpeg

from impulsevit.data.sources.image_source import image_folder_source
from impulsevit.data.storage import convert

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)


def test_the_library_imports_no_command_line_machinery():
    """In a fresh interpreter: the library pulls in neither argparse nor the front end nor Lightning; the front end
    does not pull in Lightning either."""
    code = ("import sys, impulsevit.data.storage.convert as c; "
            "bad = [m for m in ('argparse', 'impulsevit.data.storage.convert_cli', 'lightning') if m in sys.modules]; "
            "assert not bad, bad; import impulsevit.data.storage.convert_cli; "
            "assert 'argparse' in sys.modules and 'lightning' not in sys.modules; print(sorted(c.PRESETS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env())
    assert out.returncode == 0, out.stderr
    assert "short256" in out.stdout


def test_the_module_entry_point_runs_the_command(tmp_path):
    for module in ("impulsevit.data.storage.convert_cli",):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                             env=subprocess_env())
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("usage: impulsevit convert") and "--preset" in out.stdout, module
        bad = subprocess.run([sys.executable, "-m", module, str(tmp_path / "nope"), str(tmp_path / "o")],
                             capture_output=True, text=True, env=subprocess_env())
        assert bad.returncode == 2 and "neither an existing folder nor a registry dataset" in bad.stderr, module


def test_pool_scan_equals_in_process_scan_and_leaves_no_global(tmp_path):
    """> 256 files with 2 workers (the forked pool) vs 1 (this process): same good indices, problems, sizes and
    checksum; the parent's module global stays unset either way."""
    for i in range(300):
        save_jpeg(tmp_path / "src" / f"c{i % 3}" / f"{i:03d}.jpg", h=6 + i % 5, w=7, seed=i)
    good = (tmp_path / "src" / "c0" / "000.jpg").read_bytes()
    (tmp_path / "src" / "c1" / "cut.jpg").write_bytes(good[: len(good) // 2])
    source = image_folder_source(tmp_path / "src")
    assert len(source) == 301
    serial = convert.scan_source(source, workers=1, progress=False)
    assert convert._WORKER_SOURCE is None
    pooled = convert.scan_source(source, workers=2, progress=False)
    assert convert._WORKER_SOURCE is None
    assert serial.checksum == pooled.checksum
    np.testing.assert_array_equal(serial.good, pooled.good)
    np.testing.assert_array_equal(serial.sizes, pooled.sizes)
    assert [str(p) for p in serial.problems] == [str(p) for p in pooled.problems]
    assert [Path(p.path).name for p in serial.problems] == ["cut.jpg"] and len(serial.good) == 300
    assert sorted({tuple(s) for s in serial.sizes[serial.good].tolist()}) == [(7, h) for h in range(6, 11)]
