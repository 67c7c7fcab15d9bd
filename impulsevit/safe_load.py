"""The one loader of every file impulsevit reads that can hold a pickle: no code runs from a hostile file.

A pickle can call any function while it loads (``os.system`` included), and researchers load checkpoints from
colleagues and papers. Everything impulsevit reads that may be a pickle goes through this module
(``tests/test_safe_load.py`` enumerates the calls by AST and fails on a ``torch.load`` / ``pickle`` load elsewhere):

- :func:`load_checkpoint`: a ``torch.save`` file (a Lightning ``.ckpt``, a distributed checkpoint's ``meta.pt``, a
  ``.pth`` state dict) with ``torch.load(weights_only=True)``: tensors, storages, ``OrderedDict`` and plain Python
  values, plus :data:`SAFE_GLOBALS` (the allow-list of what impulsevit's own checkpoints hold beyond those: nothing
  today; every writer stores plain types, see ``callbacks/run_record.py`` and ``callbacks/rng_state.py``).
- :func:`check_distributed_checkpoint` / :func:`load_distributed_checkpoint`: a ``torch.distributed.checkpoint``
  (DCP) folder. DCP reads its ``.metadata`` with plain ``pickle.load`` and the non-tensor entries of its shards with
  ``torch.load(weights_only=False)``; the check reads ``.metadata`` with a restricted unpickler
  (:data:`DCP_METADATA_GLOBALS`: DCP's metadata classes, ``torch.Size``, dtypes, layouts, memory formats, paths) and
  every non-tensor entry with ``weights_only=True`` before DCP touches the folder.
- :func:`load_restricted_pickle`: a plain pickle whose globals are checked against an allow-list given by the
  caller (the CIFAR python batches: numpy arrays and dtypes only).

Anything else is refused before it runs, as :class:`UntrustedFileError` (a :class:`ConfigError`, exit status 2), one
line naming the file, what it would have called, and the opt-in: ``--trust-checkpoint`` on ``fit``, ``validate``,
``test``, ``predict`` and ``export`` (or ``IMPULSEVIT_TRUST_CHECKPOINT=1``) loads a checkpoint from a trusted source
with ``weights_only=False`` (legacy files, files of other frameworks). There is no opt-in for data files.

Not supported: protecting against a file replaced between the check of a distributed checkpoint folder and DCP's own
read of it (a race with another user who can write the folder); remote (fsspec URL) paths.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from impulsevit._aliases import old_module_paths
from impulsevit._compat.checkpoint import distributed_meta_file
from impulsevit.errors import ConfigError

__all__ = ["DCP_METADATA_GLOBALS", "SAFE_GLOBALS", "TRUST_ENV", "TRUST_FLAG", "TRUST_HELP", "NotACheckpointError",
           "UntrustedFileError",
           "check_distributed_checkpoint", "load_checkpoint", "load_distributed_checkpoint", "load_restricted_pickle",
           "read_dcp_metadata", "split_trust_flag", "trust_requested", "trusting"]

TRUST_FLAG = "--trust-checkpoint"
"""The command-line opt-in (``--trust_checkpoint`` is accepted too) that loads checkpoints with
``weights_only=False``."""
TRUST_ENV = "IMPULSEVIT_TRUST_CHECKPOINT"
"""The environment opt-in: ``1`` (or ``true`` / ``yes``) trusts every checkpoint the process loads."""
TRUST_HELP = (f"load checkpoints that hold more than tensors and plain values (weights_only=False): such a file can "
              f"run code, so only for one from a trusted source (also {TRUST_ENV}=1)")
"""The ``--help`` text of :data:`TRUST_FLAG`."""

SAFE_GLOBALS: tuple[Any, ...] = ()
"""What impulsevit's own checkpoints hold beyond what ``torch.load(weights_only=True)`` accepts by default (tensors,
storages, ``OrderedDict``, ``torch.Size``, dtypes, devices and plain Python values): nothing. A writer that needs
another class adds it here (``torch.serialization.safe_globals`` form), with a test that a real checkpoint loads;
prefer storing plain types."""

DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    *(("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by name (torch.strided), as torch pickles layouts
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
})
"""The globals a DCP ``.metadata`` pickle may name, besides ``torch.<dtype>`` / ``torch.<memory_format>`` /
``torch.<layout>`` objects (found by saving a real FSDP2 checkpoint; ``tests/test_safe_load.py`` checks it)."""

_TRUE = ("1", "true", "yes", "on")
_GLOBAL_RE = re.compile(r"GLOBAL ([\w.]+)")


class UntrustedFileError(ConfigError):
    """A file would run code (or build objects impulsevit does not write) when loaded, and was not loaded; the message
    names the file, what it would have called and the opt-in. Exit status 2."""


def trust_requested(trust: bool | None = None) -> bool:
    """``trust`` when given, else whether :data:`TRUST_ENV` is set to a true value."""
    if trust is not None:
        return bool(trust)
    return os.environ.get(TRUST_ENV, "").strip().lower() in _TRUE


def split_trust_flag(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--trust-checkpoint`` / ``--trust_checkpoint`` (bare flags), and whether one was there."""
    rest = [a for a in argv if a not in (TRUST_FLAG, "--trust_checkpoint")]
    return rest, len(rest) != len(argv)


