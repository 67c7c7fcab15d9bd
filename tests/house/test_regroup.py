"""The regroup of the package into layer folders (issue #34) changed no stored name users rely on: where impulsevit
reads names a file stored (``old_module_paths``: the CLI's parse of recipes / ``config.yaml`` ``class_path`` strings, a
trusted checkpoint's unpickling) every old module path is an alias of the very same module, with a warning naming the
removal version; elsewhere it is not importable and ``import impulsevit`` installs no import hook; a run directory
written by the code of before the move (``tests/fixtures/pre_regroup/``) resumes and exports with the code of
today."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from _cli_helpers import REPO, run_cli, subprocess_env

from impulsevit._aliases import MOVED, REMOVED_IN, old_module_paths

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pre_regroup"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_module_path_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)  # a test before may have imported it already: see the warning once more
    with pytest.raises(ModuleNotFoundError):  # outside the places that read stored names: gone
        importlib.import_module(old)
    with warnings.catch_warnings(record=True) as caught, old_module_paths():
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is new and sys.modules[old] is new and module.__name__ == MOVED[old]
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == [
        f"{old} moved to {MOVED[old]}; write {MOVED[old]} (the old path is read from recipes, config.yaml class_path "
        f"strings and checkpoints until impulsevit {REMOVED_IN}, which removes it)"]
    sys.modules.pop(old, None)
    parent, _, leaf = old.rpartition(".")
    assert getattr(sys.modules[parent], leaf) is new


def test_import_impulsevit_installs_no_import_hook():
    code = ("import sys; import impulsevit, impulsevit.training.module; "
            "assert not [f for f in sys.meta_path if 'impulsevit' in type(f).__module__], sys.meta_path; "
            "import impulsevit.module")
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1 and "No module named 'impulsevit.module'" in proc.stderr, proc.stderr


def test_the_changelog_states_that_plain_imports_of_the_old_paths_are_gone():
    """What the test above checks is what the CHANGELOG tells users: the unreleased section says plain Python imports
    of the old paths fail (a break against 0.1.0, which had them), and the 0.1.0 entry no longer promises that they
    stay importable until the removal."""
    text = (REPO / "CHANGELOG.md").read_text()
    unreleased, released = text.split("## [0.1.0]", 1)
    changed = unreleased.split("### Changed", 1)[1].split("\n### ", 1)[0]
    assert "`from impulsevit.module import ImageClassifier` or `import impulsevit.module` is `ModuleNotFoundError`" in \
        " ".join(changed.split()), changed
    assert f"until {REMOVED_IN}" in changed
    assert "stay importable" not in released and "in 0.1.0 only" in released


def test_the_aliases_end_with_the_outermost_block():
    with old_module_paths():
        with old_module_paths():
            pass
        assert any(type(f).__name__ == "_AliasFinder" for f in sys.meta_path)
    assert not any(type(f).__name__ == "_AliasFinder" for f in sys.meta_path)


def test_old_names_import_the_same_objects():
    with warnings.catch_warnings(), old_module_paths():
        warnings.simplefilter("ignore", DeprecationWarning)
        from impulsevit.config import OptimizerConfig
        from impulsevit.module import ImageClassifier
        from impulsevit.strategies import BF16DDPStrategy

    import impulsevit
    from impulsevit.training import config, module, strategies

    assert ImageClassifier is module.ImageClassifier is impulsevit.ImageClassifier
    assert OptimizerConfig is config.OptimizerConfig and BF16DDPStrategy is strategies.BF16DDPStrategy


def test_an_old_class_path_resolves_in_jsonargparse():
    """A ``class_path`` of an old config (a LightningModule, as a subclass-mode CLI or a user's own parser holds it)
    resolves to today's class."""
    import lightning as L
    from jsonargparse import ArgumentParser

    from impulsevit.training.module import ImageClassifier

    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningModule, "model")
    with warnings.catch_warnings(), old_module_paths():
        warnings.simplefilter("ignore", DeprecationWarning)
        cfg = parser.parse_args(['--model={"class_path": "impulsevit.module.ImageClassifier", '
                                 '"init_args": {"backbone": "vit_tiny_patch16_224"}}'])
        init = parser.instantiate_classes(cfg)
    assert type(init.model) is ImageClassifier


@pytest.mark.slow  # two CLI start-ups in subprocesses: ~30-60 s on 2 busy cores
def test_an_old_class_path_resolves_through_the_command_line():
    """``impulsevit fit`` (a real subprocess) given a trainer strategy by its old ``class_path`` imports the class
    (its ``init_args`` come from the class's signature, which a path that imports nothing does not get)."""
    def print_config(class_path: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "impulsevit.cli", "fit", "--recipe", "tiny_synthetic",
                               f'--trainer.strategy={{"class_path": "{class_path}"}}', "--print_config"],
                              cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)

    proc = print_config("impulsevit.strategies.BF16DDPStrategy")
    assert proc.returncode == 0, proc.stderr
    resolved = "BF16DDPStrategy\n    init_args:\n      accelerator: null"
    assert f"class_path: impulsevit.strategies.{resolved}" in proc.stdout
    assert resolved not in print_config("impulsevit.nowhere.BF16DDPStrategy").stdout  # not imported: no init_args


@pytest.fixture
def old_run(tmp_path):
    run = tmp_path / "runs" / "pre_regroup"
    shutil.copytree(FIXTURE, run)
    (run / "README.md").unlink()
    return run


def test_a_checkpoint_of_before_the_regroup_resumes_and_exports(old_run, tmp_path):
    """The run written by the old code (one epoch, 2 steps) continues for one more epoch from its own ``config.yaml``,
    and its checkpoint exports to a timm folder."""
    before = torch.load(old_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert before["global_step"] == 2
    cli = run_cli("fit", "--config", str(old_run / "config.yaml"), f"--runs_dir={old_run.parent}",
                  "--name=pre_regroup", "--resume=auto", "--trainer.max_epochs=2")
    assert cli.trainer.ckpt_path == str(old_run / "checkpoints" / "last.ckpt")
    assert cli.trainer.global_step == 4
    after = torch.load(old_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert after["global_step"] == 4
    assert not all(torch.equal(after["state_dict"][k], before["state_dict"][k]) for k in before["state_dict"])

    from impulsevit.cli.entry import main

    out = tmp_path / "export"
    assert main(["export", str(FIXTURE / "checkpoints" / "last.ckpt"), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["num_classes"] == 4 and config["impulsevit"]["global_step"] == 2
    assert (out / "model.safetensors").is_file()
