"""The import rules of docs/design.md ("Layers"), checked on the source: each module's layer is the layer of its folder
(docs/design.md's layer table lists folders: ``training/``, ``run/``, ...; the package's root files ``*.py`` are the
leaves at the bottom; ``__init__.py`` is the public face above everything); every ``import`` inside impulsevit, at
module level or inside a function, goes to the same or an allowed lower layer (no exception but the public face);
nothing imports the public face; there is no import cycle, the root package included; and the data sub-packages keep
their own rules."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "impulsevit"

DESIGN = PKG.parent / "docs" / "design.md"

ROOT = "impulsevit"  # the package's __init__.py: the lazy public face
FACE = 99  # its layer: above every other one

# layer -> the layers it may import: 0 leaves, 1 init, 2 training, 3 data, 4 cluster, 5 run, 6 entry points
ALLOWED = {0: {0}, 1: {0, 1}, 2: {0, 1, 2}, 3: {0, 3}, 4: {0, 4}, 5: {0, 1, 2, 3, 4, 5}, 6: {0, 1, 2, 3, 4, 5, 6},
           FACE: {0, 1, 2, 3, 4, 5, 6}}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def layer_table() -> dict[str, int]:
    """docs/design.md's layer table: each entry of its "folders" column (relative to ``impulsevit/``: a folder ending
    with ``/``, ``*.py`` for the root files, ``__init__.py`` for the public face) -> the row's layer number (the
    public face: :data:`FACE`)."""
    text = DESIGN.read_text()
    section = text[text.index("## Layers"):text.index("## Where a change goes")]
    out: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\| (\d+|top)\. [^|]*\| ([^|]*) \|", line)
        if row:
            number = FACE if row.group(1) == "top" else int(row.group(1))
            for path in re.findall(r"`([\w*.]+(?:/|\.py))`", row.group(2)):
                out[path.removeprefix("impulsevit/")] = number
    return out


def folder(name: str) -> str:
    """The entry of the layer table that holds module ``name``: its top folder under ``impulsevit/`` (``training/``),
    ``*.py`` for a file at the root, ``__init__.py`` / ``__main__.py`` for the root package itself and its
    ``python -m`` entry."""
    parts = MODULES[name].relative_to(PKG).parts
    if len(parts) > 1:
        return parts[0] + "/"
    return parts[0] if parts[0] in ("__init__.py", "__main__.py") else "*.py"


def layer(name: str) -> int:
    """The layer of module ``name``'s folder: 0 leaves, 1 init, 2 training, 3 data, 4 cluster, 5 run, 6 entry
    points, :data:`FACE` the public face."""
    entry = folder(name)
    assert entry in layer_table(), f"{name}: its folder {entry} is not in docs/design.md's layer table"
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
    """The impulsevit modules ``name`` imports, the root package (``import impulsevit``) included."""
    return {m for m in imports(MODULES[name]) if m in MODULES} - {name}


def test_every_import_respects_the_layers():
    """No arrow runs up: every import goes to the importer's own layer or one it may build on, its own package aside;
    the one exception is the public face (``impulsevit/__init__.py``), which nothing imports."""
    bad = []
    for src in sorted(MODULES):
        for dst in sorted(internal(src)):
            if dst == ROOT:
                bad.append(f"{src} imports the public face {ROOT} (import the module that defines the name)")
                continue
            if dst.startswith(src + ".") or (src != ROOT and src.startswith(dst + ".")):  # own package
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
    assert "impulsevit.run.recipes" in internal("impulsevit.cli.submit")
    assert layer("impulsevit.study.launch") == 6 and layer("impulsevit.callbacks.initializer") == 2
    assert "impulsevit.cli.argv" in internal("impulsevit.cli.entry")  # the CLI package's own modules
    assert layer("impulsevit.tools.preview") == 6
    assert "impulsevit.data.locking" in internal("impulsevit.data.sources.download")  # inside a function
    assert "impulsevit.training.module" in internal(ROOT) and layer(ROOT) == FACE  # the lazy public face
    assert layer("impulsevit.cli.submit") == 6 and layer("impulsevit.cluster.sbatch") == 4
    assert layer("impulsevit.data.loading.config") == 3 and layer("impulsevit.training.config") == 2
    assert layer("impulsevit.io") == 0 and layer("impulsevit.env") == 0 and layer("impulsevit.run.rundir") == 5
    assert layer("impulsevit._compat.lightning") == 0 and layer("impulsevit.models.convmixer") == 1
    assert ("impulsevit.cli.entry", "impulsevit.cli.submit") in edges()


def test_every_folder_is_in_the_design_layer_table():
    """Every folder of the package (and its root files, and its public face) has a row of docs/design.md's layer
    table, and every entry there names something that exists."""
    missing = sorted({folder(m) for m in MODULES} - set(layer_table()))
    assert not missing, f"folders missing from docs/design.md's layer table: {missing}"
    stale = sorted(p for p in layer_table() if p != "*.py" and not (PKG / p).exists())
    assert not stale, f"docs/design.md's layer table names paths that do not exist: {stale}"


def test_nothing_inside_imports_an_old_module_path():
    """The package imports its modules by their paths now, never by an alias of ``impulsevit/_aliases.py`` (an alias
    is for users' code and old configs; inside, it would hide an edge from the rules above)."""
    from impulsevit._aliases import MOVED

    bad = sorted(f"{src} imports {old} (now {MOVED[old]})" for src, path in MODULES.items()
                 for old in imports(path) if old in MOVED)
    assert not bad, "\n".join(bad)


def test_slurm_environment_is_read_in_one_place():
    """``SLURM_RESTART_COUNT`` / ``SLURM_JOB_ID`` are read by :mod:`impulsevit.env` only (the SLURM batch scripts
    that :mod:`impulsevit.cluster.sbatch` renders print them as shell text, which is not a read here)."""
    readers = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                     if re.search(r"environ[^\n]*[\"'](SLURM_RESTART_COUNT|SLURM_JOB_ID)[\"']", p.read_text()))
    assert readers == ["env.py"], readers


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