@contextlib.contextmanager
def trusting(enabled: bool) -> Iterator[None]:
    """Within the block (a whole command), every load trusts its files when ``enabled``: :data:`TRUST_ENV` is set in
    this process's environment (so the processes it starts, e.g. DDP ranks, inherit it) and put back afterwards."""
    if not enabled:
        yield
        return
    before = os.environ.get(TRUST_ENV)
    os.environ[TRUST_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def _opt_in() -> str:
    return f"if you trust whoever made it, pass {TRUST_FLAG} (or set {TRUST_ENV}=1)"


def _refusal(path: str | os.PathLike, what: str, detail: str,
             holds: str = "an impulsevit checkpoint holds only tensors and plain values",
             opt_in: bool = True) -> UntrustedFileError:
    tail = f"; {_opt_in()}" if opt_in else ""
    return UntrustedFileError(f"{path}: refused to load this {what}: {detail} ({holds}){tail}")


def _weights_only_detail(exc: BaseException) -> str:
    """What torch's ``weights_only`` unpickler refused, in a few words (``it would call posix.system``)."""
    text = str(exc)
    found = _GLOBAL_RE.search(text)
    if found:
        return f"it would call {found.group(1)} while loading"
    boilerplate = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(boilerplate)]
    return (f"it holds what torch's weights-only loader cannot read ({lines[0]})" if lines
            else "it holds objects that are not tensors or plain values")


class NotACheckpointError(UntrustedFileError):
    """torch's ``weights_only`` loader refused a file that is no ``torch.save`` file at all (random bytes, another
    format) or a plain pickle that ``torch.load`` cannot read even when trusted: one line naming the file and what it
    is, without the ``--trust-checkpoint`` hint (trusting would not help). A subclass of :class:`UntrustedFileError`,
    so every caller that passes a refusal on unchanged passes this one too; exit status 2."""


class _WeightsOnlyRefused(Exception):
    """torch's ``weights_only`` unpickler refused the file; ``args[0]`` says what it would have called."""


_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a non-zip torch.save file (torch.serialization)
_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING",
                         "STRING"})


