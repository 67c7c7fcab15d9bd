"""Enumerate impulsevit's private uses of its libraries, by AST (and, for overrides, by looking at the library classes).

    python tests/_private_uses.py [PACKAGE_DIR]     # one line per use: "path:line: what"

A *private use* is any of:

- an import of a private name or module of a library: ``from X import _y``, ``from X._y import z``, ``import X._y``;
- an attribute chain rooted at a name imported from a library that passes a private member: ``nn.init._fan``,
  ``torch._foreach_norm`` (also through ``getattr``/``hasattr``/``setattr``/``delattr`` with a literal name);
- a private attribute ``obj._name`` whose name impulsevit does not define: for ``self._name`` / ``super()._name``
  inside a class, the class and its impulsevit bases must define it (so ``self._trainer`` in a ``LightningModule`` is
  found even though an unrelated impulsevit class has its own ``_trainer``); for any other object, some impulsevit
  module or class must define it (the *own names*, derived from the AST below, not written by hand);
- a private member of a library class that an impulsevit class defines or assigns (an override of, or a write to,
  the library's ``_name``), found by reading the library classes in each impulsevit class's MRO;
- ``mock.patch*`` aimed at a library (a dotted string naming it, or an object rooted at a library import).

The libraries are :data:`LIBS`; ``impulsevit/_compat/`` is where such uses are allowed and is skipped. Dunder names
are public; :data:`PUBLIC_UNDERSCORE` lists the documented members whose names start with ``_``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import textwrap
from pathlib import Path

LIBS = ("lightning", "lightning_fabric", "pytorch_lightning", "torch", "torchvision", "torchmetrics", "timm", "ffcv",
        "jsonargparse")
PKG = Path(__file__).resolve().parents[1] / "impulsevit"
COMPAT = "_compat"

PUBLIC_UNDERSCORE = {
    "os._exit": "documented in the os module (exit without cleanup, for forked children)",
    "_replace": "namedtuple's documented API", "_asdict": "namedtuple's documented API",
    "_fields": "namedtuple's documented API", "_make": "namedtuple's documented API",
}
PATCHERS = {"patch", "object", "dict", "multiple"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_lib(module: str) -> bool:
    return module.split(".")[0] in LIBS


def _chain(node: ast.AST) -> tuple[ast.AST, list[str]]:
    """``(root, [attr, ...])`` of ``root.a.b.c`` (root is the innermost non-attribute expression)."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return node, attrs[::-1]


def _files(pkg: Path) -> list[Path]:
    return sorted(p for p in pkg.rglob("*.py") if COMPAT not in p.relative_to(pkg).parts)


class _Module:
    """One parsed impulsevit file: its library imports, classes and the private names it defines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text(), filename=str(path))
        self.lib_names: dict[str, str] = {}  # local name -> dotted library origin
        self.other_imports: dict[str, str] = {}  # local name -> dotted origin (stdlib, impulsevit, ...)
        self.defined: set[str] = set()  # private names defined at module level or as attributes by this module
        self.classes: dict[str, tuple[list[str], set[str]]] = {}  # class name -> (base names, own private names)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    target = self.lib_names if _is_lib(a.name) else self.other_imports
                    target[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    target = self.lib_names if _is_lib(node.module) else self.other_imports
                    target[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.ClassDef):
                own = set()
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(sub.name):
                        own.add(sub.name)
                    elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and _private(sub.id):
                        own.add(sub.id)
                    elif (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and _private(sub.attr)
                          and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls")):
                        own.add(sub.attr)
                self.classes[node.name] = ([ast.unparse(b) for b in node.bases], own)
        for node in self.tree.body:  # module level: functions, classes, assignments
            for sub in ast.walk(node) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.If, ast.Try)) else [node]:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(sub.name):
                    self.defined.add(sub.name)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and _private(sub.id):
                    self.defined.add(sub.id)
        for node in ast.walk(self.tree):  # attributes impulsevit sets on its own objects (fn._x = ..., obj._x = ...)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                root, _ = _chain(node)
                if not (isinstance(root, ast.Name) and root.id in self.lib_names):
                    self.defined.add(node.attr)
        for own in (o for _, o in self.classes.values()):
            self.defined |= own


def own_names(modules: list[_Module]) -> set[str]:
    """Every private name some impulsevit module defines (module level, class members, attributes it assigns)."""
    return set().union(*(m.defined for m in modules))


def _class_own(modules: list[_Module], name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The private names an impulsevit class ``name`` and its impulsevit bases (found by name) define."""
    out: set[str] = set()
    for m in modules:
        if name in m.classes and name not in seen:
            bases, own = m.classes[name]
            out |= own
            for b in bases:
                out |= _class_own(modules, b.split(".")[-1], seen | {name})
    return out


