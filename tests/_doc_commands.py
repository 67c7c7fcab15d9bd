"""Every ``impulsevit …`` command and Python snippet the documentation shows (not a test module; read by
``tests/house/test_documented_commands.py``). Pure: reads text, runs nothing.

Where it looks (:data:`DOC_FILES`): ``README.md``, ``docs/*.md``, ``impulsevit/init/README.md``,
``impulsevit/init/FAMILIES.md`` and the header of every ``recipes/*.yaml`` (its leading ``#`` lines).

What counts as a command:

- in a fenced code block (no language, ``bash``, ``sh``, ``shell`` or ``console``), in a Markdown indented code block
  (4 spaces) and on a recipe header line: every line, or ``&&`` / ``;`` part of one, whose program is ``impulsevit``
  (also ``.venv/bin/impulsevit``, ``python -m impulsevit.cli`` and ``torchrun … -m impulsevit.cli``), after leading
  ``$``, ``VAR=value`` and ``nice``; a line ending in ``\\`` continues on the next; a `` # `` comment is dropped. In a
  recipe header the command may also follow a label (``usage: impulsevit export …``);
- an inline code span (`` `…` ``) anywhere in that text that starts with ``impulsevit`` and has more than the
  subcommand (``impulsevit fit --recipe quickstart``), or starts with ``python -m impulsevit``. A span of only
  ``impulsevit SUB`` is a *mention* of the subcommand (:func:`mentions`), not a command;
- a line of program output (``impulsevit submit: warning: …``) is neither: the word after ``impulsevit`` must be a
  subcommand or an option.

A command's id is its normalised text (:func:`normalise`): one space between words, no ``$`` / ``VAR=value`` /
``nice`` / path in front of ``impulsevit``; the same command in two places is one id with two places. A snippet is
every ``python`` fenced block of the Markdown files; its id is ``<file>#<n>`` (n-th snippet of the file, from 1) —
the table that says how each one is tested (``tests/house/documented_commands.py``) names it that way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}


def doc_files(repo: Path = REPO) -> list[Path]:
    """The documentation files read, in a fixed order: README, docs/*.md, the init cards, the recipes."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md")), repo / "impulsevit/init/README.md",
            repo / "impulsevit/init/FAMILIES.md", *sorted((repo / "recipes").glob("*.yaml"))]


@dataclass(frozen=True)
class Place:
    """Where a command or snippet is written: a file relative to the repository and a 1-based line."""

    file: str
    line: int
    inline: bool = False
    """True for an inline code span in prose (a fragment may be written there), False for a code block / header line."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Snippet:
    id: str
    place: Place
    code: str


_PROGRAM = re.compile(r"^(?:\$\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:nice\s+)?"
                      r"(?:(?:\S*/)?impulsevit(?=\s|$)|python3?\s+-m\s+impulsevit(?:\.cli)?(?=\s|$)"
                      r"|torchrun\s.*?-m\s+impulsevit\.cli(?=\s|$))")
_LABEL = re.compile(r"^[A-Za-z][\w ()/,.-]*:\s+(?=(?:nice\s+)?impulsevit\s)")


def _subcommands() -> set[str]:
    from impulsevit.cli.subcommands import ALL_SUBCOMMANDS

    return set(ALL_SUBCOMMANDS)


def normalise(line: str) -> str | None:
    """``impulsevit ARGS`` for a command line, else None (not a command: no ``impulsevit`` program, or output such as
    ``impulsevit submit: warning: …``). ``python -m impulsevit.cli ARGS`` and a ``torchrun`` launch keep their
    program (they are other ways to start it); ``$``, ``VAR=value``, ``nice`` and a path before ``impulsevit`` go."""
    text = " ".join(line.split())
    m = _PROGRAM.match(text)
    if m is None:
        return None
    program = m.group(0)
    rest = text[m.end():].strip()
    first = rest.split(" ", 1)[0] if rest else ""
    if first and not (first in _subcommands() or first.startswith("-")):
        return None
    if "python" in program.split()[0] or program.lstrip("$ ").startswith("torchrun") or " -m " in program:
        head = program[program.index("python"):] if "python" in program else program[program.index("torchrun"):]
        return f"{head} {rest}".strip()
    return f"impulsevit {rest}".strip()