def _pickle_globals(data: IO[bytes]) -> tuple[list[str], Any] | None:
    """``(globals named, first value pushed)`` of the first pickle read from the stream ``data`` (only as far as its
    ``STOP``), read with :mod:`pickletools` (opcodes
    only: nothing is imported or called); None when ``data`` does not start with a well-formed pickle. Globals are
    those of ``GLOBAL`` / ``INST`` and of ``STACK_GLOBAL`` (its two strings, pushed or fetched from the memo)."""
    import pickletools

    found: list[str] = []
    strings: list[str | None] = []  # what the last ops pushed, strings or None
    memo: dict[Any, str | None] = {}
    first: Any = None
    try:
        for i, (op, arg, _) in enumerate(pickletools.genops(data)):
            if i <= 1 and op.name in ("BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG") and first is None:
                first = arg
            if op.name in ("GLOBAL", "INST"):
                found.append(".".join(str(arg).split(" ", 1)))
            elif op.name == "STACK_GLOBAL":
                module, name = (strings[-2:] + [None, None])[:2] if len(strings) >= 2 else (None, None)
                found.append(f"{module}.{name}" if module and name else "a global")
            if op.name in _STRING_OPS:
                strings.append(arg if isinstance(arg, str) else str(arg))
            elif op.name in ("BINGET", "LONG_BINGET", "GET"):
                strings.append(memo.get(arg))
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[arg] = strings[-1] if strings else None
            elif op.name == "MEMOIZE":
                memo[len(memo)] = strings[-1] if strings else None
            elif op.name not in ("FRAME", "PROTO"):
                strings.append(None)
    except Exception:  # noqa: BLE001 - pickletools raises ValueError / others on bytes that are no pickle
        return None
    return found, first


def _what_it_is(path: str | os.PathLike | IO[bytes], refused: str) -> str | None:
    """Why a file torch's ``weights_only`` loader refused (``refused``: its words, :func:`_weights_only_detail`) is
    no checkpoint at all, read from its bytes alone (nothing imported or called): not a pickle (random bytes, another
    format), or a plain pickle that is not a ``torch.save`` file (``torch.load`` cannot
    read it even when trusted). None for a ``torch.save`` file (a checkpoint that trusting would load) and for what
    cannot be read here (a stream, an I/O error)."""
    import zipfile

    if not isinstance(path, str | os.PathLike):
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
            fh.seek(0)
            if head.startswith(b"PK"):
                with zipfile.ZipFile(fh) as zf:
                    pkl = next((n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
                    if pkl is None:
                        return "it is a zip archive, not a torch.save file (no data.pkl inside)"
                    with zf.open(pkl) as member:
                        ok = _pickle_globals(member) is not None
                    return None if ok else "it is a damaged torch.save file (its data.pkl is not a pickle)"
            parsed = _pickle_globals(fh)
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    if parsed is None:
        return ("it is not a checkpoint: neither a torch.save file nor a pickle (random or damaged bytes, or another "
                "format)")
    found, first = parsed
    if first == _TORCH_LEGACY_MAGIC:
        return None  # a torch.save file of the legacy (non-zip) format
    if not found:
        return "it is a plain pickle, not a torch.save file"
    calls = refused if refused.startswith("it would call") else f"it would call {', '.join(dict.fromkeys(found))}"
    return f"it is a plain pickle, not a torch.save file, and holds code that will not be run ({calls})"


def _load_weights_only(src: str | os.PathLike | IO[bytes], map_location: Any, mmap: bool) -> Any:
    import torch

    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)), warnings.catch_warnings():
            # a foreign pickle's protocol: torch warns before refusing it, and the refusal says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(src, map_location=map_location, mmap=mmap, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" in str(exc):
            raise _WeightsOnlyRefused(_weights_only_detail(exc)) from None
        raise


