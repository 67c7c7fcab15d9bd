"""Check that the installed dependency versions satisfy setup.cfg's pins; print them; exit 1 listing the pins if not.

    python scripts/check_pins.py [--setup-cfg PATH]

Reads ``install_requires`` and every ``extras_require`` group of the given setup.cfg (default: the one next to this
script's folder) and looks up each distribution's installed version with ``importlib.metadata`` in the running
interpreter. A required distribution that is missing or outside its pin fails; an extra's distribution that is not
installed is listed as such (extras are optional, e.g. ``IMPULSEVIT_NO_FFCV=1``) but one that is installed must match
its pin. Environment markers are honoured (a requirement whose marker is false here is skipped). Exit status: 0 when
everything matches, 1 otherwise, 2 when setup.cfg cannot be read.
"""

from __future__ import annotations

import argparse
import configparser
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

DEFAULT_CFG = Path(__file__).resolve().parents[1] / "setup.cfg"


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


def check(setup_cfg: Path) -> tuple[list[str], list[str]]:
    """``(report lines, problems)``: one line per requirement (pin, installed version, verdict); a problem per
    required distribution that is missing or any installed one outside its pin."""
    lines, problems = [], []
    for req, extra in read_pins(setup_cfg):
        if req.marker is not None and not req.marker.evaluate({"extra": extra or ""}):
            continue
        pin = str(req.specifier) or "(any)"
        where = "" if extra is None else f" [extra {extra}]"
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None:
            verdict = "not installed (optional)" if extra else "MISSING"
            if extra is None:
                problems.append(f"{req.name}{where}: required {pin}, not installed")
        elif req.specifier.contains(have, prereleases=True):
            verdict = "ok"
        else:
            verdict = "OUTSIDE PIN"
            problems.append(f"{req.name}{where}: installed {have}, setup.cfg allows {pin}")
        lines.append(f"  {req.name + where:<32} {pin:<16} {have or '-':<12} {verdict}")
    return lines, problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setup-cfg", type=Path, default=DEFAULT_CFG)
    args = p.parse_args(argv)
    try:
        lines, problems = check(args.setup_cfg)
    except (OSError, ValueError) as e:
        print(f"[pins] {e}", file=sys.stderr)
        return 2
    print(f"[pins] {args.setup_cfg} vs {sys.executable}:")
    print(f"  {'distribution':<32} {'pin':<16} {'installed':<12} verdict")
    print("\n".join(lines))
    if problems:
        print("[pins] FAILED: installed versions outside setup.cfg's pins (this code uses private API of pinned "
              "packages; test a new release before widening its pin):", file=sys.stderr)
        print("\n".join(f"  {x}" for x in problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
