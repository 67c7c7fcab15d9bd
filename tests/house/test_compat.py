"""The private uses of Lightning / torch / timm / FFCV / LightningCLI-jsonargparse live only in ``impulsevit/_compat/``
(found by AST, :mod:`_private_uses`), each compat entry still does what it says on the installed library, and
setup.cfg's comment and docs/design.md list exactly what is there."""

from __future__ import annotations

import argparse
import ast
import configparser
import importlib
import inspect
import json
import re
import signal
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from impulsevit._compat import CHECKED_ON
from impulsevit._compat import checkpoint as compat_checkpoint
from impulsevit._compat import cli as compat_cli
from impulsevit._compat import lightning as compat_lightning
from impulsevit._compat import timm as compat_timm
from impulsevit._compat import torch as compat_torch

REPO = Path(__file__).resolve().parents[2]
COMPAT_DIR = REPO / "impulsevit" / "_compat"
COMPAT_MODULES = sorted(p.stem for p in COMPAT_DIR.glob("*.py") if p.stem != "__init__")


_SAMPLE = '''
import os
from collections import namedtuple
from unittest import mock

import torch.nn as nn
import torch.nn.init as tinit
from torch.nn.init import _calculate_fan_in_and_fan_out

_OWN = 1


class Mine:
    def __init__(self):
        self._count = 0

    def _bump(self):
        self._count += 1
        return os._exit, namedtuple("P", "a")(1)._replace(a=2)


class Net(nn.Module):
    def hook(self):
        return self._forward_hooks

    def _apply(self, fn, recurse=True):
        return super()._apply(fn, recurse)


def factory():
    from torch.nn import Module

    class Local(Module):
        def _apply(self, fn, recurse=True):
            return fn

    return Local


def use(x, m):
    x._count, m._bump(), nn.modules.batchnorm._NormBase, getattr(x, "_not_ours")
    with mock.patch.object(tinit, "calculate_gain", None), mock.patch("torch.nn.init.trunc_normal_"):
        pass
'''