def load_checkpoint(path: str | os.PathLike | IO[bytes], *, mmap: bool = False, map_location: Any = "cpu",
                    trust: bool | None = None, what: str = "checkpoint") -> Any:
    """A ``torch.save`` file, loaded with ``weights_only=True`` and :data:`SAFE_GLOBALS` (``trust``, or
    :data:`TRUST_ENV` when ``trust`` is None: ``weights_only=False``). ``mmap``: tensors are memory-mapped, not read
    (a file path of the zip format only).

    Raises:
        UntrustedFileError: the file holds something else (a global that could run code); nothing of it ran.
        Anything ``torch.load`` raises for a missing, truncated or foreign file (callers name it).
    """
    if trust_requested(trust):
        import torch

        with old_module_paths():  # a trusted checkpoint of before the regroup pickles its classes by old paths
            return torch.load(path, map_location=map_location, mmap=mmap, weights_only=False)
    try:
        return _load_weights_only(path, map_location, mmap)
    except _WeightsOnlyRefused as exc:
        name = path if isinstance(path, str | os.PathLike) else getattr(path, "name", "<stream>")
        foreign = _what_it_is(path, exc.args[0])
        if foreign is not None:
            raise NotACheckpointError(f"{name}: refused to load this {what}: {foreign}") from None
        raise _refusal(name, what, exc.args[0]) from None


# ---------------------------------------------------------------------------------------------- restricted pickles
class _Refused(pickle.UnpicklingError):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        self.module, self.name = module, name


