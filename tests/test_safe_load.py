"""``impulsevit.safe_load``: the one loader of files that can hold a pickle.

- No module of the package loads a pickle any other way: an AST walk over ``impulsevit/`` finds every reference to a
  pickle-loading function (``torch.load``, ``pickle.load``/``loads``/``Unpickler``, DCP's readers, ...) outside
  ``impulsevit/safe_load.py``, through any import spelling; the walk itself is tested on source strings.
- The loader refuses what would run code (nothing runs), loads plain checkpoints, and loads anything with ``trust``.
- The restricted unpicklers: CIFAR python batches (what numpy 2 writes, python-2 style bytes) and DCP metadata.

The CLI side (every subcommand refusing a hostile file, DCP folders, ``--trust-checkpoint``) is in
``tests/faults/test_hostile_files.py``, on real checkpoints.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from impulsevit import safe_load
from impulsevit.errors import ConfigError
from impulsevit.safe_load import UntrustedFileError, load_checkpoint, load_restricted_pickle

PKG = Path(__file__).resolve().parents[1] / "impulsevit"
ALLOWED_FILES = {"safe_load.py"}  # relative to impulsevit/

# every function / class that unpickles (or hands a file to something that does without weights_only)
FORBIDDEN = {
    "torch.load", "torch.serialization.load",
    "pickle.load", "pickle.loads", "pickle.Unpickler", "_pickle.load", "_pickle.loads", "_pickle.Unpickler",
    "dill.load", "dill.loads", "cloudpickle.load", "cloudpickle.loads", "joblib.load", "pandas.read_pickle",
    "shelve.open", "marshal.load", "marshal.loads",
    "torch.distributed.checkpoint.format_utils.dcp_to_torch_save",
    "torch.distributed.checkpoint.FileSystemReader", "torch.distributed.checkpoint.filesystem.FileSystemReader",
    "torch.distributed.checkpoint.load", "torch.distributed.checkpoint.state_dict_loader.load",
    "torch.distributed.checkpoint.load_state_dict",
    "lightning.fabric.utilities.cloud_io._load", "lightning.fabric.utilities.load._lazy_load",
    "torch.hub.load_state_dict_from_url",
}


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from every import in ``tree`` (any depth)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:
                    names[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return None
    return ".".join([names[node.id], *reversed(parts)])


def forbidden_uses(source: str, filename: str = "<source>") -> list[str]:
    """``filename:line: name`` for every reference to a :data:`FORBIDDEN` name (called, subclassed, passed along)
    and every ``numpy.load`` call with ``allow_pickle`` not literally false, in ``source``."""
    tree = ast.parse(source, filename)
    names = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name) and isinstance(node.ctx, ast.Load):
            dotted = _dotted(node, names)
            if dotted in FORBIDDEN:
                found.append(f"{filename}:{node.lineno}: {dotted}")
        if isinstance(node, ast.Call) and _dotted(node.func, names) == "numpy.load":
            pickled = next((k.value for k in node.keywords if k.arg == "allow_pickle"), None)
            if not (pickled is None or (isinstance(pickled, ast.Constant) and pickled.value is False)):
                found.append(f"{filename}:{node.lineno}: numpy.load(allow_pickle=...)")
    return sorted(set(found))


def package_uses() -> dict[str, list[str]]:
    """:func:`forbidden_uses` of every module of the package, by path relative to ``impulsevit/``."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(PKG))
        out[rel] = forbidden_uses(path.read_text(), f"impulsevit/{rel}")
    return out


# ---------------------------------------------------------------------------------------------- the AST walk
def test_no_pickle_load_outside_the_one_loader():
    uses = package_uses()
    outside = [u for rel, found in uses.items() if rel not in ALLOWED_FILES for u in found]
    assert not outside, ("pickle loads outside impulsevit/safe_load.py (use impulsevit.safe_load.load_checkpoint / "
                         "load_restricted_pickle):\n" + "\n".join(outside))
    # the walk sees the loader's own calls: an empty result is not a parsing failure
    inside = " ".join(uses["safe_load.py"])
    assert "torch.load" in inside and "pickle.Unpickler" in inside and "dcp_to_torch_save" in inside


