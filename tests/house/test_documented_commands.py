"""Docs are tests: every ``impulsevit …`` command and Python snippet of README.md, docs/*.md, the init cards and the
recipe headers (found by ``tests/_doc_commands.py``) is run here in a small form, or is a row of
``tests/house/documented_commands.py`` with its reason; a documented command without a row, or a row no doc shows
any more, fails.

The commands that need a trained run share the two this file trains once (``runs/quickstart``, ``runs/pre``, by the
documented commands that make them, in one workspace); downloads come from a loopback HTTP server serving a small
CIFAR-10 in the release's format; the caches and the data home are folders of the test, so nothing is written
outside it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import pytest
import yaml
from _cli_helpers import REPO, subprocess_env
from _doc_commands import scan
from _image_files import cifar10_release_tarball, save_jpeg
from documented_commands import COMMANDS, REASONS, SNIPPET_REASONS, SNIPPETS, Form

pytestmark = pytest.mark.slow  # trains, starts processes or converts data (tests/README.md, Lanes)

DOC_COMMANDS, MENTIONS, DOC_SNIPPETS = scan()
FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
_PLACEHOLDER = re.compile(r"…|\.\.\.|\[|(?:^|[\s/:.=,])[A-Z][A-Z0-9_]*(?=$|[\s/:.=,])")


def _where(cmd: str) -> str:
    return ", ".join(map(str, DOC_COMMANDS.get(cmd, [])))


# ---------------------------------------------------------------------------------------------------- the table


def test_every_documented_command_has_a_row_and_every_row_a_documented_command():
    missing = [f"{cmd!r}  ({_where(cmd)})" for cmd in DOC_COMMANDS if cmd not in COMMANDS]
    stale = [cmd for cmd in COMMANDS if cmd not in DOC_COMMANDS]
    assert not missing, ("documented commands with no row in tests/house/documented_commands.py (run them in a small "
                         "form there, or give the reason they cannot run):\n  " + "\n  ".join(missing))
    assert not stale, ("rows of tests/house/documented_commands.py that no doc shows any more (remove them, or fix "
                       "the doc):\n  " + "\n  ".join(stale))


def test_every_snippet_has_a_row_and_its_small_form_edits_apply():
    snippets = {s.id: s for s in DOC_SNIPPETS}
    missing, stale = set(snippets) - set(SNIPPETS), set(SNIPPETS) - set(snippets)
    assert not missing, f"python snippets with no row in SNIPPETS of tests/house/documented_commands.py: {missing}"
    assert not stale, f"SNIPPETS rows that no doc shows any more: {stale}"
    for sid, row in SNIPPETS.items():
        assert row["form"] in ("run", "module", "skip"), sid
        for old, _ in row.get("replace", []):
            assert old in snippets[sid].code, f"{sid}: the small form replaces {old!r}, which the snippet no longer has"
        if row["form"] == "skip":
            assert row["reason"] in SNIPPET_REASONS and "..." in snippets[sid].code, sid
        if row["form"] == "module":
            assert _module_path(snippets[sid].code) is not None, f"{sid}: its first line names no file to write"


def test_every_mentioned_subcommand_exists():
    from impulsevit.cli.subcommands import ALL_SUBCOMMANDS

    for mention, places in MENTIONS.items():
        words = mention.split()[1:]
        assert words[0] in ALL_SUBCOMMANDS, f"{mention!r} ({', '.join(map(str, places))}): no such subcommand"
        if words[0] in ("data", "init"):
            assert words[1] == {"data": "preview", "init": "list"}[words[0]], mention


def _recipes_named(cmd: str) -> list[dict]:
    """The recipes a command names: ``--recipe X`` and a run folder ``runs/X`` (or its export ``runs/X-export``)."""
    names = re.findall(r"--recipe[ =](\w+)", cmd) + [re.sub(r"-export$", "", n) for n in
                                                       re.findall(r"runs/([\w-]+)", cmd)]
    return [yaml.safe_load((REPO / "recipes" / f"{n}.yaml").read_text()) for n in names
            if (REPO / "recipes" / f"{n}.yaml").is_file()]


def _reason_applies(reason: str, cmd: str) -> bool:
    if reason == "gpu":
        if re.search(r"torchrun|--gpus-per-node|--trainer\.devices=([2-9]|\d\d)", cmd):
            return True
        return any(r.get("trainer", {}).get("accelerator") in ("gpu", "cuda") for r in _recipes_named(cmd))
    if reason == "network":
        return bool(re.search(r"s3://|hf-hub:|https?://", cmd))
    if reason == "data":
        from impulsevit.data.sources.registry import get_dataset

        names = [*re.findall(r"--dataset[ =](\w+)", cmd),
                 *(r["data"]["init_args"]["dataset"] for r in _recipes_named(cmd))]
        return bool(names) and any(get_dataset(n).download is None for n in names)
    raise AssertionError(f"unknown reason {reason!r}")


SKIPPED = [cmd for cmd, form in COMMANDS.items() if form.kind == "skip"]


@pytest.mark.parametrize("cmd", SKIPPED)
def test_a_skip_s_reason_applies_to_its_command(cmd):
    reason = COMMANDS[cmd].reason
    assert reason in REASONS, f"{cmd!r}: reason {reason!r} is not one of {sorted(REASONS)}"
    assert _reason_applies(reason, cmd), f"{cmd!r} ({_where(cmd)}): {REASONS[reason]} does not apply; run it"


@functools.cache
def _help(sub: tuple[str, ...]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = _main([*sub, "--help"])
    assert rc == 0, f"impulsevit {' '.join(sub)} --help: exit {rc}\n{out.getvalue()}"
    return out.getvalue()


SYNOPSES = [cmd for cmd, form in COMMANDS.items() if form.kind == "synopsis"]


@pytest.mark.parametrize("cmd", SYNOPSES)
def test_a_synopsis_names_a_subcommand_and_its_options(cmd):
    from impulsevit.cli.subcommands import ALL_SUBCOMMANDS

    places = DOC_COMMANDS.get(cmd, [])
    assert _PLACEHOLDER.search(cmd) or all(p.inline for p in places), (
        f"{cmd!r} ({_where(cmd)}) has no placeholder and is not a fragment in prose: run it")
    words = cmd.split()[1:]
    sub = tuple(words[:2] if words[:1] in (["data"], ["init"]) else words[:1])
    if sub and sub[0].startswith("-"):
        sub = ()
    assert not sub or sub[0] in ALL_SUBCOMMANDS, f"{cmd!r}: no subcommand {sub[0]!r}"
    text = _help(sub) + _help(()).partition("Any subcommand:")[2]  # and the options every subcommand takes
    for flag in re.findall(r"(?<![\w-])(--[\w.-]+)", cmd):
        prefixes = [".".join(flag.split(".")[:i]) for i in range(flag.count(".") + 1, 0, -1)]
        assert any(re.search(rf"{re.escape(p)}\b", text) for p in prefixes), (
            f"{cmd!r} ({_where(cmd)}): impulsevit {' '.join(sub)} --help has no {flag}")


# ---------------------------------------------------------------------------------------------------- running them


def _main(argv: list[str]) -> int:
    """``impulsevit ARGV`` through the console script's entry point, in this process (as ``run_cli``: argv and the
    environment restored afterwards); the exit status."""
    from impulsevit.cli import main

    with mock.patch.object(sys, "argv", ["impulsevit"]), mock.patch.dict(os.environ):
        try:
            return int(main(argv) or 0)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


def _module_path(code: str) -> str | None:
    m = re.match(r"#\s*([\w/]+\.py)\b", code)
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The folder every documented command runs in (its cwd, ``$PWD``), shared by all of them in table order: images
    for ``predict``, an image folder of two classes, the init card's plugin module, torchvision's CIFAR-10 pointed at
    a loopback server, and the caches and data home in a folder beside it."""
    if not FASHION.exists():
        pytest.skip("Debian's dataset-fashion-mnist is not installed (scripts/setup.sh installs it)")
    ws, side = tmp_path_factory.mktemp("docs"), tmp_path_factory.mktemp("docs-caches")
    for i in range(3):
        save_jpeg(ws / "my_images" / f"img{i}.jpg", 28, 28, seed=i)
    for split, n in (("train", 16), ("val", 4)):  # the README's own image folder
        for c, cls in enumerate(("cats", "dogs")):
            for i in range(n):
                save_jpeg(ws / "my_folder" / split / cls / f"{i}.jpg", 30 + i, 40 - i, seed=100 * c + i)
    for snippet in DOC_SNIPPETS:
        if SNIPPETS.get(snippet.id, {}).get("form") == "module":
            path = ws / _module_path(snippet.code)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(snippet.code)
    tarball, members, _, _ = cifar10_release_tarball()
    served = side / "www"
    served.mkdir()
    (served / "cifar-10-python.tar.gz").write_bytes(tarball)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    md5 = {name: hashlib.md5(data).hexdigest() for name, data in members.items()}
    import torchvision.datasets

    cls = torchvision.datasets.CIFAR10
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cls, "url", f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz")
        mp.setattr(cls, "tgz_md5", hashlib.md5(tarball).hexdigest())
        mp.setattr(cls, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)])
        mp.setattr(cls, "test_list", [["test_batch", md5["test_batch"]]])
        mp.setattr(cls, "meta", {"filename": "batches.meta", "key": "label_names", "md5": md5["batches.meta"]})
        for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            mp.delenv(var, raising=False)
        mp.setenv("IMPULSEVIT_CACHE", str(side / "cache"))
        mp.setenv("IMPULSEVIT_DATA", str(side / "data"))
        mp.setenv("PWD", str(ws))
        mp.chdir(ws)
        mp.syspath_prepend(str(ws))
        yield ws
    server.shutdown()


