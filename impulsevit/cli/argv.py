"""The command line as LightningCLI gets it: the subcommand first, recipe names resolved to files (and checked to be
valid YAML), a default ``--name``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from impulsevit.cli.subcommands import ALL_SUBCOMMANDS, TRAINER_SUBCOMMANDS
from impulsevit.errors import ConfigError
from impulsevit.run.recipes import resolve_recipe

_CONFIG_FLAGS = ("--recipe", "--config", "-c")
_NO_VALUE_FLAGS = ("-h", "--help", "--print_config", "--overwrite", "--untrained", "--trust-checkpoint",
                   "--trust_checkpoint")


def _option_name(token: str) -> str | None:
    return token.split("=", 1)[0] if token.startswith("-") else None


def _subcommand_index(argv: list[str]) -> int | None:
    """Position of the first bare subcommand token (not the value of a preceding option), or ``None``."""
    for i, tok in enumerate(argv):
        if tok in ALL_SUBCOMMANDS:
            prev = argv[i - 1] if i else ""
            takes_value = prev.startswith("-") and "=" not in prev and prev not in _NO_VALUE_FLAGS
            if not takes_value:
                return i
    return None


def prepare_argv(argv: list[str]) -> list[str]:
    """Normalise a command line for LightningCLI.

    - moves a subcommand given after options to the front (``--recipe x fit`` -> ``fit --recipe x``; Lightning#21245);
    - resolves every ``--recipe`` / ``--config`` / ``-c`` value that is not an existing file as a recipe name;
    - inserts ``--name=<stem of the first --recipe>`` right after the subcommand when no ``--name`` is given (a
      ``name:`` in the recipe or a later ``--name`` still wins);
    - a recipe's ``model.init.options`` belong to its ``model.init.method``: ``--model.init.method=OTHER`` without
      ``--model.init.options`` starts OTHER from no options (``--model.init.options={}`` inserted, one notice on
      stderr), so ``fit --recipe cpu_fmnist_mixer --model.init.method=torch`` and a study's runs work as written.

    Raises:
        RecipeNotFoundError: a recipe value is neither a file nor a known recipe (names the closest ones).
        RecipeSyntaxError: a recipe file is not valid YAML.
    """
    argv = _subcommand_first(list(argv))
    if not argv or argv[0] not in TRAINER_SUBCOMMANDS:
        return argv
    out: list[str] = [argv[0]]
    first_recipe: Path | None = None
    configs: list[Path] = []
    gives_name = False
    rest: list[str | None] = list(argv[1:])
    for i in range(len(rest) - 1):  # `--a.init_args.b.c null` as `--a.init_args.b.c=null` (see null_nested)
        tok = rest[i]
        if tok is not None and ".init_args." in (_option_name(tok) or "") and "=" not in tok and rest[i + 1] in _NULLS:
            rest[i], rest[i + 1] = f"{tok}={rest[i + 1]}", None
    tokens = iter([null_nested(tok) for tok in rest if tok is not None])
    for tok in tokens:
        flag = _option_name(tok)
        value = None
        if flag in _CONFIG_FLAGS:
            value = tok.split("=", 1)[1] if "=" in tok else next(tokens, None)
        if value is None:  # not a config flag, or one without a value (the parser reports that)
            gives_name |= flag == "--name"
            out.append(tok)
            continue
        path = resolve_recipe(value)
        check_recipe_syntax(path)
        if flag == "--recipe" and first_recipe is None:
            first_recipe = path
        configs.append(path)
        out += [flag, str(path)]
    if first_recipe is not None and not gives_name:
        out.insert(1, f"--name={first_recipe.stem}")
    return _options_follow_method(out, configs)


def _recipe_init(configs: list[Path]) -> dict[str, Any]:
    """The ``model.init`` mapping the recipe files set, later files over earlier ones (``{}`` when none)."""
    import yaml

    init: dict[str, Any] = {}
    for path in configs:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        block = (loaded.get("model") or {}).get("init") if isinstance(loaded.get("model"), dict) else None
        if isinstance(block, dict):
            init.update(block)
    return init


def _options_follow_method(argv: list[str], configs: list[Path]) -> list[str]:
    """``argv`` with ``--model.init.options={}`` after a ``--model.init.method`` that changes the recipe's method
    while the recipe gives options and the command line none (see :func:`prepare_argv`)."""
    import sys

    names = [_option_name(tok) for tok in argv]
    if any(n in ("--model.init.options", "--model.init") or (n or "").startswith("--model.init.options.")
           for n in names):
        return argv
    init = _recipe_init(configs) if configs else {}
    options = init.get("options")
    if not options or "--model.init.method" not in names:
        return argv
    at = max(i for i, n in enumerate(names) if n == "--model.init.method")
    tok = argv[at]
    method = tok.split("=", 1)[1] if "=" in tok else (argv[at + 1] if at + 1 < len(argv) else None)
    if method is None or method == init.get("method", "impulse"):
        return argv
    end = at + 1 if "=" in tok else at + 2
    print(f"impulsevit: the recipe's model.init.options {options} are for {init.get('method', 'impulse')!r}; "
          f"--model.init.method={method} starts from none (give --model.init.options to set {method}'s)",
          file=sys.stderr)
    return [*argv[:end], "--model.init.options={}", *argv[end:]]


_NULLS = ("null", "Null", "NULL", "~", "None")


def null_nested(token: str) -> str:
    """``--data.init_args.augment.auto_augment=null`` as ``--data.init_args.augment={"auto_augment": null}``:
    a null for a key nested below a class's argument (a dataclass block inside ``init_args``) becomes None.

    jsonargparse (4.x) hands such a value down one level as text, so a null arrives as the string ``'None'``
    (``str | None``) or fails to parse (``float | None``); one level up, as a mapping, it is a real None and the
    block's other values (from the recipe) are kept. Other tokens are returned unchanged."""
    if not token.startswith("--") or "=" not in token:
        return token
    key, value = token[2:].split("=", 1)
    head, sep, rest = key.partition(".init_args.")
    if not sep or "." not in rest or value.strip() not in _NULLS:
        return token
    block, *inner = rest.split(".")
    nested: Any = None
    for part in reversed(inner):
        nested = {part: nested}
    return f"--{head}.init_args.{block}={json.dumps(nested)}"


def _subcommand_first(argv: list[str]) -> list[str]:
    """``argv`` with a subcommand given after options moved to the front (not when asking for help)."""
    if argv and argv[0] not in ALL_SUBCOMMANDS and not (set(argv) & {"-h", "--help"}):
        idx = _subcommand_index(argv)
        if idx is not None:
            argv.insert(0, argv.pop(idx))
    return argv


class RecipeSyntaxError(ConfigError):
    """A recipe file is not valid YAML (the message names the file, line and column)."""


def check_recipe_syntax(path: Path) -> None:
    """Raise :class:`RecipeSyntaxError` naming ``path`` when it is not valid YAML, or not a mapping (an empty file:
    jsonargparse would report ``Unexpected config:`` or the error against ``<unicode string>``, without the file)."""
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeSyntaxError(f"{path}{where}: invalid YAML: {what}") from None
    except OSError as e:
        raise RecipeSyntaxError(f"cannot read recipe {path}: {e.strerror or e}") from None
    if not isinstance(loaded, dict):
        what = "is empty" if loaded is None else f"holds a {type(loaded).__name__}, not a mapping"
        raise RecipeSyntaxError(f"recipe {path} {what} (expected keys such as trainer:, model:, data:)")
