"""The import rules of docs/design.md ("Layers"), checked on the source: every ``import`` inside impulsevit, at module
level or inside a function, must go to an allowed layer or to a leaf module (one with no impulsevit imports); each
module's layer is the row of docs/design.md's layer table that names it (every module is named there); there is no
import cycle; and the data sub-packages keep their own rules."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "impulsevit"

DESIGN = PKG.parent / "docs" / "design.md"

# layer -> the layers it may import (leaf modules are allowed from anywhere)
ALLOWED = {0: {0}, 1: {0, 1}, 2: {0, 1, 2}, 3: {0, 3}, 4: {0, 4}, 5: {0, 1, 2, 3, 4, 5}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def layer_table() -> dict[str, int]:
    """docs/design.md's layer table: each path of its "packages / modules" column (relative to ``impulsevit/``; a
    folder ends with ``/``) -> the row's layer number."""
    text = DESIGN.read_text()
    section = text[text.index("## Layers"):text.index("## Where a change goes")]
    out: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\| (\d+)\. [^|]*\| ([^|]*) \|", line)
        if row:
            for path in re.findall(r"`([^`]+(?:\.py|/))`", row.group(2)):  # files and folders, not commands
                out[path.removeprefix("impulsevit/")] = int(row.group(1))
    return out


def table_entry(name: str) -> str | None:
    """The most specific path of the layer table that covers module ``name`` (a file named exactly, or a folder
    holding it), or None."""
    path = str(MODULES[name].relative_to(PKG))
    covering = [p for p in layer_table() if p == path or (p.endswith("/") and path.startswith(p))]
    return max(covering, key=len, default=None)


def layer(name: str) -> int:
    """The layer docs/design.md's table gives module ``name``: 0 shared leaves, 1 init, 2 training, 3 data,
    4 cluster, 5 entry points."""
    entry = table_entry(name)
    assert entry is not None, f"{name} is not in docs/design.md's layer table"
    return layer_table()[entry]


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
    """Every module this file imports (absolute names; ``from a import b`` is ``a.b`` when that is a module, and ``a``
    too only when some name is not a module)."""
    out = set()
    for module, names in _parsed()[str(path)]:
        submodules = {f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES}
        if not names or len(submodules) < len(names):  # `from pkg import sub` alone does not use pkg's own names
            out.add(module)
        out |= submodules
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
    """The parser finds the imports the layers are about (so an empty result above is not a parsing failure), and
    the table gives the layers the design names."""
    assert "impulsevit.init.api" in internal("impulsevit.init.vit")
    assert "impulsevit.recipes" in internal("impulsevit.cluster.submit")  # `from impulsevit import recipes`
    assert layer("impulsevit.study.launch") == 5 and layer("impulsevit.callbacks.initializer") == 2
    assert "impulsevit.cli.argv" in internal("impulsevit.cli.entry")  # the CLI package's own modules
    assert "impulsevit.cli.trainer_cli" in internal("impulsevit.preview") and layer("impulsevit.cli.trainer_cli") == 5
    assert "impulsevit.data.storage.locking" in internal("impulsevit.data.sources.download")  # inside a function
    assert layer("impulsevit.cluster.submit") == 5 and layer("impulsevit.cluster.sbatch") == 4
    assert layer("impulsevit.data.loading.config") == 3 and layer("impulsevit.config") == 2
    assert layer("impulsevit.io") == 0 and layer("impulsevit.rundir") == 5
    assert ("impulsevit.cli.entry", "impulsevit.cluster.submit") in edges()


def test_every_module_is_in_the_design_layer_table():
    """Every module of the package is covered by a path of docs/design.md's layer table, and every path there names
    something that exists."""
    missing = sorted(m for m in MODULES if table_entry(m) is None)
    assert not missing, "modules missing from docs/design.md's layer table:\n" + "\n".join(missing)
    stale = sorted(p for p in layer_table() if not (PKG / p).exists())
    assert not stale, f"docs/design.md's layer table names paths that do not exist: {stale}"


def provider_modules() -> dict[str, str]:
    """The modules ``impulsevit`` loads by import string for its subcommands (``cli/entry.py``'s ``PROVIDERS``)."""
    from impulsevit.cli.entry import PROVIDERS
    from impulsevit.cli.subcommands import EXTERNAL_SUBCOMMANDS

    assert set(PROVIDERS) == set(EXTERNAL_SUBCOMMANDS), "every external subcommand name has exactly one provider"
    return {sub: module for sub, (module, _) in PROVIDERS.items()}


@functools.cache
def edges() -> frozenset[tuple[str, str]]:
    """Every import between impulsevit modules (module level and inside functions; not the implicit import of a
    parent package), plus the dispatcher's imports by string."""
    out = {(src, dst) for src in MODULES for dst in internal(src)}
    out |= {("impulsevit.cli.entry", m) for m in provider_modules().values()}
    return frozenset(out)


def test_no_import_cycle():
    """No chain of imports leads from a module back to itself (Tarjan's strongly connected components)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for src, dst in edges():
        graph[src].add(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles among impulsevit modules:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_data_sub_packages_keep_their_rules():
    """``data/sources`` and ``data/storage`` (the registry, readers, download, conversion) import neither Lightning
    nor the loading / augmentation code; ``data/augment`` imports no other data sub-package."""
    bad = []
    for name, path in MODULES.items():
        if _in(name, "impulsevit.data.sources") or _in(name, "impulsevit.data.storage"):
            lightning = {m for m in imports(path) if m.split(".")[0] in ("lightning", "pytorch_lightning")}
            upward = {m for m in internal(name)
                      if _in(m, "impulsevit.data.loading") or _in(m, "impulsevit.data.augment")}
            bad += [f"{name} imports {m}" for m in sorted(lightning | upward)]
        if _in(name, "impulsevit.data.augment"):
            bad += [f"{name} imports {m}" for m in sorted(internal(name))
                    if _in(m, "impulsevit.data") and not _in(m, "impulsevit.data.augment")]
    assert not bad, "against docs/design.md's data rows:\n" + "\n".join(bad)


def test_every_callback_lives_in_callbacks():
    """docs/design.md: the package's Lightning callbacks (classes deriving from ``Callback``, ``ModelCheckpoint``,
    ``SaveConfigCallback`` or a progress bar / model summary) are all in ``impulsevit/callbacks/``."""
    pattern = re.compile(r"^class \w+\([^)]*(Callback|ModelCheckpoint|ProgressBar|ModelSummary)\b", re.M)
    outside = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
               if pattern.search(p.read_text()) and p.relative_to(PKG).parts[0] != "callbacks"]
    assert not outside, f"callbacks outside impulsevit/callbacks/: {outside}"
    assert pattern.search((PKG / "callbacks" / "config_saver.py").read_text())  # the pattern finds a real one