@pytest.fixture(scope="module")
def enumerated(tmp_path_factory) -> dict[str, list[str]]:  # noqa: ANN001
    """:func:`_private_uses.private_uses` of impulsevit (``"impulsevit"``) and of a sample package with one private
    use of each kind next to allowed names (``"sample"``; its ``_compat/`` holds one more), in one fresh interpreter
    (CPython 3.11's ``ast`` can fail with a recursion-depth mismatch late in a long test session; see
    tests/house/test_layers.py)."""
    pkg = tmp_path_factory.mktemp("sample") / "samplepkg"
    (pkg / "_compat").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(_SAMPLE)
    (pkg / "_compat" / "__init__.py").write_text("")
    (pkg / "_compat" / "torch.py").write_text("import torch\nX = torch._foreach_norm\n")
    code = ("import json, sys; from pathlib import Path; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "from _private_uses import private_uses; "
            "print(json.dumps({'impulsevit': private_uses(), 'sample': private_uses(Path(sys.argv[3]))}))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "tests"), str(pkg.parent), str(pkg)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# ----------------------------------------------------------------------------------------- where private uses live
def test_private_uses_only_in_compat(enumerated):  # noqa: ANN001
    found = enumerated["impulsevit"]
    assert not found, ("private uses of a library outside impulsevit/_compat/ (move each behind a compat entry, or use "
                       "the public API):\n" + "\n".join(found))


def test_the_enumerator_finds_each_kind_of_private_use(enumerated):  # noqa: ANN001
    """Each private use of the sample package is reported, nothing else (own private names, ``os._exit``,
    namedtuple's ``_replace``), and nothing in its ``_compat/`` folder."""
    found = [line.split(": ", 1)[1] for line in enumerated["sample"]]
    expected = [
        "from torch.nn.init import _calculate_fan_in_and_fan_out",
        "Net: self._forward_hooks (not defined by Net or its impulsevit bases)",
        "Net: super()._apply (not defined by Net or its impulsevit bases)",
        "Net: defines _apply, a private member of a library base class",
        "Local: defines _apply, a private member of a library base class",
        "torch.nn.modules.batchnorm._NormBase",
        "x._not_ours (no impulsevit module defines _not_ours)",
        "mock.patch.object(torch.nn.init, 'calculate_gain')",
        "mock.patch('torch.nn.init.trunc_normal_')",
    ]
    assert sorted(found) == sorted(expected), "\n".join(found)


def test_own_names_come_from_the_package_and_are_checked_per_class():
    """The allowed private names are derived from impulsevit's AST: they include its own (``RunRecord`` keeps its
    trainer as ``_trainer``) but ``self._trainer`` in ``ImageClassifier`` would still be reported, because it is
    checked against that class and its impulsevit bases only."""
    sys.path.insert(0, str(REPO / "tests"))
    import _private_uses as pu

    modules = [pu._Module(p) for p in pu._files(REPO / "impulsevit")]
    owned = pu.own_names(modules)
    assert {"_trainer", "_value", "_attached_trainer"} <= owned
    assert "_trainer" not in pu._class_own(modules, "ImageClassifier")
    assert "_value" in pu._class_own(modules, "ImpulseCLI")
    assert not {"_get", "_run_subcommand", "_parameters", "_logger_connector"} & owned


# -------------------------------------------------------------------------------- one test per compat entry
ENTRY_TESTS = {
    "lightning.is_log_step": "callbacks/test_standard.py::test_is_log_step_follows_log_every_n_steps",
    "lightning.hand_back_signal_handlers":
        "callbacks/test_standard.py::test_lightning_still_records_the_handlers_it_restores",
    "lightning.validation_follows_batch": "house/test_compat.py::test_validation_follows_batch",
    "lightning.rerun_interrupted_validation": "house/test_compat.py::test_lightning_loop_state_layout",
    "lightning.callback_state_key": "house/test_compat.py::test_callback_state_key",
    "lightning.default_data_parallel_to_world": "house/test_compat.py::test_default_data_parallel_to_world",
    "lightning.CommHookOnAnyDeviceDDPStrategy": "house/test_compat.py::test_ddp_comm_hook_members",
    "lightning.epoch_batch_progress": "house/test_compat.py::test_epoch_batch_progress",
    "checkpoint.epochs_done": "house/test_compat.py::test_checkpoint_layout",
    "checkpoint.callback_state": "house/test_compat.py::test_checkpoint_layout",
    "checkpoint.distributed_meta_file": "house/test_compat.py::test_distributed_meta_file",
    "cli.SubcommandRunHookCLI": "house/test_compat.py::test_subcommand_run_hook",
    "cli.parser_actions": "house/test_compat.py::test_parser_actions",
    "cli.subcommand_parsers": "house/test_compat.py::test_subcommand_parsers",
    "cli.try_int_before_float": "house/test_compat.py::test_try_int_before_float",
    "torch.fan_in_and_fan_out": "house/test_compat.py::test_fan_in_and_fan_out",
    "torch.foreach_norm": "house/test_compat.py::test_foreach_norm",
    "torch.is_compiled": "house/test_compat.py::test_is_compiled",
    "torch.tensors_replaced": "house/test_compat.py::test_tensors_replaced",
    "timm.fix_timm_posterize": "house/test_compat.py::test_fix_timm_posterize",
    "timm.module_init_fn": "house/test_compat.py::test_module_init_fn",
    "timm.swin_relative_position_bias": "house/test_compat.py::test_swin_relative_position_bias",
    "timm.model_card_readme": "house/test_compat.py::test_model_card_readme",
    "timm.vit_tokens_before_blocks": "house/test_compat.py::test_vit_tokens_before_blocks",
    "ffcv.replaced_os_cache_manager": "house/test_compat.py::test_replaced_os_cache_manager",
    "ffcv.replaced_writer_worker": "house/test_compat.py::test_replaced_writer_worker",
    "ffcv.resized_crop_decoder_base": "house/test_compat.py::test_resized_crop_decoder_base",
    "litdata.sdk_chunk_downloads": "house/test_compat.py::test_sdk_chunk_downloads",
    "litdata.read_whole_set": "house/test_compat.py::test_read_whole_set",
    "litdata.quiet_prefetch_crash": "house/test_compat.py::test_quiet_prefetch_crash",
    "litdata.chunk_column": "house/test_compat.py::test_chunk_column",
    "litdata.ask_early_for_missing_chunks": "house/test_compat.py::test_ask_early_for_missing_chunks",
    "litdata.clear_stale_cache_state":
        "data/loading/test_litdata_backend.py::test_what_a_killed_reader_left_in_the_chunk_cache_is_cleared_by_the_next_first_reader",
}


def _entries() -> dict[str, object]:
    """``{"module.name": object}`` for every name in each compat module's ``__all__``."""
    out = {}
    for mod in COMPAT_MODULES:
        m = importlib.import_module(f"impulsevit._compat.{mod}")
        out |= {f"{mod}.{name}": getattr(m, name) for name in m.__all__}
    return out


def _footer(obj: object) -> dict[str, str]:
    """The ``Reaches:`` / ``Checked on:`` / ``Waits for:`` lines of an entry's docstring (continuation lines joined)."""
    doc = inspect.getdoc(obj) or ""
    out, key = {}, None
    for line in doc.splitlines():
        m = re.match(r"(Reaches|Checked on|Waits for): (.*)", line)
        if m:
            key = m.group(1)
            out[key] = m.group(2).strip()
        elif key and line.strip():
            out[key] += " " + line.strip()
        else:
            key = None
    return out


def test_every_compat_entry_has_a_test_and_a_documented_footer():
    entries = _entries()
    assert set(entries) == set(ENTRY_TESTS), "compat entries without a test (or tests of removed entries)"
    for name, ref in ENTRY_TESTS.items():
        file, test = ref.split("::")
        tree = ast.parse((REPO / "tests" / file).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == test for n in tree.body), f"{ref} (for {name})"
    table = {f"{lib}{spec}" for lib, spec in CHECKED_ON.items()}
    for name, obj in entries.items():
        footer = _footer(obj)
        assert set(footer) == {"Reaches", "Checked on", "Waits for"}, f"{name}: docstring footer {footer}"
        assert footer["Checked on"] in table, (f"{name}: 'Checked on: {footer['Checked on']}' is not a row of "
                                               f"impulsevit._compat.CHECKED_ON ({sorted(table)})")


def test_the_compat_table_admits_the_ci_pins_and_lies_inside_setup_cfgs_ranges():
    """Every library of the compat table is pinned in constraints/ci.txt to a version the table admits (CI runs
    checked versions), and setup.cfg names it with a range and no upper cap (users' newer releases are reported by
    scripts/check_pins.py, not refused by pip)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    pins = {Requirement(ln).name: Requirement(ln) for ln in
            (x.split("#")[0].strip() for x in (REPO / "constraints" / "ci.txt").read_text().splitlines()) if ln}
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    blocks = [cfg.get("options", "install_requires")] + [v for _, v in cfg.items("options.extras_require")]
    ranges = {Requirement(ln).name: Requirement(ln) for b in blocks for ln in
              (x.split("#")[0].strip() for x in b.splitlines()) if ln}
    for lib, spec in CHECKED_ON.items():
        (pinned,) = [s.version for s in pins[lib].specifier if s.operator == "=="]
        assert SpecifierSet(spec).contains(pinned), f"constraints/ci.txt pins {lib}=={pinned}, outside {spec}"
        if lib != "ffcv":  # FFCV's last release is 2023: its extra keeps the exact version
            assert not any(s.operator in ("<", "<=", "==", "~=") for s in ranges[lib].specifier), \
                f"setup.cfg caps {ranges[lib]}"


# Lightning
def test_lightning_loop_state_layout(tmp_path):
    """A real checkpoint holds the validation progress where ``rerun_interrupted_validation`` edits it, and the edit
    makes Lightning's loop restore it as an interrupted validation (restarting, from batch 0)."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_train_batches=2, limit_val_batches=2, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path)
    trainer.fit(BoringModel())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    ckpt = torch.load(tmp_path / "a.ckpt", weights_only=False)
    progress = ckpt["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
    assert {"total", "current", "is_last_batch"} <= set(progress)
    assert set(progress["total"]) == set(progress["current"]) == {"ready", "started", "processed", "completed"}
    earlier = progress["total"]["completed"] - progress["current"]["completed"]  # batches of earlier validations
    assert compat_lightning.rerun_interrupted_validation(ckpt)
    assert progress["total"] == {"ready": earlier + 1, "started": earlier + 1, "processed": earlier,
                                 "completed": earlier}
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
    from lightning.pytorch.loops.progress import _BatchProgress

    rule = ("self.batch_progress.total.processed == self.batch_progress.total.started - 1",
            "self.batch_progress.total.completed == self.batch_progress.total.processed")
    assert all(r in inspect.getsource(_EvaluationLoop) for r in rule)  # Lightning's test for "restarted mid-eval"
    bp = _BatchProgress()
    bp.load_state_dict(progress)
    assert bp.total.processed == bp.total.started - 1 and bp.total.completed == bp.total.processed
    assert not compat_lightning.rerun_interrupted_validation({"loops": {}})
    # saved in on_train_batch_end (the last batch's hooks ran, not yet counted completed; no validation started): the
    # edit completes the batch, and every validation batch counted this epoch is an earlier one
    ckpt = torch.load(tmp_path / "a.ckpt", weights_only=False)
    fit = ckpt["loops"]["fit_loop"]
    train, progress = fit["epoch_loop.batch_progress"], fit["epoch_loop.val_loop.batch_progress"]
    for part in ("total", "current"):
        train[part]["completed"] -= 1
    assert train["total"]["processed"] == train["total"]["completed"] + 1
    earlier = progress["total"]["completed"]
    assert compat_lightning.rerun_interrupted_validation(ckpt)
    assert all(train[part]["completed"] == train[part]["processed"] for part in ("total", "current"))
    assert progress["total"] == {"ready": earlier + 1, "started": earlier + 1, "processed": earlier,
                                 "completed": earlier}
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    rule = ("self.batch_progress.total.completed == self.batch_progress.total.processed - 1",  # on train batch end
            "self.batch_progress.total.completed == self.batch_progress.total.processed\n")  # on last
    assert all(r in inspect.getsource(_TrainingEpochLoop) for r in rule)


@pytest.mark.parametrize(("settings", "expected"), [
    ({}, [(0, 3), (1, 3)]),  # the last batch of every epoch
    ({"check_val_every_n_epoch": 2}, [(1, 3)]),
    ({"val_check_interval": 2}, [(0, 1), (0, 3), (1, 1), (1, 3)]),
    ({"limit_val_batches": 0}, []),
])
def test_validation_follows_batch(tmp_path, settings, expected):
    """Asked in ``on_train_batch_end``, the entry says True exactly at the batches after which Lightning then runs the
    fit's validation (2 epochs of 4 batches)."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Probe(L.Callback):
        def __init__(self) -> None:
            self.said: list[tuple[int, int]] = []
            self.validated: list[tuple[int, int]] = []
            self.last: tuple[int, int] | None = None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001, ANN201
            self.last = (trainer.current_epoch, batch_idx)
            if compat_lightning.validation_follows_batch(trainer):
                self.said.append(self.last)

        def on_validation_start(self, trainer, pl_module):  # noqa: ANN001, ANN201
            if not trainer.sanity_checking:
                self.validated.append(self.last)

    probe = Probe()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=4, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        num_sanity_val_steps=0, default_root_dir=tmp_path, callbacks=[probe],
                        **{"limit_val_batches": 2, **settings})
    trainer.fit(BoringModel())
    assert probe.said == probe.validated == expected


def test_checkpoint_layout(tmp_path):
    """A checkpoint the installed Lightning writes (a real ``Trainer``, a callback with state keyed by arguments; a
    run stopped by ``max_steps`` inside an epoch) holds the epochs done and the callbacks' states where the helpers
    read them."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Stateful(L.Callback):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        @property
        def state_key(self) -> str:
            return compat_lightning.callback_state_key(self, tag=self.tag)

        def state_dict(self) -> dict:
            return {"tag": self.tag}

    def fit(max_steps: int, name: str) -> dict:
        trainer = L.Trainer(accelerator="cpu", max_epochs=3, max_steps=max_steps, limit_train_batches=2,
                            limit_val_batches=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                            enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[Stateful("a")])
        trainer.fit(BoringModel())
        trainer.save_checkpoint(tmp_path / name)
        return torch.load(tmp_path / name, weights_only=True)

    done = fit(-1, "done.ckpt")
    assert compat_checkpoint.epochs_done(done) == 3
    assert compat_checkpoint.callback_state(done, Stateful) == {"tag": "a"}
    assert compat_checkpoint.callback_state(done, Stateful.__qualname__) == {"tag": "a"}
    assert compat_checkpoint.callback_state(done, "Other") is None
    assert compat_checkpoint.callback_state({}, Stateful) is None
    # max_steps ends training after 1 batch of epoch 1: that epoch's training counts as processed (so --resume with
    # a larger max_steps but the same max_epochs starts at epoch 2, as Lightning itself does)
    assert compat_checkpoint.epochs_done(fit(3, "mid.ckpt")) == 2
    with pytest.raises(KeyError):
        compat_checkpoint.epochs_done({"state_dict": {}})


def test_distributed_meta_file():
    """Lightning writes (and reads) the non-tensor part of a distributed checkpoint under the name the entry gives."""
    from lightning.fabric.utilities.load import _METADATA_FILENAME

    assert _METADATA_FILENAME == "meta.pt"
    assert compat_checkpoint.distributed_meta_file(Path("run/step=1")) == Path("run/step=1/meta.pt")


def test_epoch_batch_progress(tmp_path):
    """In a real fit, ``ready`` is the batch's index in its epoch while the batch is being moved to the device and
    ``processed`` counts the training steps that ran before ``on_train_batch_start``; both restart each epoch."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    seen: dict[str, list] = {"transfer": [], "start": []}

    class Model(BoringModel):
        def on_after_batch_transfer(self, batch, dataloader_idx):  # noqa: ANN001, ANN201
            if self.trainer.training:
                seen["transfer"].append((self.current_epoch, compat_lightning.epoch_batch_progress(self.trainer)[0]))
            return batch

        def on_train_batch_start(self, batch, batch_idx):  # noqa: ANN001, ANN201
            seen["start"].append((batch_idx, compat_lightning.epoch_batch_progress(self.trainer)[1]))

    trainer = L.Trainer(accelerator="cpu", max_epochs=2, limit_train_batches=3, limit_val_batches=0, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path)
    trainer.fit(Model())
    assert seen["transfer"] == [(e, k) for e in range(2) for k in range(3)]
    assert seen["start"] == [(k, k) for _ in range(2) for k in range(3)]


def test_callback_state_key():
    class Probe(L.Callback):
        @property
        def state_key(self) -> str:
            return compat_lightning.callback_state_key(self, method="impulse", seed=3)

    assert Probe().state_key == "test_callback_state_key.<locals>.Probe{'method': 'impulse', 'seed': 3}"


def test_default_data_parallel_to_world():
    from lightning.pytorch.strategies import ModelParallelStrategy

    assert "_data_parallel_size" in inspect.getsource(ModelParallelStrategy.setup_environment)
    cpu = torch.device("cpu")
    auto = ModelParallelStrategy()
    auto.parallel_devices, auto.num_nodes = [cpu, cpu, cpu], 2
    compat_lightning.default_data_parallel_to_world(auto)
    assert auto._data_parallel_size == 6
    given = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=3)
    given.parallel_devices = [cpu] * 3
    compat_lightning.default_data_parallel_to_world(given)
    assert given._data_parallel_size == 2


def test_ddp_comm_hook_members():
    """``DDPStrategy`` keeps the hook and its state it was given, and calls ``_register_ddp_hooks()`` (no arguments)
    when it wraps the model; the override registers the hook (exercised on 2 gloo ranks by
    tests/training/test_ddp.py)."""
    from lightning.pytorch.strategies import DDPStrategy

    def hook(state, bucket):  # noqa: ANN001, ANN202
        return None

    s = compat_lightning.CommHookOnAnyDeviceDDPStrategy(ddp_comm_hook=hook, ddp_comm_state="state")
    assert s._ddp_comm_hook is hook and s._ddp_comm_state == "state"
    assert list(inspect.signature(DDPStrategy._register_ddp_hooks).parameters) == ["self"]
    assert "self._register_ddp_hooks()" in inspect.getsource(DDPStrategy.configure_ddp)


# LightningCLI / jsonargparse
def test_subcommand_run_hook(tmp_path):
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    class CLI(compat_cli.SubcommandRunHookCLI):
        ran: list[str] = []

        def run_subcommand(self, subcommand: str) -> None:
            self.ran.append(subcommand)
            super().run_subcommand(subcommand)

    cli = CLI(BoringModel, BoringDataModule, args=["fit", "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
                                                   f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
                                                   "--trainer.enable_checkpointing=false",
                                                   "--trainer.enable_progress_bar=false"],
              save_config_callback=None)
    assert CLI.ran == ["fit"] and cli.trainer.global_step == 1  # the hook ran, and Lightning's fit through it


def test_parser_actions():
    from jsonargparse import ArgumentParser

    for cls in (argparse.ArgumentParser, ArgumentParser):
        parser = cls()
        parser.add_argument("--lr", type=float)
        assert "lr" in [a.dest for a in compat_cli.parser_actions(parser)]


def test_subcommand_parsers():
    from jsonargparse import ArgumentParser

    parser, fit = ArgumentParser(), ArgumentParser()
    assert compat_cli.subcommand_parsers(parser) == {}
    parser.add_subcommands().add_subcommand("fit", fit)
    assert compat_cli.subcommand_parsers(parser) == {"fit": fit}


def test_try_int_before_float():
    """jsonargparse tries a union's members in order (so a float-first union reads ``1`` as ``1.0``); after the entry
    the arguments named get ``int`` first, ``1.0`` / ``0.5`` stay floats, and others are left alone. On the installed
    Lightning, every ``Trainer`` argument whose type holds both ``int`` and ``float`` then reads ``1`` as an int."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch import Trainer
    from lightning.pytorch.cli import LightningArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--x", type=float | int | None)
    parser.add_argument("--other", type=float | int | None)
    parser.add_argument("--ratio", type=float)
    assert parser.parse_args(["--x=1"]).x == 1.0 and isinstance(parser.parse_args(["--x=1"]).x, float)
    assert compat_cli.try_int_before_float(parser, ["x", "ratio"]) == ["x"]
    for given, expected in (("1", 1), ("1.0", 1.0), ("0.5", 0.5), ("1e0", 1.0), ("null", None)):
        parsed = parser.parse_args([f"--x={given}", f"--other={given}"])
        assert parsed.x == expected and type(parsed.x) is type(expected), (given, parsed.x)
        assert parsed.other == expected and (given == "null" or type(parsed.other) is float)  # not named: as before
    assert type(parser.parse_args(["--ratio=1"]).ratio) is float
    assert compat_cli.try_int_before_float(parser, ["x"]) == []  # already int first

    trainer_parser = LightningArgumentParser()
    added = trainer_parser.add_lightning_class_args(Trainer, "trainer")
    compat_cli.try_int_before_float(trainer_parser, added)
    both = [name for name, p in inspect.signature(Trainer.__init__).parameters.items()
            if {int, float} <= set(typing.get_args(p.annotation))]
    assert {"limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
            "val_check_interval", "overfit_batches"} <= set(both)
    for name in both:
        value = trainer_parser.parse_args([f"--trainer.{name}=1"]).trainer[name]
        assert value == 1 and type(value) is int, (name, value)


# torch
def test_fan_in_and_fan_out():
    assert compat_torch.fan_in_and_fan_out(nn.Linear(5, 3).weight.shape) == (5, 3)
    assert compat_torch.fan_in_and_fan_out((4, 2, 3, 3)) == (18, 36)
    with pytest.raises(ValueError):
        compat_torch.fan_in_and_fan_out((7,))


def test_foreach_norm():
    ts = [torch.full((100_000,), 1000.0, dtype=torch.float16), torch.tensor([3.0, 4.0])]
    norms = compat_torch.foreach_norm(ts, dtype=torch.float32)
    assert [n.dtype for n in norms] == [torch.float32] * 2 and all(n.dim() == 0 for n in norms)
    torch.testing.assert_close(torch.stack(norms), torch.tensor([1000.0 * 100_000 ** 0.5, 5.0]),
                               rtol=1e-4, atol=0)  # beyond fp16's range


def test_is_compiled():
    m = nn.Linear(2, 2)
    assert not compat_torch.is_compiled(m)
    m.compile()  # lazy: nothing is compiled until the first call
    assert compat_torch.is_compiled(m)


def test_tensors_replaced():
    m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    m[0].weight.requires_grad_(False)
    before = {n: t for n, t in [*m.named_parameters(), *m.named_buffers()]}
    with pytest.raises(KeyError), compat_torch.tensors_replaced(m, lambda t: torch.zeros_like(t) + 7) as tmp:
        assert tmp is m
        assert all(float(t.float().mean()) == 7 for t in [*m.parameters(), *m.buffers()])
        assert isinstance(m[0].weight, nn.Parameter) and not m[0].weight.requires_grad and m[0].bias.requires_grad
        raise KeyError("restored on error too")
    assert all(t is before[n] for n, t in [*m.named_parameters(), *m.named_buffers()])


def test_public_norm_classes_cover_torchs_norm_base():
    """``init/baselines.py`` names torch's running-statistics norms by their public classes instead of the private
    ``_NormBase``: every concrete ``torch.nn`` subclass of ``_NormBase`` is one of them (the quantized ``torch.ao``
    ones are not: a model being initialized for training is not quantized)."""
    from torch.nn.modules.batchnorm import _NormBase

    from impulsevit.init.baselines import _RUNNING_STATS_NORM

    def subclasses(c: type) -> set[type]:
        return set(c.__subclasses__()).union(*(subclasses(s) for s in c.__subclasses__()))

    concrete = {c for c in subclasses(_NormBase)
                if c.__module__.startswith("torch.nn.") and not c.__name__.startswith("_")}
    assert concrete and all(issubclass(c, _RUNNING_STATS_NORM) for c in concrete), \
        sorted(c.__qualname__ for c in concrete if not issubclass(c, _RUNNING_STATS_NORM))


def test_lightning_module_trainer_raises_when_not_attached():
    """``ImageClassifier`` reads its trainer through the public ``trainer`` property, relying on it raising
    ``RuntimeError`` when the model is not attached."""
    with pytest.raises(RuntimeError, match="not attached"):
        _ = L.LightningModule().trainer


# timm
def test_module_init_fn():
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(img_size=8, patch_size=4, embed_dim=8, depth=1, num_heads=2, num_classes=3)
    fn = compat_timm.module_init_fn(model)
    assert fn is not None and len(inspect.signature(fn).parameters) == 1
    with torch.no_grad():
        model.head.weight.fill_(5.0)
    model.apply(fn)
    assert float(model.head.weight.abs().max()) < 1  # timm re-initialised it (trunc-normal, std 0.02)
    assert compat_timm.module_init_fn(nn.Linear(2, 2)) is None


def test_swin_relative_position_bias():
    from timm.models.swin_transformer import SwinTransformer

    model = SwinTransformer(img_size=16, patch_size=2, window_size=4, embed_dim=12, depths=(1,), num_heads=(3,),
                            num_classes=2)
    attn = model.layers[0].blocks[0].attn
    bias = compat_timm.swin_relative_position_bias(attn)
    assert bias.shape == (1, 3, 16, 16)
    table = attn.relative_position_bias_table  # (2·4-1)², heads: the bias is read from this table
    with torch.no_grad():
        table.fill_(0.5)
    assert torch.equal(compat_timm.swin_relative_position_bias(attn), torch.full((1, 3, 16, 16), 0.5))


def test_vit_tokens_before_blocks():
    """The tokens before the blocks: with the blocks and the final norm taken out, ``forward_features`` gives them."""
    import timm

    m = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=0, reg_tokens=2).eval()
    x = torch.randn(2, 3, 32, 32)
    tokens = compat_timm.vit_tokens_before_blocks(m, x)
    assert tokens.shape == (2, 1 + 2 + 16, m.embed_dim)
    m.blocks, m.norm = torch.nn.Identity(), torch.nn.Identity()
    torch.testing.assert_close(tokens, m.forward_features(x))


def test_model_card_readme():
    text = compat_timm.model_card_readme({"description": "A tiny test model.", "details": {"Params (M)": 1.0}},
                                         "tiny-model")
    assert isinstance(text, str) and "A tiny test model." in text and "tiny-model" in text


# FFCV
def test_replaced_writer_worker():
    fw = pytest.importorskip("ffcv.writer")
    src = inspect.getsource(fw.DatasetWriter.from_indexed_dataset) + inspect.getsource(fw.DatasetWriter)
    assert "worker_job_indexed_dataset" in src and "sleep(" in src  # looked up as module globals at call time
    original, sleep = fw.worker_job_indexed_dataset, fw.sleep

    def worker(*args):  # noqa: ANN002, ANN202
        return None

    with compat_ffcv().replaced_writer_worker(worker, print):
        assert fw.worker_job_indexed_dataset is worker and fw.sleep is print
    assert fw.worker_job_indexed_dataset is original and fw.sleep is sleep


def test_replaced_os_cache_manager():
    """``Loader`` looks its OS-cache manager up as a module global; inside the block that is the subclass, whose
    reader returns a sample's bytes from a read-only map and which leaves numba's ``uint8[::1]`` writable."""
    import numba
    import numpy as np

    fl = pytest.importorskip("ffcv.loader.loader")
    from ffcv.memory_managers.os_cache import OSCacheManager

    assert "OSCacheManager(self.reader)" in inspect.getsource(fl.Loader.__init__)
    with compat_ffcv().replaced_os_cache_manager():
        manager = fl.OSCacheManager
        assert issubclass(manager, OSCacheManager) and manager is not OSCacheManager
        read = manager.compile_reader(object.__new__(manager))
    assert fl.OSCacheManager is OSCacheManager
    data = np.arange(10, dtype=np.uint8)
    data.setflags(write=False)
    ptrs, sizes = np.array([0, 4], dtype=np.uint64), np.array([4, 6], dtype=np.uint64)
    np.testing.assert_array_equal(read(np.uint64(4), (data, ptrs, sizes)), np.arange(4, 10))
    assert numba.uint8[::1].mutable


def test_resized_crop_decoder_base():
    """The memory plan and metadata a replaced ``generate_code`` relies on (see the entry's docstring)."""
    import numpy as np

    pytest.importorskip("ffcv")
    from ffcv.fields.rgb_image import IMAGE_MODES, RGBImageField
    from ffcv.pipeline.compiler import Compiler
    from ffcv.pipeline.state import State

    base = compat_ffcv().resized_crop_decoder_base()

    class Decoder(base):
        def generate_code(self):  # noqa: ANN202
            return None

    dec = Decoder((8, 8))
    assert dec.get_crop_generator is None
    metadata = np.zeros(2, dtype=RGBImageField().metadata_type)
    assert {"mode", "width", "height", "data_ptr"} <= set(metadata.dtype.names)
    metadata["width"], metadata["height"] = (10, 20), (30, 5)
    dec.accept_globals(metadata, "reader")
    assert dec.memory_read == "reader"
    state, (out, temp) = dec.declare_state_and_memory(State(jit_mode=False, device=torch.device("cpu"),
                                                             shape=(), dtype=np.uint8))
    assert tuple(out.shape) == (8, 8, 3) and tuple(temp.shape) == (30 * 20 * 3,)
    assert set(IMAGE_MODES) == {"jpg", "raw"} and callable(Compiler.get_iterator)


def test_sdk_chunk_downloads(monkeypatch):
    downloader = pytest.importorskip("litdata.streaming.downloader")
    monkeypatch.setattr(downloader, "_OBSTORE_AVAILABLE", downloader._OBSTORE_AVAILABLE)  # restored afterwards
    importlib.import_module("impulsevit._compat.litdata").sdk_chunk_downloads()
    assert not downloader.obstore_usable()  # LitData's own test of whether a chunk goes through obstore


def test_read_whole_set(tmp_path, monkeypatch):
    """Under a process group of 2 (LitData's own detection, as a DDP rank sees it), a StreamingDataset indexes the
    rank's half; after ``read_whole_set`` every global index reads its own sample."""
    env = pytest.importorskip("litdata.utilities.env")
    import numpy as np
    from litdata import StreamingDataset

    from impulsevit.data.sources.image_source import ArraySource
    from impulsevit.data.storage.presets import PRESETS
    from impulsevit.data.storage.shards import decode_image, write_shards

    images = np.arange(12, dtype=np.uint8).repeat(8 * 8 * 3).reshape(12, 8, 8, 3)  # image i is all i
    write_shards(ArraySource(images, np.arange(12) % 2, ["a", "b"], "arrays"), str(tmp_path / "set"), PRESETS["raw"],
                 progress=False, log=lambda _: None, chunk_bytes=4096)
    monkeypatch.setattr(env._DistributedEnv, "detect", classmethod(lambda cls: cls(world_size=2, global_rank=1,
                                                                                      num_nodes=1)))
    shared = StreamingDataset(str(tmp_path / "set"))
    assert len(shared) == 6 and shared[11:12] == []  # LitData's view: this rank's half; a global index past it: none
    whole = StreamingDataset(str(tmp_path / "set"))
    importlib.import_module("impulsevit._compat.litdata").read_whole_set(whole)
    assert len(whole) == 12
    assert [int(decode_image(whole[j:j + 1][0]["image"])[0, 0, 0]) for j in range(12)] == list(range(12))


def test_chunk_column(tmp_path):
    """A chunk file written by LitData holds its items' ``image`` bytes in a trailing Arrow column, row ``k`` = the
    chunk's item ``k`` (what ``StreamingDataset`` reads); bytes without such a footer give None."""
    import mmap

    import numpy as np
    from litdata import StreamingDataset

    from impulsevit.data.sources.image_source import ArraySource
    from impulsevit.data.storage.presets import PRESETS
    from impulsevit.data.storage.shards import write_shards

    images = np.arange(6, dtype=np.uint8).repeat(8 * 8 * 3).reshape(6, 8, 8, 3)
    write_shards(ArraySource(images, np.arange(6) % 2, ["a", "b"], "arrays"), str(tmp_path / "set"), PRESETS["raw"],
                 progress=False, log=lambda _: None)
    (chunk,) = sorted((tmp_path / "set").glob("chunk-*.bin"))
    with open(chunk, "rb") as f:
        view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    column = importlib.import_module("impulsevit._compat.litdata").chunk_column(view, "image")
    (first, offsets, values), = column
    items = StreamingDataset(str(tmp_path / "set"))
    assert first == 0 and [bytes(values[offsets[k]:offsets[k + 1]]) for k in range(6)] == \
        [items[k:k + 1][0]["image"] for k in range(6)]
    assert importlib.import_module("impulsevit._compat.litdata").chunk_column(memoryview(b"\0" * 64), "image") is None


def test_quiet_prefetch_crash(monkeypatch, capfd):
    """LitData's chunk-download thread, dying on a store it cannot reach, prints its traceback on stderr; after
    ``quiet_prefetch_crash`` it prints nothing and still hands the exception to the reader (``prefetch_error``)."""
    reader = pytest.importorskip("litdata.streaming.reader")
    monkeypatch.delenv("IMPULSEVIT_DEBUG", raising=False)
    cls = reader.PrepareChunksThread  # LitData's own report, even after another test of this process quietened it
    monkeypatch.setattr(cls, "_report_crash", getattr(cls, "_impulsevit_loud", cls._report_crash))
    monkeypatch.setattr(cls, "_impulsevit_quiet", False, raising=False)
    thread = object.__new__(reader.PrepareChunksThread)  # only the crash report's attributes
    thread._rank, thread._worker_env = 0, type("W", (), {"rank": 0})()
    thread._error = None
    thread._run_loop = lambda: (_ for _ in ()).throw(ConnectionError("store gone"))
    thread._run_loop_cleanup = None
    monkeypatch.setattr(reader, "close_thread_event_loop", lambda: None, raising=False)
    reader.PrepareChunksThread.run(thread)
    assert "Traceback" in capfd.readouterr().err  # LitData's own report
    importlib.import_module("impulsevit._compat.litdata").quiet_prefetch_crash()
    thread._error = None
    reader.PrepareChunksThread.run(thread)
    assert capfd.readouterr().err == "" and isinstance(thread.prefetch_error(), ConnectionError)


def test_ask_early_for_missing_chunks(monkeypatch, tmp_path):
    """LitData's reader waiting on a chunk its download thread has not queued asks that thread for it (the
    force-download queue) after 1 s instead of 30: here the "thread" writes the chunk only when asked, and the wait
    ends within 10 s (with LitData's 30 s it would not). A user's ``FORCE_DOWNLOAD_TIME`` is kept."""
    import queue
    import threading
    import time

    item_loader = pytest.importorskip("litdata.streaming.item_loader")
    compat = importlib.import_module("impulsevit._compat.litdata")
    monkeypatch.setattr(item_loader, "_FORCE_DOWNLOAD_TIME", 30)
    monkeypatch.setenv("FORCE_DOWNLOAD_TIME", "30")
    compat.ask_early_for_missing_chunks()
    assert item_loader._FORCE_DOWNLOAD_TIME == 30  # the user's setting wins
    monkeypatch.delenv("FORCE_DOWNLOAD_TIME")
    compat.ask_early_for_missing_chunks()
    assert item_loader._FORCE_DOWNLOAD_TIME == compat.EARLY_FORCE_DOWNLOAD_S == 1

    chunk = tmp_path / "chunk-0-0.bin"
    asked: queue.Queue = queue.Queue()
    loader = object.__new__(item_loader.PyTreeLoader)  # only the wait's attributes
    loader._force_download_queue = asked
    loader._chunk_ready_provider = lambda index: threading.Event()
    loader._prefetch_error_provider = None

    def thread() -> None:  # the download thread: writes the chunk only when the reader asks for it
        index = asked.get(timeout=20)
        chunk.write_bytes(b"x" * 8)
        assert index == 0

    helper = threading.Thread(target=thread, daemon=True)
    helper.start()
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (loader._wait_until_chunk_ready(0, str(chunk), 8), done.set()),
                              daemon=True)
    t0 = time.monotonic()
    waiter.start()
    assert done.wait(10), "the reader did not ask for the chunk within 10 s"
    assert 0.9 < time.monotonic() - t0 < 10