@pytest.mark.parametrize("source, expected", [
    ("import torch\ntorch.load(p)", "torch.load"),
    ("import torch as T\nx = T.load(p, weights_only=False)", "torch.load"),
    ("from torch import load\nload(p)", "torch.load"),
    ("from torch import load as L\nf = L", "torch.load"),
    ("def f(p):\n    import pickle\n    return pickle.loads(p)", "pickle.loads"),
    ("import pickle\nclass U(pickle.Unpickler):\n    pass", "pickle.Unpickler"),
    ("from pickle import Unpickler\nUnpickler(fh).load()", "pickle.Unpickler"),
    ("import torch.distributed.checkpoint as dcp\ndcp.load(sd, checkpoint_id=p)", "torch.distributed.checkpoint.load"),
    ("from torch.distributed.checkpoint import FileSystemReader\nFileSystemReader(p)", "FileSystemReader"),
    ("from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\ndcp_to_torch_save(a, b)",
     "dcp_to_torch_save"),
    ("import numpy as np\nnp.load(p, allow_pickle=True)", "numpy.load"),
    ("import torch.serialization\ntorch.serialization.load(p)", "torch.serialization.load"),
])
def test_the_walk_finds_an_added_load_in_any_spelling(source, expected):
    found = forbidden_uses(source)
    assert found and expected in found[0], (source, found)


@pytest.mark.parametrize("source", [
    "import numpy as np\nnp.load(p)",
    "import numpy as np\nnp.load(p, allow_pickle=False)",
    "import torch\ntorch.save(x, p)",
    "from impulsevit.safe_load import load_checkpoint\nload_checkpoint(p)",
    "import yaml\nyaml.safe_load(s)",
])
def test_the_walk_passes_what_cannot_unpickle(source):
    assert forbidden_uses(source) == []


