"""``impulsevit.argparser``: argument errors are one line (no usage) with the choices and the closest one, exit
status 2; every plain-argparse parser of the package is one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from impulsevit.argparser import ArgumentParser, did_you_mean, one_line_message

PKG = Path(__file__).resolve().parents[1] / "impulsevit"


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="impulsevit thing")
    p.add_argument("--preset", choices=("res256", "short320"))
    sub = p.add_subparsers(dest="command")
    sub.add_parser("list").add_argument("--n", type=int)
    return p


@pytest.mark.parametrize(("argv", "expected"), [
    (["--preset", "res265"], "impulsevit thing: error: argument --preset: invalid choice: 'res265' (choose from "
                             "'res256', 'short320'); did you mean 'res256'? (impulsevit thing --help lists the "
                             "options)"),
    (["--preset", "zzz"], "impulsevit thing: error: argument --preset: invalid choice: 'zzz' (choose from 'res256', "
                          "'short320') (impulsevit thing --help lists the options)"),
    (["lsit"], "did you mean 'list'?"),
    (["list", "--n", "x"], "impulsevit thing list: error: argument --n: invalid int value: 'x' (impulsevit thing list "
                           "--help lists the options)"),
])
def test_an_argument_error_is_one_line(capsys, argv, expected):  # noqa: ANN001
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert expected in err


def test_suggestions():
    assert did_you_mean("Folder", ["folder", "state-dict"]) == "folder"
    assert did_you_mean("zzz", ["folder"]) is None
    # the choices as Python 3.12.8+ writes them (no quotes) give the same suggestion
    assert one_line_message("argument --x: invalid choice: 'fodler' (choose from folder, state-dict)").endswith(
        "; did you mean 'folder'?")


def test_every_plain_argparse_parser_of_the_package_is_impulsevit_s():
    direct = [f"{p.relative_to(PKG.parent)}:{n}" for p in sorted(PKG.rglob("*.py")) if p.name != "argparser.py"
              for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"argparse\.ArgumentParser\(", line)]
    assert not direct, f"build parsers with impulsevit.argparser.ArgumentParser (one-line errors): {direct}"
