"""LightningCLI's argument parser, with a suggestion for a misspelled key: jsonargparse's error text is searched for
the keys it rejected, and each is matched against the keys the parser (and the model's dataclass arguments) accept."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import types
import typing
from typing import Any

from lightning.pytorch.cli import LightningArgumentParser


def _unwrap_optional(hint: Any) -> Any:
    """``X`` for ``X | None`` / ``Optional[X]``, else ``hint`` unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _class_keys(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    params = inspect.signature(cls.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _import_object(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class ImpulseArgumentParser(LightningArgumentParser):
    """LightningCLI's parser whose errors about unknown keys also name the closest valid key."""

    model_class: type | None = None  # set by ImpulseCLI, used to list the fields of dataclass-typed model arguments

    def _valid_keys(self) -> set[str]:
        keys: set[str] = set()
        for action in self._actions:
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
        """The valid key closest to ``key``: keep its longest valid prefix, fix the first wrong segment."""
        valid = self._valid_keys()
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

    def _hint(self, message: str) -> str:
        hints = []
        for key in re.findall(r"does not accept option '([^']+)'", message):
            hints.append((key, self._closest(key)))
        m = re.search(r"unrecognized arguments: (.*)", message)
        if m:
            for tok in m.group(1).split():
                if tok.startswith("--"):
                    key = tok[2:].split("=", 1)[0]
                    hints.append((key, self._closest(key)))
        # nested class / dataclass values: 'Parser key "model.init": ... class_path 'X': ... Option 'metod' is not...'
        for owner, cls_path, opt in re.findall(
            r"Parser key \"([^\"]+)\":.*?class_path '([^']+)'.*?Option '([^']+)' is not accepted", message, re.S
        ):
            try:
                options = _class_keys(_import_object(cls_path))
            except (ImportError, AttributeError, ValueError, TypeError):
                options = []
            best = difflib.get_close_matches(opt, options, n=1, cutoff=0.5)
            hints.append((f"{owner}.{opt}", f"{owner}.{best[0]}" if best else None))
        lines = []
        for key, best in hints:
            lines.append(f"unknown key '{key}'" + (f"; did you mean '{best}'?" if best else ""))
        return message if not lines else message.rstrip() + "\n" + "\n".join(lines)

    def error(self, message: str, ex: Exception | None = None) -> typing.NoReturn:
        try:
            message = self._hint(message)
        except Exception:  # noqa: BLE001 - a failing suggestion must never hide the original error
            pass
        super().error(message, ex)
