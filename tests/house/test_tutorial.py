"""docs/tutorial.ipynb executes from top to bottom in a real Jupyter kernel (nbclient + ipykernel), and the copy in
the repository carries the outputs the docs site renders (the site never executes it: docs/conf.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a kernel start, imports and 2 × 200 training steps of a tiny ViT: ~20-40 s

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"


def test_the_stored_notebook_has_its_outputs() -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code), (
        "docs/tutorial.ipynb has unexecuted cells: refresh it with `jupyter execute --inplace docs/tutorial.ipynb`")
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in code for o in c.outputs), "the stored notebook has no figure"


def test_the_tutorial_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one intra-op thread: two threads on a busy 2-core box ran 6x slower
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # raises CellExecutionError naming the cell and its traceback; the notebook asserts its own claims
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                            ).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "init=impulse" in printed and "held-out top-1" in printed
