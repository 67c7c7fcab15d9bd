"""LightningCLI and jsonargparse / argparse internals impulsevit's command line uses (see :mod:`impulsevit._compat`)."""

from __future__ import annotations

import argparse
from typing import Any

from lightning.pytorch.cli import LightningCLI

__all__ = ["parser_actions", "subcommand_parsers", "SubcommandRunHookCLI"]


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every action (option, positional, subcommand group) added to ``parser``, in the order they were added
    (jsonargparse's ``ArgumentParser`` is an argparse subclass).

    Reaches: ``argparse.ArgumentParser._actions``
    Checked on: jsonargparse>=4.27,<5
    Waits for: a public list of a parser's actions (argparse has none; jsonargparse's ``get_defaults`` lists values,
    not the keys a nested parser accepts).
    """
    return list(parser._actions)


def subcommand_parsers(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """``{subcommand: its parser}`` of a jsonargparse parser with subcommands (LightningCLI's top parser); ``{}`` when
    it has none.

    Reaches: ``jsonargparse.ArgumentParser._subcommands_action``
    Checked on: jsonargparse>=4.27,<5
    Waits for: a public accessor of a parser's subcommands (LightningCLI keeps them privately too).
    """
    return dict(getattr(getattr(parser, "_subcommands_action", None), "choices", None) or {})


class SubcommandRunHookCLI(LightningCLI):
    """``LightningCLI`` whose run of the chosen subcommand (``before_<cmd>``, ``trainer.<cmd>(...)``, ``after_<cmd>``)
    goes through :meth:`run_subcommand`, which a subclass may override (calling ``super().run_subcommand``) to skip
    the run or to act after it.

    Reaches: ``LightningCLI._run_subcommand`` (overridden and called)
    Checked on: lightning>=2.6,<2.7
    Waits for: a public hook around the subcommand's run (``before_<cmd>`` cannot skip it).
    """

    def _run_subcommand(self, subcommand: str) -> None:
        self.run_subcommand(subcommand)

    def run_subcommand(self, subcommand: str) -> None:
        """Lightning's run of ``subcommand``."""
        super()._run_subcommand(subcommand)