class _RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` resolves only the globals ``allowed(module, name)`` accepts; any
    other raises :class:`_Refused` before it is imported or called."""

    def __init__(self, fh: IO[bytes], allowed: Callable[[str, str], bool], **kwargs: Any) -> None:
        super().__init__(fh, **kwargs)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if not self._allowed(module, name):
            raise _Refused(module, name)
        return super().find_class(module, name)


def load_restricted_pickle(fh: IO[bytes], allowed: Callable[[str, str], bool] | Iterable[tuple[str, str]], *,
                           source: str | os.PathLike, what: str, holds: str, encoding: str = "ASCII",
                           opt_in: bool = False) -> Any:
    """Unpickle ``fh`` resolving only the globals in ``allowed`` (pairs ``(module, name)`` or a predicate).

    ``source`` and ``what`` name the file in the error, ``holds`` says what such a file holds (``"a CIFAR python
    batch holds only numpy arrays and plain values"``); ``opt_in`` adds the
    :data:`TRUST_FLAG` hint (checkpoints only, not data files). ``encoding`` is ``pickle.load``'s (``"bytes"`` for
    python-2 pickles).

    Raises:
        UntrustedFileError: the pickle names another global (nothing was imported or called).
        Anything ``pickle`` raises for a damaged file.
    """
    if callable(allowed):
        pred = allowed
    else:
        pairs = frozenset(allowed)

        def pred(module: str, name: str) -> bool:
            return (module, name) in pairs

    try:
        return _RestrictedUnpickler(fh, pred, encoding=encoding).load()
    except _Refused as exc:
        raise _refusal(source, what, f"it would call {exc.module}.{exc.name} while loading", holds=holds,
                       opt_in=opt_in) from None


def _dcp_global(module: str, name: str) -> bool:
    if (module, name) in DCP_METADATA_GLOBALS:
        return True
    if module == "torch" and "." not in name and not name.startswith("_"):
        import torch

        return isinstance(getattr(torch, name, None), torch.dtype | torch.memory_format | torch.layout)
    return False


# ---------------------------------------------------------------------------------------------- distributed checkpoints
_DCP_METADATA = ".metadata"


def read_dcp_metadata(folder: str | os.PathLike) -> Any:
    """The ``torch.distributed.checkpoint`` ``Metadata`` of ``folder``, unpickled with only
    :data:`DCP_METADATA_GLOBALS` (and torch dtypes, layouts, memory formats).

    Raises:
        UntrustedFileError: ``.metadata`` names another global. FileNotFoundError: no ``.metadata``.
        ValueError: it is damaged or not DCP metadata (names the file).
    """
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(folder) / _DCP_METADATA
    with open(path, "rb") as fh:
        try:
            meta = load_restricted_pickle(fh, _dcp_global, source=path, what="distributed checkpoint metadata",
                                          holds="DCP metadata holds only its own classes, sizes, dtypes and paths",
                                          opt_in=True)
        except UntrustedFileError:
            raise
        except Exception as exc:  # noqa: BLE001 - pickle raises many types on garbage
            raise ValueError(f"{path}: not a distributed checkpoint's metadata (damaged? "
                             f"{type(exc).__name__}: {exc})") from exc
    if not isinstance(meta, Metadata):
        raise ValueError(f"{path}: not a distributed checkpoint's metadata (it holds a {type(meta).__name__})")
    return meta


def _byte_entries(folder: Path, meta: Any) -> Iterator[tuple[str, bytes]]:
    """``(key, bytes)`` of every non-tensor entry of the DCP folder (DCP ``torch.load``s these with
    ``weights_only=False``); every entry, tensor or not, must lie in a file of the folder itself.

    Raises:
        UntrustedFileError: an entry points outside the folder, or is stored with transforms.
        ValueError: the metadata is not shaped as DCP writes it.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    storage, entries = getattr(meta, "storage_data", None), getattr(meta, "state_dict_metadata", None)
    if not isinstance(storage, dict) or not isinstance(entries, dict):
        raise ValueError(f"{folder / _DCP_METADATA}: not a distributed checkpoint's metadata (no storage table)")
    root = folder.resolve()
    for index, info in storage.items():
        fqn, rel = getattr(index, "fqn", None), getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (isinstance(rel, str) and isinstance(offset, int) and isinstance(length, int)):
            raise ValueError(f"{folder / _DCP_METADATA}: not a distributed checkpoint's metadata (entry {fqn})")
        if (folder / rel).resolve().parent != root:
            raise _refusal(folder / _DCP_METADATA, "distributed checkpoint metadata",
                           f"entry {fqn} points outside the folder ({rel})")
        if not isinstance(entries.get(fqn), BytesStorageMetadata):
            continue
        if getattr(info, "transform_descriptors", None):
            raise _refusal(folder / _DCP_METADATA, "distributed checkpoint metadata",
                           f"entry {fqn} is stored with transforms {list(info.transform_descriptors)}, which "
                           "impulsevit does not write")
        with open(folder / rel, "rb") as fh:
            fh.seek(offset)
            yield fqn, fh.read(length)


def check_distributed_checkpoint(folder: str | os.PathLike, *, trust: bool | None = None) -> None:
    """Refuse a DCP folder whose ``.metadata``, non-tensor entries or ``meta.pt`` hold anything that could run code,
    before DCP (or Lightning) reads it. With ``trust`` (or :data:`TRUST_ENV`) nothing is checked.

    Raises:
        UntrustedFileError: what would run, naming the file (and the entry).
        FileNotFoundError / ValueError: no ``.metadata``, a damaged one or a missing shard.
    """
    if trust_requested(trust):
        return
    folder = Path(folder)
    meta = read_dcp_metadata(folder)
    for fqn, data in _byte_entries(folder, meta):
        try:
            _load_weights_only(io.BytesIO(data), "cpu", False)
        except _WeightsOnlyRefused as exc:
            raise _refusal(folder, "distributed checkpoint", f"its entry {fqn}: {exc.args[0]}") from None
    if distributed_meta_file(folder).is_file():
        load_checkpoint(distributed_meta_file(folder), mmap=True)


def load_distributed_checkpoint(folder: str | os.PathLike, *, trust: bool | None = None) -> dict[str, Any]:
    """A DCP folder as one in-memory dict (``dcp_to_torch_save``, after :func:`check_distributed_checkpoint`), with
    Lightning's ``meta.pt`` (hyperparameters, callback states) merged in, on CPU.

    Raises:
        UntrustedFileError / FileNotFoundError / ValueError: see :func:`check_distributed_checkpoint`; anything DCP
        raises for a damaged folder.
    """
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(folder)
    check_distributed_checkpoint(folder, trust=trust)
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "merged.pt"
        dcp_to_torch_save(folder, merged)
        ckpt = load_checkpoint(merged, trust=trust)
    meta = distributed_meta_file(folder)
    if meta.is_file():
        ckpt = {**load_checkpoint(meta, trust=trust), **ckpt}
    return ckpt