def _strip_comment(line: str) -> str:
    """The line without a trailing shell comment (`` #`` after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _join_continued(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Shell lines with ``\\`` continuations joined; each keeps the number of its first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for no, raw in lines:
        text = _strip_comment(raw)
        if pending is not None:
            text = pending[1] + " " + text.strip()
            no = pending[0]
            pending = None
        if text.endswith("\\"):
            pending = (no, text[:-1].rstrip())
            continue
        out.append((no, text))
    if pending is not None:
        out.append(pending)
    return out


def _commands_of_shell(lines: list[tuple[int, str]], labels: bool = False) -> list[tuple[int, str]]:
    found = []
    for no, text in _join_continued(lines):
        for part in re.split(r"\s(?:&&|;|\|\|)\s", text):
            part = part.strip()
            if labels:
                part = _LABEL.sub("", part)
            cmd = normalise(part)
            if cmd is not None:
                found.append((no, cmd))
    return found


_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def _spans(text: str, first_line: int) -> list[tuple[int, str, bool]]:
    """``(line, normalised command, is_command)`` of the inline code spans of ``text`` (lines numbered from
    ``first_line``) that start with ``impulsevit`` or ``python -m impulsevit``; ``is_command`` is False for a bare
    ``impulsevit SUB`` (a mention)."""
    out = []
    for m in _SPAN.finditer(text):
        body = m.group(1).strip()
        if not re.match(r"^(?:python3?\s+-m\s+)?impulsevit[\s.]", body):
            continue
        line = first_line + text.count("\n", 0, m.start())
        if body.startswith("python"):
            out.append((line, " ".join(body.split()), True))
            continue
        cmd = normalise(body)
        if cmd is None:
            continue
        words = cmd.split()[1:]
        bare = len(words) == 1 and not words[0].startswith("-") or words[:1] in (["data"], ["init"]) and len(words) == 2
        out.append((line, cmd, not bare))
    return out


def _paragraphs(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Runs of consecutive non-blank lines (numbered by their first line), joined with newlines."""
    out: list[tuple[int, str]] = []
    prev = -1
    for no, text in lines:
        if not text.strip():
            prev = -1
            continue
        if out and no == prev + 1:
            out[-1] = (out[-1][0], out[-1][1] + "\n" + text)
        else:
            out.append((no, text))
        prev = no
    return out


def _markdown(path: Path, rel: str) -> tuple[list[tuple[Place, str]], list[tuple[Place, str]], list[Snippet]]:
    lines = path.read_text().splitlines()
    commands: list[tuple[Place, str]] = []
    mentions: list[tuple[Place, str]] = []
    snippets: list[Snippet] = []
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)", lines[i])
        if m:
            lang, start, block = m.group(2), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                block.append((i + 1, lines[i]))
                i += 1
            i += 1
            if lang in SHELL_FENCES:
                commands += [(Place(rel, no), cmd) for no, cmd in _commands_of_shell(block)]
            elif lang == "python":
                snippets.append(Snippet(f"{rel}#{len(snippets) + 1}", Place(rel, start + 1),
                                        "\n".join(t for _, t in block) + "\n"))
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip() or lines[i - 1].startswith("    ")) \
                and not lines[i].lstrip().startswith(("-", "*", "|")):
            commands += [(Place(rel, no), cmd) for no, cmd in _commands_of_shell([(i + 1, lines[i])])]
        prose.append((i + 1, lines[i]))
        i += 1
    # inline spans, per paragraph (a span may wrap onto the next line)
    for no, text in _paragraphs(prose):
        for line, cmd, is_command in _spans(text, no):
            (commands if is_command else mentions).append((Place(rel, line, True), cmd))
    return commands, mentions, snippets


def _recipe_header(path: Path, rel: str) -> tuple[list[tuple[Place, str]], list[tuple[Place, str]]]:
    header: list[tuple[int, str]] = []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("#"):
            break
        header.append((no, line[1:]))
    commands = [(Place(rel, no), cmd) for no, cmd in _commands_of_shell(header, labels=True)]
    mentions: list[tuple[Place, str]] = []
    for no, text in _paragraphs(header):
        for line, cmd, is_command in _spans(text, no):
            (commands if is_command else mentions).append((Place(rel, line, True), cmd))
    return commands, mentions


def scan(repo: Path = REPO) -> tuple[dict[str, list[Place]], dict[str, list[Place]], list[Snippet]]:
    """``(commands, mentions, snippets)`` of the documentation: each command id and each mentioned ``impulsevit
    SUB`` with the places it is written (in file order), and every Python snippet."""
    commands: dict[str, list[Place]] = {}
    mentions: dict[str, list[Place]] = {}
    snippets: list[Snippet] = []
    for path in doc_files(repo):
        rel = path.relative_to(repo).as_posix()
        if path.suffix == ".md":
            cmds, ments, snips = _markdown(path, rel)
            snippets += snips
        else:
            cmds, ments = _recipe_header(path, rel)
        for place, cmd in cmds:
            if place not in commands.setdefault(cmd, []):
                commands[cmd].append(place)
        for place, cmd in ments:
            mentions.setdefault(cmd, []).append(place)
    return commands, mentions, snippets


if __name__ == "__main__":  # the list, for writing the table: python tests/_doc_commands.py
    cmds, ments, snips = scan()
    for cmd, places in cmds.items():
        print(f"{cmd!r}  # {', '.join(map(str, places))}")
    print("mentions:", sorted(ments))
    for s in snips:
        print("snippet", s.id, s.place)