def _argv(cmd: str, form: Form) -> list[str]:
    """The command's words with ``$PWD`` expanded and ``[...]`` optional parts left out, then the form's extras."""
    words, optional = [], 0
    for word in shlex.split(os.path.expandvars(cmd)):
        optional += word.count("[")
        if not optional:
            words.append(word)
        optional -= word.count("]")
    return [*words, *form.extra, *(["--dry-run"] if form.kind == "dry" else [])]


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def _param(cmd: str, form: Form) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=form.xfail)] if form.xfail else []
    return pytest.param(cmd, marks=marks, id=cmd[:90])


RUNS = [_param(cmd, form) for cmd, form in COMMANDS.items() if form.kind in ("run", "dry")]


@pytest.mark.parametrize("cmd", RUNS)
def test_documented_command_runs_in_its_small_form(workspace, cmd, capfd):
    form = COMMANDS[cmd]
    argv = _argv(cmd, form)
    before = _files(workspace)
    if argv[0] == "impulsevit":
        rc = _main(argv[1:])
    else:  # python -m …: a process of its own, as written
        assert argv[:2] == ["python", "-m"], argv
        env = subprocess_env()
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(workspace)])
        rc = subprocess.run([sys.executable, *argv[1:]], cwd=workspace, env=env, timeout=300).returncode
    out, err = capfd.readouterr()
    assert rc == 0, f"{cmd!r} ({_where(cmd)}) as {shlex.join(argv)}: exit {rc}\n{(out + err)[-3000:]}"
    if form.kind == "dry":
        assert _files(workspace) == before, f"{cmd!r} --dry-run wrote {sorted(_files(workspace) - before)}"


@pytest.mark.parametrize("sid", [s for s, row in SNIPPETS.items() if row["form"] == "run"])
def test_documented_snippet_runs(workspace, sid, capfd):
    code = next(s.code for s in DOC_SNIPPETS if s.id == sid)
    for old, new in SNIPPETS[sid].get("replace", []):
        code = code.replace(old, new)
    exec(compile(code, sid, "exec"), {"__name__": "__snippet__"})  # noqa: S102 - the docs' own code