# ---------------------------------------------------------------------------------------------- the loader
class _Marker:
    """Unpickling it creates ``path`` (code execution)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.path}",))


def test_a_file_that_runs_code_is_refused_naming_it_and_the_opt_in(tmp_path):
    marker, evil = tmp_path / "ran", tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"w": torch.ones(2)}, "x": _Marker(marker)}, evil)
    with pytest.raises(UntrustedFileError) as exc:
        load_checkpoint(evil, mmap=True)
    msg = str(exc.value)
    assert isinstance(exc.value, ConfigError) and exc.value.exit_status == 2
    assert str(evil) in msg and "system" in msg and "--trust-checkpoint" in msg and safe_load.TRUST_ENV in msg
    assert "\n" not in msg
    assert not marker.exists()


def test_plain_checkpoints_load_and_trust_loads_anything(tmp_path, monkeypatch):
    plain = tmp_path / "plain.ckpt"
    state = {"state_dict": {"w": torch.arange(3.0)}, "global_step": 7, "hp": {"lr": 1e-3, "betas": (0.9, 0.99)},
             "size": torch.Size([2, 3]), "dtype": torch.bfloat16}
    torch.save(state, plain)
    got = load_checkpoint(plain, mmap=True)
    assert got["global_step"] == 7 and torch.equal(got["state_dict"]["w"], state["state_dict"]["w"])
    assert got["size"] == torch.Size([2, 3]) and got["dtype"] is torch.bfloat16

    import argparse

    legacy = tmp_path / "legacy.ckpt"
    torch.save({"state_dict": {}, "args": argparse.Namespace(lr=0.1)}, legacy)
    with pytest.raises(UntrustedFileError, match="argparse.Namespace"):
        load_checkpoint(legacy)
    assert load_checkpoint(legacy, trust=True)["args"].lr == 0.1
    monkeypatch.setenv(safe_load.TRUST_ENV, "1")
    assert load_checkpoint(legacy)["args"].lr == 0.1
    with pytest.raises(UntrustedFileError):
        load_checkpoint(legacy, trust=False)


@pytest.mark.parametrize("case", ["random", "plain pickle p2", "plain pickle p4", "legacy torch.save",
                                  "zip torch.save"])
def test_a_refused_file_says_what_it_is_and_offers_trust_only_where_it_would_help(tmp_path, case):
    """torch's weights-only loader refuses these without naming a global ("Please file an issue ...") or names a
    global where trusting would still fail: the refusal says what the file is, the opt-in only for a real
    ``torch.save`` file (legacy or zip) that trusting would load."""
    marker, path = tmp_path / "ran", tmp_path / "f.pth"
    payload = {"w": torch.ones(2), "x": _Marker(marker)}
    if case == "random":
        path.write_bytes(bytes(range(256)) * 8)
    elif case.startswith("plain pickle"):
        path.write_bytes(pickle.dumps({"a": 1, "x": _Marker(marker)}, protocol=int(case[-1])))
    else:
        torch.save(payload, path, _use_new_zipfile_serialization=case == "zip torch.save")
    with pytest.raises(UntrustedFileError) as exc:
        load_checkpoint(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: refused to load this checkpoint: ") and "\n" not in msg, msg
    assert "Please file an issue" not in msg and not marker.exists()
    helps = case.endswith("torch.save")
    assert ("--trust-checkpoint" in msg) == helps, msg
    assert isinstance(exc.value, safe_load.NotACheckpointError) != helps
    says = {"random": "neither a torch.save file nor a pickle", "plain pickle p2": "posix.system",
            "plain pickle p4": "posix.system", "legacy torch.save": "it would call posix.system",
            "zip torch.save": "it would call posix.system"}[case]
    assert says in msg, msg
    if case.startswith("plain pickle"):
        assert "a plain pickle, not a torch.save file, and holds code that will not be run" in msg, msg
    if helps:
        assert "_rebuild_tensor" not in msg and "OrderedDict" not in msg, msg  # only what was refused


def test_a_damaged_file_is_not_reported_as_hostile(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(Exception) as exc:
        load_checkpoint(bad)
    assert not isinstance(exc.value, UntrustedFileError)


def test_trust_flag_is_taken_out_and_trusting_is_scoped(monkeypatch):
    monkeypatch.delenv(safe_load.TRUST_ENV, raising=False)
    argv = ["fit", "--trust-checkpoint", "--resume", "x"]
    assert safe_load.split_trust_flag(argv) == (["fit", "--resume", "x"], True)
    assert safe_load.split_trust_flag(["export", "a", "--trust_checkpoint"]) == (["export", "a"], True)
    assert safe_load.split_trust_flag(["fit", "--name=trust-checkpoint"]) == (["fit", "--name=trust-checkpoint"], False)
    assert not safe_load.trust_requested()
    with safe_load.trusting(True):
        assert safe_load.trust_requested() and os.environ[safe_load.TRUST_ENV] == "1"
    assert not safe_load.trust_requested() and safe_load.TRUST_ENV not in os.environ


# ---------------------------------------------------------------------------------------------- restricted pickles
def _cifar_batch(tmp_path: Path, payload: object = None, protocol: int = 2) -> Path:
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir(exist_ok=True)
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    batch = {b"data": data, b"labels": [3, 5], b"batch_label": b"x", **({b"extra": payload} if payload else {})}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (root / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    (root / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"c%d" % i for i in range(10)]}, protocol=2))
    return root


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_batches_read_through_the_restricted_unpickler(tmp_path, protocol):
    from impulsevit.data.sources.formats import read_cifar

    _cifar_batch(tmp_path, protocol=protocol)
    src = read_cifar(tmp_path, "test", 10)
    assert len(src) == 2 and src.classes[:2] == ["c0", "c1"]


def test_a_cifar_batch_that_runs_code_is_refused_naming_the_file(tmp_path):
    from impulsevit.data.sources.formats import read_cifar

    marker = tmp_path / "ran"
    root = _cifar_batch(tmp_path, payload=_Marker(marker))
    with pytest.raises(UntrustedFileError) as exc:
        read_cifar(tmp_path, "test", 10)
    msg = str(exc.value)
    assert str(root / "test_batch") in msg and "posix.system" in msg and "--trust-checkpoint" not in msg
    assert not marker.exists()


def test_restricted_unpickler_refuses_before_importing_or_calling(tmp_path):
    marker = tmp_path / "ran"
    blob = pickle.dumps([1, _Marker(marker)])
    with pytest.raises(UntrustedFileError, match="posix.system"):
        load_restricted_pickle(io.BytesIO(blob), set(), source="blob", what="test file", holds="nothing")
    assert load_restricted_pickle(io.BytesIO(pickle.dumps({"a": [1, (2, 3)]})), set(), source="b", what="t",
                                  holds="nothing") == {"a": [1, (2, 3)]}
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_metadata_allow_list_covers_what_torch_writes(tmp_path):
    """A real DCP save (no process group: one process) with tensors, bytes entries and a path in its metadata is read
    by the restricted reader; the same folder with a hostile ``.metadata`` is refused."""
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "dcp"
    dcp.save({"w": torch.ones(3, 2, dtype=torch.bfloat16), "step": 3, "lr": [0.1, (0.9, 0.99)]},
             checkpoint_id=folder, no_dist=True)
    meta = safe_load.read_dcp_metadata(folder)
    assert "w" in meta.state_dict_metadata
    safe_load.check_distributed_checkpoint(folder)

    original = (folder / ".metadata").read_bytes()
    info = next(iter(meta.storage_data.values()))
    info.relative_path = "../outside.distcp"  # an entry read from a file outside the folder
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    with pytest.raises(UntrustedFileError, match="points outside the folder"):
        safe_load.check_distributed_checkpoint(folder)
    (folder / ".metadata").write_bytes(original)

    marker = tmp_path / "ran"
    (folder / ".metadata").write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(UntrustedFileError, match=r"\.metadata.*posix\.system.*--trust-checkpoint"):
        safe_load.check_distributed_checkpoint(folder)
    assert not marker.exists()