def _static_uses(m: _Module, modules: list[_Module], owned: set[str]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    for node in ast.walk(m.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_lib(a.name) and any(_private(p) for p in a.name.split(".")):
                    found.append((node.lineno, f"import {a.name}"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _is_lib(node.module):
            for a in node.names:
                if any(_private(p) for p in node.module.split(".")) or _private(a.name):
                    found.append((node.lineno, f"from {node.module} import {a.name}"))

    def check(node: ast.AST, root: ast.AST, attrs: list[str], cls: str | None) -> None:
        if not any(_private(a) for a in attrs):
            return
        last = next(i for i, a in enumerate(attrs) if _private(a))
        dotted = ".".join(attrs[: last + 1])
        if isinstance(root, ast.Name) and root.id in m.lib_names:
            found.append((node.lineno, f"{m.lib_names[root.id]}.{dotted}"))
            return
        name = attrs[last]
        if isinstance(root, ast.Name) and root.id in m.other_imports and last == 0:
            origin = m.other_imports[root.id]
            if origin.split(".")[0] == "impulsevit" and name in owned:
                return
            if f"{origin}.{name}" not in PUBLIC_UNDERSCORE:
                found.append((node.lineno, f"{origin}.{dotted}"))
            return
        is_self = isinstance(root, ast.Name) and root.id in ("self", "cls") and last == 0
        is_super = (isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "super"
                    and last == 0)
        if cls is not None and (is_self or is_super):
            mine = _class_own(modules, cls)
            if is_super:
                mine = set().union(*(_class_own(modules, b.split(".")[-1]) for b in m.classes[cls][0]))
            if name not in mine:
                who = "super()" if is_super else root.id  # type: ignore[union-attr]
                found.append((node.lineno, f"{cls}: {who}.{name} (not defined by {cls} or its impulsevit bases)"))
            return
        if name not in owned and name not in PUBLIC_UNDERSCORE:
            found.append((node.lineno, f"{ast.unparse(root)}.{dotted} (no impulsevit module defines {name})"))

    def visit(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.ClassDef) else cls
            if isinstance(child, ast.Attribute) and not _is_inner(child, node):  # each whole chain once
                root, attrs = _chain(child)
                check(child, root, attrs, cls)
            elif isinstance(child, ast.Call):
                _check_call(child, cls)
            visit(child, inner)

    def _check_call(call: ast.Call, cls: str | None) -> None:
        fn = call.func
        if (isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr", "setattr", "delattr") and len(call.args) >= 2
                and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str)):
            root, attrs = _chain(call.args[0])
            check(call, root, [*attrs, call.args[1].value], cls)
        root, attrs = _chain(fn)
        names = [root.id] + attrs if isinstance(root, ast.Name) else attrs
        origin = m.other_imports.get(names[0], "") if names else ""
        if ("patch" in names and names[-1] in PATCHERS and "mock" in (origin + "." + ".".join(names)).split(".")
                and call.args):
            target = call.args[0]
            if isinstance(target, ast.Constant) and isinstance(target.value, str) and _is_lib(target.value):
                found.append((call.lineno, f"mock.{'.'.join(names[names.index('patch'):])}({target.value!r})"))
            else:
                troot, tattrs = _chain(target)
                if isinstance(troot, ast.Name) and troot.id in m.lib_names:
                    what = ".".join([m.lib_names[troot.id], *tattrs])
                    extra = [repr(a.value) for a in call.args[1:2] if isinstance(a, ast.Constant)]
                    found.append((call.lineno, f"mock.{'.'.join(names[names.index('patch'):])}({what}"
                                               f"{', ' + extra[0] if extra else ''})"))

    visit(m.tree, None)
    return found


def _is_inner(node: ast.Attribute, parent: ast.AST) -> bool:
    """Whether ``node`` is the ``value`` of an enclosing attribute (then the enclosing chain is checked instead)."""
    return isinstance(parent, ast.Attribute) and parent.value is node


def _library_private_members(cls: type) -> set[str]:
    """The private names a library class defines: its class attributes and the ``self._x`` it assigns in its source."""
    out = {n for n in vars(cls) if _private(n)}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return out
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            out.add(node.attr)
    return out


def _module_name(path: Path, pkg: Path) -> str:
    parts = path.relative_to(pkg.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(m: _Module, expr: ast.AST) -> object:
    """The object a base-class expression of ``m`` names when it is rooted at an imported name, else None."""
    root, attrs = _chain(expr)
    if not isinstance(root, ast.Name):
        return None
    origin = m.lib_names.get(root.id) or m.other_imports.get(root.id)
    if origin is None:
        return None
    parts = [*origin.split("."), *attrs]
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for p in parts[i:]:
                obj = getattr(obj, p)
        except AttributeError:
            return None
        return obj
    return None


def _override_uses(m: _Module, pkg: Path) -> list[tuple[int, str]]:
    """Private members of library base classes that an impulsevit class of ``m`` defines or assigns."""
    if not any(bases for bases, _ in m.classes.values()):
        return []
    try:
        mod = importlib.import_module(_module_name(m.path, pkg))
    except ImportError as e:  # an optional library (FFCV) missing: its module's classes cannot be checked
        return [(0, f"cannot import to check overrides: {e}")]
    found = []
    for node in ast.walk(m.tree):
        if not isinstance(node, ast.ClassDef) or not node.bases:
            continue
        cls = getattr(mod, node.name, None)
        if inspect.isclass(cls):
            mro = list(cls.__mro__[1:])
        else:  # a class defined inside a function: its bases resolved by name (a computed base is skipped)
            mro = [c for base in node.bases for c in getattr(_resolve(m, base), "__mro__", ())]
        lib_private: set[str] = set()
        for base in mro:
            if _is_lib(base.__module__):
                lib_private |= _library_private_members(base)
        for name in sorted(m.classes[node.name][1] & lib_private):
            found.append((node.lineno, f"{node.name}: defines {name}, a private member of a library base class"))
    return found


def private_uses(pkg: Path = PKG) -> list[str]:
    """``"relative/path.py:line: what"`` for every private use outside ``impulsevit/_compat/``."""
    modules = [_Module(p) for p in _files(pkg)]
    owned = own_names(modules)
    out = []
    for m in modules:
        rel = m.path.relative_to(pkg.parent)
        for line, what in sorted(set(_static_uses(m, modules, owned) + _override_uses(m, pkg))):
            out.append(f"{rel}:{line}: {what}")
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else PKG
    sys.path.insert(0, str(target.parent))
    print("\n".join(private_uses(target)))
