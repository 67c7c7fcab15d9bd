"""What a study runs: the method × seed plan, the recipe header comments it reads (``# paper:``, ``# study:``), and
the ``impulsevit fit`` arguments of each run. Pure functions: nothing here starts a process or writes a file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from impulsevit.errors import ConfigError
from impulsevit.io import check_child_name

__all__ = ["DEFAULT_METHODS", "plan_runs", "paper_numbers", "study_header", "run_args", "plan_entry_args",
           "reference_method", "recipe_digest", "plan_conflicts"]

DEFAULT_METHODS = ["impulse", "mimetic", "torch"]


def plan_runs(methods: list[str], seeds: int) -> list[tuple[str, int, str]]:
    """``(method, seed, run_name)`` for every method × seed ``0..seeds-1``, method-major. A run name is a folder
    name of the study (``<method>-s<seed>``), so each method must be one folder name
    (:func:`impulsevit.io.check_child_name`).

    Raises:
        ConfigError: ``seeds`` < 1, no method, or a method that is not one folder name (``../x``, ``a/b``, ...).
    """
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"--seeds {seeds!r}: must be a whole number >= 1 (the runs use seeds 0..N-1)")
    if not methods:
        raise ConfigError("--methods is empty: give comma-separated init methods, e.g. impulse,torch")
    for m in methods:
        check_child_name(m, "--methods", "each method names a run folder <method>-s<seed> inside the study, so it "
                                         "must be one folder name")
    return [(m, s, f"{m}-s{s}") for m in methods for s in range(seeds)]


def _header(recipe_path: str | os.PathLike, key: str) -> Any:
    """The YAML value of the header comment line ``# <key>: <value>`` of a recipe (None when absent). The header is
    the run of comment / blank lines at the top of the file."""
    for line in Path(recipe_path).read_text().splitlines():
        s = line.strip()
        if not s.startswith("#"):
            if s:
                break
            continue
        body = s.lstrip("#").strip()
        if body.startswith(f"{key}:"):
            try:
                return yaml.safe_load(body[len(key) + 1:].strip())
            except yaml.YAMLError as e:
                raise ValueError(f"{recipe_path}: '# {key}:' header is not valid YAML: {e}") from e
    return None


def paper_numbers(recipe_path: str | os.PathLike) -> dict[str, float]:
    """The ``# paper: {...}`` header of a recipe file as ``{method: top-1 %}`` (empty when absent)."""
    value = _header(recipe_path, "paper")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{recipe_path}: '# paper:' header must be a mapping method -> top-1, got {value!r}")
    return {str(k): float(v) for k, v in value.items()}


def study_header(recipe_path: str | os.PathLike) -> dict[str, Any]:
    """The ``# study: {methods: [...], overrides: {method: [fit args]}, reference: method}`` header as ``{"methods":
    list[str] | None, "overrides": dict[str, list[str]], "reference": str | None}`` (empty / None when absent).
    ``reference`` names the method the report's paired differences are taken against (:func:`reference_method`).

    Raises:
        ValueError: naming the recipe file, when the header has other keys or values of the wrong type.
    """
    value = _header(recipe_path, "study")
    if value is None:
        return {"methods": None, "overrides": {}, "reference": None}
    if not isinstance(value, dict) or set(value) - {"methods", "overrides", "reference"}:
        raise ValueError(f"{recipe_path}: '# study:' header must be a mapping with keys 'methods' (list of init "
                         f"methods), 'overrides' (method -> list of fit arguments) and/or 'reference' (the method "
                         f"paired differences are taken against), got {value!r}")
    reference = value.get("reference")
    if reference is not None and not isinstance(reference, str):
        raise ValueError(f"{recipe_path}: '# study:' reference must be one method name, got {reference!r}")
    methods = value.get("methods")
    if methods is not None and (not isinstance(methods, list) or not all(isinstance(m, str) for m in methods)):
        raise ValueError(f"{recipe_path}: '# study:' methods must be a list of method names, got {methods!r}")
    overrides = value.get("overrides") or {}
    if not isinstance(overrides, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) and a.startswith("--") for a in v) for v in overrides.values()
    ):
        raise ValueError(f"{recipe_path}: '# study:' overrides must map a method to a list of '--key=value' fit "
                         f"arguments, got {overrides!r}")
    return {"methods": methods, "overrides": {str(k): list(v) for k, v in overrides.items()}, "reference": reference}