def test_every_registering_module_is_a_listed_builtin_family():
    """docs/design.md: the registry imports nothing at run time — the built-in families are imported by name by
    ``impulsevit/init/__init__.py`` (``BUILTIN_FAMILIES``), so those imports are edges the cycle test sees. Every module
    of ``init/`` that calls ``@register(`` is listed (a family file that is not would silently never register), the
    list is what the package imports, and no module of ``init/`` imports by string (``importlib`` / ``pkgutil``)."""
    import impulsevit.init as ii

    init = PKG / "init"
    registering = sorted(p.stem for p in init.glob("*.py")
                         if re.search(r"^@register\(", p.read_text(), re.M))
    assert registering == sorted(ii.BUILTIN_FAMILIES), (registering, ii.BUILTIN_FAMILIES)
    assert {f"impulsevit.init.{m}" for m in ii.BUILTIN_FAMILIES} <= internal("impulsevit.init")
    dynamic = sorted(str(p.relative_to(PKG)) for p in init.rglob("*.py")
                     if {"importlib", "pkgutil"} & {m.split(".")[0] for m in imports(p)})
    assert dynamic == ["init/plugins.py"], dynamic  # the deprecated entry-point / import-path routes (until 0.3.0)
    assert not internal("impulsevit.init.registry"), internal("impulsevit.init.registry")  # below every family


def test_tools_take_built_objects_not_the_command_line():
    """docs/design.md: ``tools/`` takes what it works on built (a datamodule, a checkpoint path) and never imports the
    command line (``cli/``), which imports the tools: no arrow runs back from a tool to ``cli/`` or ``study/``."""
    bad = sorted(f"{src} imports {dst}" for src in MODULES if _in(src, "impulsevit.tools")
                 for dst in internal(src) if _in(dst, "impulsevit.cli") or _in(dst, "impulsevit.study"))
    assert not bad, "\n".join(bad)
    assert "impulsevit.tools.preview" in internal("impulsevit.cli.data_preview")  # the edge runs the other way


def test_design_says_where_every_subcommand_lives():
    """Every subcommand's ``main`` (``cli/entry.py``'s ``PROVIDERS``) is in an entry-point folder or is named, by its
    file, in docs/design.md's layer table (the five that keep their ``main`` beside the lower layer they front)."""
    text = DESIGN.read_text()
    section = text[text.index("## Layers"):text.index("## Where a change goes")]
    unplaced = []
    for sub, module in sorted(provider_modules().items()):
        path = str(MODULES[module].relative_to(PKG))
        if layer(module) != 6 and f"`{path}`" not in section:
            unplaced.append(f"{sub}: {module} ({path}, layer {layer(module)})")
    assert not unplaced, "subcommands whose main docs/design.md does not place:\n" + "\n".join(unplaced)
    assert layer(provider_modules()["runs"]) == 5  # the check sees a real one outside the entry points