def compat_ffcv():  # noqa: ANN201
    return importlib.import_module("impulsevit._compat.ffcv")


# ------------------------------------------------------------------------------ setup.cfg and docs/design.md
_CFG_START = "# Private uses of the libraries, all in impulsevit/_compat/ (generated from its entries' \"Reaches:\""


def expected_setup_cfg_block() -> str:
    """setup.cfg's comment on the private uses, generated from the compat entries' ``Reaches:`` lines."""
    lines = [_CFG_START,
             "# lines and checked by tests/house/test_compat.py, which also runs each entry on the installed version):"]
    for name, obj in sorted(_entries().items()):
        wrapped = textwrap.wrap(f"{name}: {_footer(obj)['Reaches'].replace('``', '')}", 114, subsequent_indent="    ",
                                break_on_hyphens=False)
        lines += [f"#   {w}" for w in wrapped]
    return "\n".join(lines)


def test_fix_timm_posterize():
    """timm's RandAugment asks Pillow for 0 bits at magnitude 10 (Pillow >= 11 refuses); after the fix the op keeps 1
    bit, on the given transform only."""
    import numpy as np
    from PIL import Image
    from timm.data.auto_augment import posterize, rand_augment_transform
    from torchvision.transforms import Compose

    def posterize_op(ra):  # noqa: ANN001, ANN202
        op = next(o for o in ra.ops if o.name == "PosterizeIncreasing")
        op.prob = 1.0
        return op

    fixed, other = (rand_augment_transform("rand-m10-n1-mstd0-inc1", {}) for _ in range(2))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="bits"):
        posterize_op(fixed)(image)
    compat_timm.fix_timm_posterize(Compose([fixed]))  # as the torchvision backend calls it: on its whole transform
    assert np.array_equal(np.asarray(posterize_op(fixed)(image)), np.asarray(posterize(image, 1)))
    with pytest.raises(ValueError, match="bits"):  # another transform is untouched
        posterize_op(other)(image)