def reference_method(methods: list[str], given: str | None = None, header: str | None = None,
                     recipe: str | os.PathLike | None = None) -> str:
    """The method a study's paired differences are taken against: ``given`` (``--reference``), else ``header`` (the
    recipe's ``# study: {reference: ...}``), else ``torch`` when it is one of ``methods``, else the first method.

    Raises:
        ConfigError: the chosen reference is not one of ``methods`` (names where it came from and the methods).
    """
    if not methods:
        raise ConfigError("the study has no methods, so there is no reference method")
    ref = given if given is not None else header
    if ref is None:
        ref = "torch" if "torch" in methods else methods[0]
    if ref not in methods:
        where = "--reference" if given is not None else f"{recipe}: '# study:' reference"
        raise ConfigError(f"{where} {ref!r} is not a method of this study (methods: {', '.join(methods)}); the paired "
                          f"differences need the reference among the methods")
    return ref


def run_args(method: str, seed: int, method_overrides: dict[str, list[str]] | None = None) -> list[str]:
    """The ``impulsevit fit`` arguments that make one run of a study: init method and seed, the global seed, then the
    method's overrides from the recipe's ``# study:`` header."""
    return [f"--model.init.method={method}", f"--model.init.seed={seed}", f"--seed_everything={seed}",
            *(method_overrides or {}).get(method, [])]


def plan_entry_args(run: dict[str, Any]) -> list[str]:
    """A ``study.json`` plan entry's fit arguments (plans written before per-run ``args`` existed: method and seed
    only)."""
    return run["args"] if "args" in run else run_args(run["method"], int(run["seed"]))


def recipe_digest(recipe_path: str | os.PathLike) -> str:
    """SHA-256 of the recipe's settings (its YAML parsed, keys sorted: comments, layout and the file's place do not
    count), recorded in ``study.json`` as ``recipe_sha256``."""
    import hashlib
    import json

    settings = yaml.safe_load(Path(recipe_path).read_text())
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def plan_conflicts(stored: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """How the plan ``new`` would run differently what the plan ``stored`` (a study folder's ``study.json``)
    already planned: the study's overrides, the recipe's settings (when both plans record ``recipe_sha256``), the
    arguments of each run both plans name, and the downstream stage's arguments and recipe (``--then``, when both
    plans have one). Empty when ``new`` only adds runs (more seeds, more methods) or plans
    fewer. Pure: the caller decides what a conflict stops."""
    out = []
    if list(stored.get("overrides") or []) != list(new.get("overrides") or []):
        out.append(f"overrides {stored.get('overrides') or []} then, {new.get('overrides') or []} now")
    old_sha, new_sha = stored.get("recipe_sha256"), new.get("recipe_sha256")
    if old_sha and new_sha and old_sha != new_sha:
        out.append(f"the recipe's settings changed ({stored.get('recipe')} then, {new.get('recipe')} now)")
    old_then, new_then = stored.get("then") or {}, new.get("then") or {}
    if old_then and new_then:
        if list(old_then.get("args") or []) != list(new_then.get("args") or []):
            out.append(f"--then-args {old_then.get('args') or []} then, {new_then.get('args') or []} now")
        if old_then.get("recipe_sha256") and new_then.get("recipe_sha256") and \
                old_then["recipe_sha256"] != new_then["recipe_sha256"]:
            out.append(f"the --then recipe's settings changed ({old_then.get('recipe')} then, "
                       f"{new_then.get('recipe')} now)")
    then = {r.get("name"): r.get("args") for r in stored.get("runs") or []}
    for run in new.get("runs") or []:
        if run["name"] in then and then[run["name"]] != run["args"]:
            out.append(f"run {run['name']}: {then[run['name']]} then, {run['args']} now")
    return out
