"""LightningCLI's argument parser, with a suggestion for a misspelled key: jsonargparse's error text is searched for
the keys it rejected, and each is matched against the keys the parser (and the model's dataclass arguments) accept;
and with the ``Trainer``'s integer-or-fraction arguments parsing an integer as ``int``."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import re
import sys
import types
import typing
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser

from impulsevit._compat.cli import parser_actions, try_int_before_float
from impulsevit.errors import missing_extra


def _unwrap_optional(hint: Any) -> Any:
    """``X`` for ``X | None`` / ``Optional[X]``, else ``hint`` unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _class_keys(cls: type) -> list[str]:
    """The keyword arguments ``cls`` takes: a dataclass's fields, else the named parameters of its ``__init__``."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _import_object(path: str) -> Any:
    """The object a dotted path names (``package.module.Class``)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# the wording of jsonargparse's errors about keys it does not know
_REJECTED = re.compile(r"does not accept option '([^']+)'")
_UNRECOGNIZED = re.compile(r"^(?:error: )?unrecognized arguments: (.*)", re.M)  # this parser's own, not a nested one
# nested class / dataclass values: 'Parser key "model.init": ... class_path 'X': ... Option 'metod' is not accepted'
_REJECTED_NESTED = re.compile(r"Parser key \"([^\"]+)\":.*?class_path '([^']+)'.*?Option '([^']+)' is not accepted",
                              re.S)


def _rejected_keys(message: str) -> list[str]:
    """The top-level keys an error message rejects (``--a.b=1`` -> ``a.b``), in the order it names them."""
    keys = _REJECTED.findall(message)
    m = _UNRECOGNIZED.search(message)
    if m:
        keys += [tok[2:].split("=", 1)[0] for tok in m.group(1).split() if tok.startswith("--")]
    return keys


def _nested_hint(owner: str, class_path: str, option: str) -> tuple[str, str | None]:
    """``(owner.option, owner.closest)`` for an option a class-typed value at ``owner`` does not accept."""
    try:
        options = _class_keys(_import_object(class_path))
    except (ImportError, AttributeError, ValueError, TypeError):
        options = []
    best = difflib.get_close_matches(option, options, n=1, cutoff=0.5)
    return f"{owner}.{option}", f"{owner}.{best[0]}" if best else None


# a subclass-mode value (``data: {class_path, init_args}``) that rejected a nested key: the block of the outermost
# 'Parser key "data":', its first class_path, and the nested key as given (at the block's own indentation)
_CLASS_BLOCK = re.compile(r"^(?:error: )?Parser key \"([^\"]+)\":\n(.*?)(?=^\S|\Z)", re.S | re.M)
_CLASS_PATH = re.compile(r"class_path '([^']+)'")
_GIVEN_NESTED = re.compile(r"^  Given value: NestedArg\(key='([^']+)'", re.M)


def class_keys_deep(cls: type, prefix: str = "") -> set[str]:
    """Every dotted key ``cls`` accepts: its arguments, and the fields of dataclass-typed ones (``augment.re_prob``)."""
    keys: set[str] = set()
    hints = typing.get_type_hints(cls if dataclasses.is_dataclass(cls) else cls.__init__)
    for name in _class_keys(cls):
        keys.add(prefix + name)
        inner = _unwrap_optional(hints.get(name))
        if dataclasses.is_dataclass(inner):
            keys |= class_keys_deep(inner, f"{prefix}{name}.")
    return keys


def _suggest(key: str, valid: set[str]) -> str | None:
    """The closest valid key, or the one key that ends in ``key``'s last segment (a key that moved into a block:
    ``re_prob`` -> ``augment.re_prob``)."""
    moved = [k for k in valid if k.split(".")[-1] == key.split(".")[-1] and k != key]
    return moved[0] if len(moved) == 1 else _closest_key(key, valid)


def _class_value_hints(message: str) -> list[tuple[str, str | None]]:
    """``(owner[.init_args].key, owner[.init_args].closest)`` for each class- or dataclass-typed value whose nested key
    was rejected."""
    hints = []
    for owner, block in _CLASS_BLOCK.findall(message):
        path, given = _CLASS_PATH.search(block), _GIVEN_NESTED.findall(block)
        if path is None or not given:
            continue
        try:
            cls = _import_object(path.group(1))
            valid = class_keys_deep(cls)
        except (ImportError, AttributeError, ValueError, TypeError, NameError):
            continue
        if given[-1] in valid:
            continue  # a known key with a bad value (reported by :func:`bad_value`)
        key, best = given[-1], _suggest(given[-1], valid)
        head = owner if dataclasses.is_dataclass(cls) else f"{owner}.init_args"  # a dataclass value has no init_args
        hints.append((f"{head}.{key}", f"{head}.{best}" if best else None))
    return hints


