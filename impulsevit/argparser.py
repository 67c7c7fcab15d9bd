"""The ``argparse`` parser of every plain-argparse subcommand (``convert``, ``download``, ``runs``, ``export``,
``predict``, ``study``, ``submit``, ``data preview``, ``init``, ``demo``): its errors are one line.

argparse prints the whole usage (a dozen lines for ``convert``) before its one error line; the house rule is one
line naming what to fix. :class:`ArgumentParser` prints ``PROG: error: MESSAGE (PROG --help lists the options)``
and exits with status 2 (argparse's); an invalid choice adds the closest choice, ``...; did you mean 'x'?``.
``--help`` is argparse's, unchanged. The subcommands run through LightningCLI (``fit``, ``validate``, ...) have their
own parser (:class:`impulsevit.cli.parser.ImpulseArgumentParser`).

Hand-written because argparse's own suggestion (``suggest_on_error``) exists only from Python 3.14 and still prints
the usage. The invalid value and the choices are read from argparse's message (``invalid choice: 'x' (choose from
...)``, the same words on Python 3.10-3.14); a message in another form is printed as it is, without a suggestion.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
from typing import NoReturn

__all__ = ["ArgumentParser", "did_you_mean", "one_line_message"]

_CHOICE = re.compile(r"invalid choice: (?P<value>.+?) \(choose from (?P<choices>.*)\)$", re.S)


def _literal(text: str) -> str:
    """``'x'`` (a repr, Python < 3.12.8) or ``x`` (later) -> ``x``."""
    text = text.strip()
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return value if isinstance(value, str) else text


def did_you_mean(value: str, choices: list[str]) -> str | None:
    """The choice closest to ``value`` (:func:`difflib.get_close_matches`, case-insensitive, cutoff 0.6), else
    None."""
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(value.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def one_line_message(message: str) -> str:
    """argparse's error ``message`` on one line, with ``; did you mean 'x'?`` after an invalid choice that is close
    to one of the choices."""
    text = " ".join(message.split())
    found = _CHOICE.search(text)
    if found:
        choices = [_literal(c) for c in re.split(r",\s*", found.group("choices")) if c.strip()]
        close = did_you_mean(_literal(found.group("value")), choices)
        if close is not None:
            text += f"; did you mean {close!r}?"
    return text


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line on stderr (no usage), exit status 2; subparsers
    (``add_subparsers``) are of this class too. Everything else is argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line_message(message)} ({self.prog} --help lists the options)\n")
