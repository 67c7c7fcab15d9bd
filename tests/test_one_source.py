"""One source per value (issue 26): the data's ``image_size`` is the model's input size (linked, never declared twice),
``model.init.method`` is checked once before any class is built, and the training loader's position is restored by
Lightning's fit loop from the checkpoint (``loops.fit_loop.state_dict.combined_loader``)."""

from __future__ import annotations

import json
from pathlib import Path

from _cli_helpers import tiny

from impulsevit.cli import main


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("impulsevit fit: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------------------------------- init.method
def test_unknown_init_method_is_the_error_even_when_the_data_root_does_not_exist(tmp_path: Path, capsys) -> None:
    """The datamodule's constructor refuses a missing root; the method is checked before it, in one line."""
    data = {"class_path": "impulsevit.data.ImageDataModule",
            "init_args": {"dataset": "imagefolder", "root": str(tmp_path / "no_such_root"), "image_size": 32,
                          "batch_size": 4, "cache_dir": str(tmp_path / "cache")}}
    assert main(tiny(tmp_path / "runs", "bad", "--model.init.method=impluse", f"--data={json.dumps(data)}")) == 2
    line = _error_line(capsys)
    assert "model.init.method" in line and "'impluse'" in line and "impulse, mimetic" in line, line
    assert "no_such_root" not in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_init_method_is_resolved_once(tmp_path: Path, monkeypatch) -> None:
    """``impulsevit fit`` resolves ``model.init.method`` exactly twice in one process: the CLI's check before any class
    is built and ``ImageClassifier``'s (the Python API's) — never again in preflight, the meta-device dry run, the
    Initializer callback or the init dispatch."""
    import impulsevit.init as ii
    import impulsevit.init.plugins as plugins

    calls: list[str] = []
    real = plugins.resolve_method

    def counting(method, options=None):  # noqa: ANN001, ANN202
        calls.append(method)
        return real(method, options)

    monkeypatch.setattr(plugins, "resolve_method", counting)
    monkeypatch.setattr(ii, "resolve_method", counting)
    assert main(tiny(tmp_path, "once", "--trainer.max_steps=1", "--trainer.limit_val_batches=0")) == 0
    assert calls == ["impulse", "impulse"]


# ------------------------------------------------------------------------------------------------------ image_size
