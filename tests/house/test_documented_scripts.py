"""Every ``python scripts/….py`` / ``python benchmarks/….py`` command the documentation shows names a file that
exists and only options that file defines. (The ``impulsevit …`` commands are run by test_documented_commands.py;
every benchmark's code runs in test_benchmarks.py and the depth profile's in tests/tools/test_depth_profile.py —
this catches a doc that drifts from them: a renamed script or option.) Pure: reads text, runs nothing."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from _doc_commands import doc_files

REPO = Path(__file__).resolve().parents[2]
_COMMAND = re.compile(r"python3? ((?:scripts|benchmarks)/[\w-]+\.py)((?:\\\n|[^`|#\n])*)")


def documented_script_commands(repo: Path = REPO) -> dict[tuple[str, str], list[str]]:
    """``{(script path, its arguments): [where, ...]}`` over the doc files; a trailing ``\\`` continues the line."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in filter(Path.is_file, doc_files(repo)):
        text = path.read_text(encoding="utf-8")
        for m in _COMMAND.finditer(text):
            args = " ".join(m.group(2).replace("\\\n", " ").split())
            line = text.count("\n", 0, m.start()) + 1
            found.setdefault((m.group(1), args), []).append(f"{path.relative_to(repo)}:{line}")
    return found


COMMANDS = documented_script_commands()


def test_the_docs_show_script_commands():
    scripts = {script for script, _ in COMMANDS}
    assert "scripts/depth_profile.py" in scripts and "benchmarks/loader_speed.py" in scripts


@pytest.mark.parametrize("script, args", sorted(COMMANDS), ids=[f"{s} {a}"[:80] for s, a in sorted(COMMANDS)])
def test_a_documented_script_command_names_a_file_and_its_options(script, args):
    where = ", ".join(COMMANDS[script, args])
    source = REPO / script
    assert source.is_file(), f"{where}: {script} does not exist"
    code = source.read_text(encoding="utf-8")
    options = [t.split("=")[0] for t in shlex.split(args, comments=True) if t.startswith("--")]
    unknown = [o for o in options if f'"{o}"' not in code]
    assert not unknown, f"{where}: {script} defines no option {', '.join(unknown)}"


def test_the_check_fails_on_a_drifted_command(tmp_path):
    (tmp_path / "docs").mkdir()
    doc = "```bash\npython scripts/depth_profile.py --maps \\\n    --no-such-flag 3\n```\n"
    (tmp_path / "README.md").write_text(doc)
    found = documented_script_commands(tmp_path)
    assert found == {("scripts/depth_profile.py", "--maps --no-such-flag 3"): ["README.md:2"]}
    code = (REPO / "scripts/depth_profile.py").read_text()
    assert '"--maps"' in code and '"--no-such-flag"' not in code
