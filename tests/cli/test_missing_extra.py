"""A missing optional dependency is one line naming the extra to install, at the process's error boundary
(impulsevit.cli.errors.user_error) and where the command line parser cannot import a class path — never the parser's
symptom (``key 'data': value ... is not valid``). The optional packages are made unimportable for the test with a
``sys.meta_path`` finder (as on a machine without them)."""

from __future__ import annotations

import importlib.abc
import sys

import pytest

from impulsevit.cli.entry import main
from impulsevit.cli.errors import user_error
from impulsevit.cli.parser import import_failure
from impulsevit.errors import ConfigError, missing_extra


class _Without(importlib.abc.MetaPathFinder):
    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def without(monkeypatch):
    def block(*names: str) -> None:
        for mod in [m for m in sys.modules if m.split(".")[0] in names]:
            monkeypatch.delitem(sys.modules, mod)
        monkeypatch.setattr(sys, "meta_path", [_Without(*names), *sys.meta_path])
    return block


@pytest.mark.parametrize("module, extra", [("numba.core", "ffcv"), ("llvmlite", "ffcv"), ("ffcv.loader", "ffcv"),
                                           ("cv2", "ffcv"), ("wandb", "wandb"), ("mlflow.tracking", "mlflow")])
def test_the_boundary_names_the_extra_of_a_missing_optional_module(module, extra):
    try:
        try:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        except ModuleNotFoundError as e:
            raise RuntimeError("while building the loader") from e
    except RuntimeError as wrapped:
        found = user_error(wrapped)
    assert found is not None
    message, status = found
    assert status == 2 and f"pip install 'impulsevit[{extra}]'" in message and "\n" not in message


def test_a_missing_required_or_own_module_stays_a_bug():
    assert missing_extra("timm") is None and missing_extra("my_plugin") is None
    assert user_error(ModuleNotFoundError("No module named 'timm'", name="timm")) is None


def test_the_parser_reports_the_missing_module_not_the_invalid_value():
    message = ("Parser key \"data\":\n  Does not validate against any of the Union subtypes\n  Errors:\n"
               "    - Problem with given class_path 'impulsevit.data.ImageDataModule':\n"
               "        No module named 'llvmlite'\n    - Expected a <class 'NoneType'>\n")
    assert import_failure(message) == missing_extra("llvmlite", needed_for="impulsevit.data.ImageDataModule")
    own = message.replace("'llvmlite'", "'my_lab'")
    assert import_failure(own) == "key 'data': class_path 'impulsevit.data.ImageDataModule' cannot be imported: " \
                                  "no module named 'my_lab'"
    assert import_failure("Parser key \"data\": Expected a <class 'int'>") is None


def test_convert_without_ffcv_is_one_line(tmp_path, without, capsys):
    """``impulsevit convert`` imports FFCV only when it writes: without it, one line naming the extra, exit 2."""
    without("ffcv", "numba", "llvmlite")
    assert main(["convert", "digits", str(tmp_path / "d.beton")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "impulsevit convert: error: " + missing_extra("ffcv") and "Traceback" not in "\n".join(err)


def test_backend_ffcv_without_ffcv_is_refused_and_auto_falls_back(without, caplog):
    from impulsevit.data import ImageDataModule

    without("ffcv", "numba", "llvmlite")
    kw = {"dataset": "digits", "image_size": 8, "num_workers": 0}
    with pytest.raises(ConfigError, match=r"pip install 'impulsevit\[ffcv\]'; or pass --data.init_args.backend"):
        ImageDataModule(backend="ffcv", **kw)
    with pytest.raises(ConfigError, match="resample_on='device'"):
        ImageDataModule(backend="auto", resample_on="device", **kw)
    with caplog.at_level("INFO", logger="impulsevit"):
        dm = ImageDataModule(backend="auto", **kw)
    assert dm.backend == "torchvision" and dm.hparams["backend"] == "torchvision"
    assert [r.getMessage() for r in caplog.records if "FFCV is not installed" in r.getMessage()]