def test_setup_cfg_lists_the_compat_entries():
    text = (REPO / "setup.cfg").read_text()
    expected = expected_setup_cfg_block()
    assert expected in text, f"setup.cfg's comment on private uses should read:\n{expected}"


def test_design_doc_names_where_private_uses_live():
    doc = (REPO / "docs" / "design.md").read_text()
    section = doc.split("## Library internals", 1)[1].split("\n## ", 1)[0]
    assert "tests/house/test_compat.py" in section and "impulsevit/_compat/" in section
    named = set(re.findall(r"`_compat/(\w+)\.py`", section))
    assert named == set(COMPAT_MODULES), f"docs/design.md names {sorted(named)}; the package has {COMPAT_MODULES}"
    for path in re.findall(r"`(tests/[\w/]+\.py)`", doc):
        assert (REPO / path).exists(), f"docs/design.md cites {path}, which does not exist"


def test_hand_back_signal_handlers_keeps_other_signals():
    """(complements tests/callbacks/test_standard.py) a handler that is not ``mine`` is left as Lightning recorded
    it, and a trainer without Lightning's connector is left alone."""
    class Connector:
        _original_handlers = {signal.SIGUSR1: "other"}

    class FakeTrainer:
        _signal_connector = Connector()

    compat_lightning.hand_back_signal_handlers(FakeTrainer(), "mine", {signal.SIGUSR1: "before"})  # type: ignore
    assert Connector._original_handlers == {signal.SIGUSR1: "other"}
    compat_lightning.hand_back_signal_handlers(object(), "mine", {signal.SIGUSR1: "before"})  # type: ignore


if __name__ == "__main__":  # print setup.cfg's block
    print(expected_setup_cfg_block())
