"""Check the installed dependency versions against setup.cfg's ranges and the compat table; print them; exit 1 listing
what does not fit.

    python scripts/check_pins.py [--strict] [--setup-cfg PATH] [--compat PATH] [--constraints PATH]

Three sources, each read as text (nothing of impulsevit is imported, so this runs before the package works):

- ``install_requires`` and every ``extras_require`` group of setup.cfg: the ranges users get. A required
  distribution that is missing or outside its range fails; an extra's distribution that is not installed is listed
  as such (extras are optional, e.g. ``IMPULSEVIT_NO_FFCV=1``), one that is installed must lie in its range.
  Environment markers are honoured.
- ``CHECKED_ON`` of ``impulsevit/_compat/__init__.py`` (the compat table): per library whose private members this
  package uses, the versions on which those uses were checked. An installed version outside its row is reported
  ``UNCHECKED`` (run ``tests/house/test_compat.py`` and the suite on it, then widen the row); with ``--strict`` (what
  ``scripts/test.sh`` passes: CI must run checked versions) it fails. Without it, it is a warning: a user's newer
  release is not refused.
- ``constraints/ci.txt``: the exact versions CI installs, printed beside the installed ones (not enforced here).

Exit status: 0 when everything fits, 1 otherwise, 2 when a file cannot be read.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CFG = ROOT / "setup.cfg"
DEFAULT_COMPAT = ROOT / "impulsevit" / "_compat" / "__init__.py"
DEFAULT_CONSTRAINTS = ROOT / "constraints" / "ci.txt"


def read_pins(setup_cfg: Path) -> list[tuple[Requirement, str | None]]:
    """``(requirement, extra)`` for ``install_requires`` (extra None) then each extras group, in file order."""
    cfg = configparser.ConfigParser()
    if not cfg.read(setup_cfg):
        raise FileNotFoundError(f"{setup_cfg}: not found")
    groups: list[tuple[str | None, str]] = [(None, cfg.get("options", "install_requires", fallback=""))]
    if cfg.has_section("options.extras_require"):
        groups += list(cfg.items("options.extras_require"))
    out = []
    for extra, block in groups:
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                out.append((Requirement(line), extra))
            except InvalidRequirement as e:
                group = "install_requires" if extra is None else f"extra {extra}"
                raise ValueError(f"{setup_cfg}: bad requirement {line!r} in {group}: {e}") from e
    return out


def read_compat_table(path: Path) -> dict[str, SpecifierSet]:
    """``CHECKED_ON`` of the compat package, read from its source (a literal dict: library -> specifier)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else \
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id == "CHECKED_ON" and node.value is not None:
            table = ast.literal_eval(node.value)
            return {lib: SpecifierSet(spec) for lib, spec in table.items()}
    raise ValueError(f"{path}: no CHECKED_ON table")


def read_constraints(path: Path) -> dict[str, str]:
    """distribution name (normalised as ``packaging`` does) -> the exact version ``path`` pins."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            exact = [s.version for s in req.specifier if s.operator == "=="]
            if exact:
                out[req.name.lower()] = exact[0]
    return out


def check(setup_cfg: Path, compat: Path = DEFAULT_COMPAT, constraints: Path | None = DEFAULT_CONSTRAINTS,
          strict: bool = False) -> tuple[list[str], list[str], list[str]]:
    """``(report lines, problems, warnings)``: one line per requirement (range, CI pin, compat row, installed
    version, verdict); a problem per required distribution that is missing, any installed one outside its range,
    and (``strict``) an installed library outside its compat row; a warning for the latter otherwise."""
    table = read_compat_table(compat) if compat.exists() else {}
    ci = read_constraints(constraints) if constraints is not None and constraints.exists() else {}
    lines, problems, warnings = [], [], []
    for req, extra in read_pins(setup_cfg):
        if req.marker is not None and not req.marker.evaluate({"extra": extra or ""}):
            continue
        pin = str(req.specifier) or "(any)"
        where = "" if extra is None else f" [extra {extra}]"
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        row = table.get(req.name)
        if have is None:
            verdict = "not installed (optional)" if extra else "MISSING"
            if extra is None:
                problems.append(f"{req.name}{where}: required {pin}, not installed")
        elif not req.specifier.contains(have, prereleases=True):
            verdict = "OUTSIDE RANGE"
            problems.append(f"{req.name}{where}: installed {have}, setup.cfg allows {pin}")
        elif row is not None and not row.contains(have, prereleases=True):
            verdict = "UNCHECKED"
            text = (f"{req.name}: installed {have}, the compat table (impulsevit._compat.CHECKED_ON) was checked on "
                    f"{row}; run tests/house/test_compat.py and the suite on it, then widen the row")
            (problems if strict else warnings).append(text)
        else:
            verdict = "ok"
        lines.append(f"  {req.name + where:<32} {pin:<14} {ci.get(req.name.lower(), '-'):<10} "
                     f"{str(row) if row is not None else '-':<14} {have or '-':<12} {verdict}")
    return lines, problems, warnings


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setup-cfg", type=Path, default=DEFAULT_CFG)
    p.add_argument("--compat", type=Path, default=DEFAULT_COMPAT, help="the file holding CHECKED_ON")
    p.add_argument("--constraints", type=Path, default=DEFAULT_CONSTRAINTS)
    p.add_argument("--strict", action="store_true",
                   help="an installed version outside the compat table fails (CI); else it is a warning")
    args = p.parse_args(argv)
    try:
        lines, problems, warnings = check(args.setup_cfg, args.compat, args.constraints, strict=args.strict)
    except (OSError, ValueError, SyntaxError) as e:
        print(f"[pins] {e}", file=sys.stderr)
        return 2
    print(f"[pins] {args.setup_cfg} vs {sys.executable}:")
    print(f"  {'distribution':<32} {'range':<14} {'CI pin':<10} {'checked on':<14} {'installed':<12} verdict")
    print("\n".join(lines))
    for w in warnings:
        print(f"[pins] warning: {w}", file=sys.stderr)
    if problems:
        print("[pins] FAILED:", file=sys.stderr)
        print("\n".join(f"  {x}" for x in problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
