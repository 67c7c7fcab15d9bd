"""Recipe files: where they live, how a name resolves to a file, and their one-line descriptions.

A recipe is a LightningCLI config file (YAML). Its description is the first comment line at the top of the file
(``# DeiT-B on ImageNet-1K ...``). ``impulsevit fit --recipe NAME`` accepts a path to a file, or ``NAME`` /
``NAME.yaml`` looked up in the recipe directories, in order:

1. every directory in ``$IMPULSEVIT_RECIPES`` (``os.pathsep``-separated),
2. ``./recipes`` (the current working directory),
3. the recipes shipped with the package (package data ``impulsevit.recipes_data``, found with
   ``importlib.resources``; in a source checkout the top-level ``recipes/`` is a link to the same folder).

The first directory holding a name wins. Files under these directories' subfolders are not recipes. Not supported:
running from a zip archive (the shipped recipes must be files on disk).
"""

from __future__ import annotations

import difflib
import os
from importlib import resources
from pathlib import Path

from impulsevit.errors import ConfigError

__all__ = ["RecipeNotFoundError", "packaged_recipes_dir", "recipe_dirs", "available_recipes", "describe",
           "resolve_recipe", "format_listing"]

_SUFFIXES = (".yaml", ".yml")


class RecipeNotFoundError(ConfigError):
    """A recipe name that is neither a file nor a recipe in any recipe directory (a :class:`ConfigError`, so a
    ``ValueError``: one line, exit 2)."""


def packaged_recipes_dir() -> Path:
    """The folder of the recipes installed with the package (``impulsevit/recipes_data``)."""
    return Path(str(resources.files("impulsevit.recipes_data")))


def recipe_dirs() -> list[Path]:
    """The directories searched for recipe names, highest priority first (existing ones only, no duplicates)."""
    candidates = [Path(p) for p in os.environ.get("IMPULSEVIT_RECIPES", "").split(os.pathsep) if p]
    candidates += [Path.cwd() / "recipes", packaged_recipes_dir()]
    seen: set[Path] = set()
    out = []
    for d in candidates:
        d = d.resolve()
        if d.is_dir() and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def available_recipes() -> dict[str, Path]:
    """Recipe name (file stem) → file, sorted by name; earlier directories shadow later ones."""
    found: dict[str, Path] = {}
    for d in recipe_dirs():
        for f in sorted(d.iterdir()):
            if f.suffix in _SUFFIXES and f.is_file():
                found.setdefault(f.stem, f)
    return dict(sorted(found.items()))


def describe(path: str | os.PathLike) -> str:
    """The recipe's one-line description: its first ``#`` comment line before any YAML content ('' when none)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            text = line.strip()
            if not text:
                continue
            if text.startswith("#"):
                return text.lstrip("#").strip()
            return ""
    return ""


def resolve_recipe(name_or_path: str | os.PathLike) -> Path:
    """The file a ``--recipe`` value refers to: an existing file as given, else a recipe name (``.yaml`` optional).

    Raises:
        RecipeNotFoundError: no such file and no such recipe; one line with the (up to 3) closest names and a pointer
            to ``impulsevit recipes`` (the full list).
    """
    given = Path(name_or_path)
    if given.is_file():
        return given
    name = given.name
    for suffix in _SUFFIXES:
        name = name.removesuffix(suffix)
    recipes = available_recipes()
    if given.parent == Path(".") and name in recipes:
        return recipes[name]
    close = difflib.get_close_matches(name, list(recipes), n=3, cutoff=0.4)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    if len(close) > 1:
        hint = f"{hint[:-1]} (or {', '.join(repr(c) for c in close[1:])})?"
    raise RecipeNotFoundError(f"unknown recipe {str(name_or_path)!r}: not a file and not a recipe name.{hint} See "
                              f"`impulsevit recipes` for the {len(recipes)} available recipes.")


def format_listing() -> str:
    """A table of ``name  description  (path)`` lines, one per available recipe."""
    recipes = available_recipes()
    if not recipes:
        return "no recipes found (searched: $IMPULSEVIT_RECIPES, ./recipes, the package's recipes_data/)"
    width = max(len(n) for n in recipes)
    return "\n".join(f"{name:<{width}}  {describe(path) or '(no description)'}" for name, path in recipes.items())
