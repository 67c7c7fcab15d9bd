"""The import rules of docs/design.md ("Layers"), checked on the source: every ``import`` inside impulsevit, at module
level or inside a function, must go to an allowed layer or to a leaf module (one with no impulsevit imports)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "impulsevit"

# layer -> the layers it may import (leaf modules are allowed from anywhere)
ALLOWED = {1: {1}, 2: {1, 2}, 3: {3}, 4: {4}, 5: {1, 2, 3, 4, 5}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(name: str) -> int:
    """1 init, 2 training, 3 data, 4 cluster, 5 entry points (anything else at the top level: ``cli/``, ``study/``,
    ``preview.py``, ...)."""
    parts = name.split(".")
    head = parts[1] if len(parts) > 1 else ""
    if head in ("init", "models"):
        return 1
    if head in ("module", "config", "callbacks", "checkpointing", "strategies", "lightning_private", *TRAINING_PARTS):
        return 2
    if name in COMMAND_MODULES:
        return 5
    return {"data": 3, "cluster": 4}.get(head, 5)


TRAINING_PARTS = ("backbone", "datainfo", "ema", "loss", "metrics", "optim", "sharding")
"""The concerns ``module.py``'s ``ImageClassifier`` delegates to, one small module each (layer 2, training)."""

COMMAND_MODULES = {"impulsevit.cluster.submit", "impulsevit.cluster.convert_job"}
"""The ``impulsevit submit`` front end: it parses the forwarded fit configuration with the CLI's own parser, so it
belongs to the entry points even though it lives beside the sbatch code it drives."""


_PARSE = """
import ast, json, sys
out = {}
for path in sys.argv[1:]:
    found = []
    for node in ast.walk(ast.parse(open(path).read(), filename=path)):
        if isinstance(node, ast.Import):
            found += [[a.name, []] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append([node.module, [a.name for a in node.names]])
    out[path] = found
print(json.dumps(out))
"""


@functools.cache
def _parsed() -> dict[str, list]:
    """``[module, [names]]`` per import statement of every package file, parsed in a fresh interpreter: CPython 3.11's
    ``ast.parse`` can fail with "AST constructor recursion depth mismatch" inside a long test session."""
    files = [str(p) for p in PKG.rglob("*.py")]
    out = subprocess.run([sys.executable, "-c", _PARSE, *files], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def imports(path: Path) -> set[str]:
    """Every module this file imports (absolute names; ``from a import b`` is ``a.b`` when that is a module)."""
    out = set()
    for module, names in _parsed()[str(path)]:
        out.add(module)
        out |= {f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES}
    return out


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def internal(name: str) -> set[str]:
    return {m for m in imports(MODULES[name]) if m in MODULES and m != "impulsevit"} - {name}


def test_every_import_respects_the_layers():
    leaves = {m for m in MODULES if not internal(m)}
    bad = []
    for src in sorted(MODULES):
        for dst in sorted(internal(src)):
            if dst in leaves or dst.startswith(src + ".") or src.startswith(dst + "."):  # leaf, or own package
                continue
            if layer(dst) not in ALLOWED[layer(src)]:
                bad.append(f"{src} (layer {layer(src)}) imports {dst} (layer {layer(dst)})")
    assert not bad, "imports against docs/design.md's layers:\n" + "\n".join(bad)


def test_initializers_do_not_import_lightning():
    for name, path in MODULES.items():
        if layer(name) == 1:
            found = {m for m in imports(path) if m.split(".")[0] in ("lightning", "pytorch_lightning")}
            assert not found, f"{name} imports {found}: initializers must work without the trainer"


def test_the_rules_see_real_edges():
    """The parser finds the imports the layers are about (so an empty result above is not a parsing failure)."""
    assert "impulsevit.init.api" in internal("impulsevit.init.vit")
    assert "impulsevit.recipes" in internal("impulsevit.cluster.submit")  # `from impulsevit import recipes`
    assert layer("impulsevit.study.launch") == 5 and layer("impulsevit.callbacks.initializer") == 2
    assert "impulsevit.cli.argv" in internal("impulsevit.cli.entry")  # the CLI package's own modules
    assert "impulsevit.cli" in internal("impulsevit.preview") and layer("impulsevit.cli.trainer_cli") == 5