def _closest_key(key: str, valid: set[str]) -> str | None:
    """The key of ``valid`` closest to ``key``: keep its longest valid prefix, fix the first wrong segment; None when
    ``key`` is valid or nothing is close."""
    parts = key.split(".")
    prefixes = {".".join(k.split(".")[:n]) for k in valid for n in range(len(k.split(".")) + 1)}
    depth = max(n for n in range(len(parts) + 1) if ".".join(parts[:n]) in prefixes)
    if depth == len(parts):
        return None
    head = ".".join(parts[:depth])
    children = {k.split(".")[depth] for k in valid if (not head or k.startswith(head + ".")) and
                len(k.split(".")) > depth}
    best = difflib.get_close_matches(parts[depth], sorted(children), n=1, cutoff=0.5)
    if not best:
        return None
    return ".".join([*parts[:depth], best[0], *parts[depth + 1:]])


_PARSER_KEY = re.compile(r'Parser key "([^"]+)":')
_GIVEN = re.compile(r"(?:Given|Got) value: (.*)")
_SUBTYPES = re.compile(r"Subtypes: \[(.*)\]")
_EXPECTED = re.compile(r"Expected a (<class '[^']+'>|typing\.Literal\[[^\]]*\])")


def _type_name(text: str) -> str:
    """``<class 'int'>`` -> ``int``, ``<class 'NoneType'>`` -> ``None``, ``typing.Literal['a', 'b']`` -> ``'a'/'b'``."""
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text.strip())
    text = re.sub(r"typing\.Literal\[(.*?)\]", lambda m: "/".join(v.strip() for v in m.group(1).split(",")), text)
    return "None" if text == "NoneType" else text.replace("typing.", "")


def _split_types(text: str) -> list[str]:
    """The comma-separated items of jsonargparse's ``Subtypes: [...]`` (commas inside brackets kept)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += 1 if ch in "[(" else -1 if ch in "])" else 0
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur] if cur.strip() else out


def bad_value(message: str) -> str | None:
    """``key 'a.b.c': value 'x' is not valid (expected int | None)`` for a jsonargparse error about a value of the
    wrong type, with the full dotted key (nested class and dataclass values included: ``data.init_args.image_size``);
    None when ``message`` is not about a value."""
    keys = list(_PARSER_KEY.finditer(message))
    if not keys:
        return None
    parts = []
    for i, m in enumerate(keys):
        if i and isinstance(cls := _owner_class(message[keys[i - 1].end():m.start()]), type) and \
                not dataclasses.is_dataclass(cls):
            parts.append("init_args")
        parts.append(m.group(1))
    inner = message[keys[-1].end():]
    given = _GIVEN.search(inner)
    subtypes = _SUBTYPES.search(inner)
    expected = [_type_name(t) for t in _split_types(subtypes.group(1))] if subtypes else \
        [_type_name(t) for t in _EXPECTED.findall(inner)[:1]]
    what = f"value {given.group(1).strip()!r}" if given else "the value"
    return f"key '{'.'.join(parts)}': {what} is not valid" + (f" (expected {' | '.join(expected)})" if expected else "")


def _owner_class(block: str) -> type | None:
    m = _CLASS_PATH.search(block)
    if m is None:
        return None
    try:
        return _import_object(m.group(1))
    except (ImportError, AttributeError, ValueError):
        return None


# a class_path jsonargparse could not import: 'Problem with given class_path 'X':\n  No module named 'Y''
_IMPORT_FAILED = re.compile(r"class_path '([^']+)':\s*No module named '([^']+)'")


def import_failure(message: str) -> str | None:
    """The cause, when jsonargparse rejected a value because its ``class_path`` does not import (a module is
    missing): the missing optional dependency and the extra to install (:func:`~impulsevit.errors.missing_extra`),
    or the class path and the module not found; None when ``message`` is not about a failed import. Without this the
    user sees only the symptom (``key 'data': value ... is not valid``)."""
    m = _IMPORT_FAILED.search(message)
    if m is None:
        return None
    class_path, module = m.groups()
    keys = _PARSER_KEY.findall(message)
    where = f"key '{keys[0]}': " if keys else ""
    return missing_extra(module, needed_for=class_path) or \
        f"{where}class_path {class_path!r} cannot be imported: no module named {module!r}"


def one_line_error(message: str, hints: list[str]) -> str:
    """jsonargparse's (multi-line) parse error as one line: a class path that does not import (its cause, see
    :func:`import_failure`), else the unknown keys with their suggestions, else the key whose value is wrong with
    what was expected, else the message's first line."""
    failed = import_failure(message)
    if failed is not None:
        return failed
    if hints:
        return "; ".join(dict.fromkeys(hints))
    found = bad_value(message)
    if found is not None:
        return found
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return lines[0] if lines else "invalid arguments"


class ImpulseArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose errors about unknown keys also name the closest valid key, printed as one line
    (``impulsevit fit: error: ...`` and where to find the valid keys; not the whole usage), and whose ``Trainer``
    arguments typed "int or float" keep an integer an ``int`` (:meth:`add_lightning_class_args`)."""

    model_class: type | None = None  # set per instance by ImpulseCLI.init_parser: lists the fields of dataclass-typed
    # model arguments for the "did you mean" hints
    full_errors: bool = False  # True under ``--debug``: jsonargparse's whole report and the usage
    error_prog: str | None = None  # ``impulsevit fit``: how the one-line error names the command
    keys_prog: str | None = None  # the command whose ``--help`` lists the keys, when not ``error_prog`` (``submit``)

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        """LightningCLI's, and for a ``Trainer`` class: its arguments typed as a union of ``int`` and ``float``
        (``limit_{train,val,test,predict}_batches``, ``overfit_batches``, ``val_check_interval``,
        ``gradient_clip_val``) try ``int`` first, so ``--trainer.limit_val_batches=1`` and ``limit_val_batches: 1`` in
        a recipe or ``config.yaml`` reach the Trainer as the int 1 (one batch), while ``0.5`` and ``1.0`` stay floats
        (a fraction; ``1.0`` all batches). Without it Lightning's annotations reach jsonargparse as
        ``Union[float, int, None]`` and ``1`` became ``1.0``: see
        :func:`impulsevit._compat.cli.try_int_before_float`. Every parser of the ``fit|validate|test|predict``
        subcommands adds the Trainer's arguments here (LightningCLI's ``add_core_arguments_to_parser``), the
        ``config.yaml`` it saves keeps the int, and so a resume or requeue parses the same value again."""
        added = super().add_lightning_class_args(lightning_class, nested_key, subclass_mode=subclass_mode,
                                                 required=required)
        if isinstance(lightning_class, type) and issubclass(lightning_class, Trainer):
            try_int_before_float(self, added)
        return added

    def _valid_keys(self) -> set[str]:
        keys: set[str] = set()
        for action in parser_actions(self):
            sub = getattr(action, "choices", None)
            if isinstance(sub, dict) and all(isinstance(p, LightningArgumentParser) for p in sub.values()):
                for p in sub.values():
                    keys |= p._valid_keys() if isinstance(p, ImpulseArgumentParser) else set()
                continue
            if action.dest and action.dest != "help":
                keys.add(action.dest)
        hints = typing.get_type_hints(self.model_class.__init__) if self.model_class is not None else {}
        for name, hint in hints.items():
            inner = _unwrap_optional(hint)
            if dataclasses.is_dataclass(inner):
                keys |= {f"model.{name}.{f}" for f in _class_keys(inner)}
        return keys

    def _closest(self, key: str) -> str | None:
        return _closest_key(key, self._valid_keys())

    def _hint_lines(self, message: str) -> list[str]:
        """An ``unknown key 'K'; did you mean 'V'?`` line for each key ``message`` rejects."""
        hints = [(key, self._closest(key)) for key in _rejected_keys(message)]
        by_class = _class_value_hints(message)
        hints += by_class or [_nested_hint(*found) for found in _REJECTED_NESTED.findall(message)]
        return [f"unknown key '{key}'" + (f"; did you mean '{best}'?" if best else "") for key, best in hints]

    def _hint(self, message: str) -> str:
        """``message`` plus the lines of :meth:`_hint_lines`."""
        lines = self._hint_lines(message)
        return message if not lines else message.rstrip() + "\n" + "\n".join(lines)

    def error(self, message: str, ex: Exception | None = None) -> typing.NoReturn:
        """Nested parsers raise (jsonargparse collects their messages); the outermost prints one line and exits 2.
        Under ``--debug`` / ``IMPULSEVIT_DEBUG=1`` jsonargparse's full report is printed instead."""
        full = self.full_errors or os.environ.get("IMPULSEVIT_DEBUG", "") not in ("", "0")
        if not self.exit_on_error or full:
            try:
                message = self._hint(message)
            except Exception:  # noqa: BLE001 - a failing suggestion must never hide the original error
                pass
            super().error(message, ex)
        try:
            line = one_line_error(message, self._hint_lines(message))
        except Exception:  # noqa: BLE001 - a failing summary must never hide the original error
            line = " ".join(message.split())
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = self.error_prog or parser.prog.replace(" [options]", "")
        keys_hint = "" if import_failure(message) else f" (valid keys: {self.keys_prog or prog} --help)"
        sys.stderr.write(f"{prog}: error: {line}{keys_hint}\n")
        self.exit(2)
