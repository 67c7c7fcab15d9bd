"""The conversion library and its command line are separate modules: ``impulsevit.data.convert`` (what the datamodule
imports) loads without argparse or Lightning, ``impulsevit.data.convert_cli`` is the ``impulsevit convert`` front end
(also behind the old ``python -m impulsevit.data.convert``)."""

from __future__ import annotations

import subprocess
import sys

from _cli_helpers import subprocess_env


def test_the_library_imports_no_command_line_machinery():
    """In a fresh interpreter: the library pulls in neither argparse nor the front end nor Lightning; the front end
    does not pull in Lightning either."""
    code = ("import sys, impulsevit.data.convert as c; "
            "bad = [m for m in ('argparse', 'impulsevit.data.convert_cli', 'lightning') if m in sys.modules]; "
            "assert not bad, bad; import impulsevit.data.convert_cli; "
            "assert 'argparse' in sys.modules and 'lightning' not in sys.modules; print(sorted(c.PRESETS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env())
    assert out.returncode == 0, out.stderr
    assert "short256" in out.stdout


def test_both_module_entry_points_run_the_command(tmp_path):
    for module in ("impulsevit.data.convert_cli", "impulsevit.data.convert"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                             env=subprocess_env())
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("usage: impulsevit convert") and "--preset" in out.stdout, module
        bad = subprocess.run([sys.executable, "-m", module, str(tmp_path / "nope"), str(tmp_path / "o")],
                             capture_output=True, text=True, env=subprocess_env())
        assert bad.returncode == 2 and "neither an existing folder nor a registry dataset" in bad.stderr, module
