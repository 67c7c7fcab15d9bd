"""LightningCLI and jsonargparse / argparse internals impulsevit's command line uses (see :mod:`impulsevit._compat`)."""

from __future__ import annotations

import argparse
import functools
import operator
import types
import typing
from collections.abc import Iterable
from typing import Any

from lightning.pytorch.cli import LightningCLI

__all__ = ["parser_actions", "subcommand_parsers", "SubcommandRunHookCLI", "try_int_before_float"]


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


def try_int_before_float(parser: argparse.ArgumentParser, keys: Iterable[str]) -> list[str]:
    """Make jsonargparse try ``int`` before ``float`` for the arguments ``keys`` of ``parser`` (dotted, as
    ``LightningArgumentParser.add_lightning_class_args`` returns them) whose type is a union holding both, so that an
    integer the user writes (``--trainer.limit_val_batches=1``, ``limit_val_batches: 1`` in a YAML file) parses as
    ``int`` and a decimal (``0.5``, ``1.0``, ``1e0``) as ``float``. The union's other members keep their order; an
    argument of another type is left alone. Returns the keys whose type it changed, in ``parser``'s order.

    Why: jsonargparse tries a union's members in order and keeps the first that accepts the value; ``float`` accepts
    ``1``. The order it sees is not always the one in the source: ``typing`` caches unions by equality, which ignores
    order, so ``Trainer.__init__``'s ``Optional[Union[int, float]]`` (``limit_{train,val,test,predict}_batches``,
    ``gradient_clip_val``) evaluates to the ``Union[float, int, None]`` that ``lightning.fabric`` built first (Lightning
    issue #21259). For ``limit_*_batches`` the difference is the meaning: an int counts batches, a float is a
    fraction, so ``1`` read as ``1.0`` ran all the batches instead of one. The union is rebuilt with ``|``, which no
    cache hands back in another order.

    Why private: jsonargparse keeps an argument's type in ``ActionTypeHint._typehint`` and has no public way to change
    the type of an argument LightningCLI added; adding these arguments again with the type written out would drop the
    help and defaults jsonargparse reads from Lightning's signature and docstring.

    Reaches: ``jsonargparse.ActionTypeHint._typehint`` (read, and written for the keys changed)
    Checked on: jsonargparse>=4.27,<5
    Waits for: Lightning issue #21259 fixed (the Trainer's annotations seen in their source order), or a public way to
    set an added argument's type.
    """
    wanted, changed = set(keys), []
    for action in parser_actions(parser):
        hint = getattr(action, "_typehint", None)
        if action.dest not in wanted or hint is None:
            continue
        ordered = _int_before_float(hint)
        if ordered is not hint:
            action._typehint = ordered
            changed.append(action.dest)
    return changed


def _int_before_float(hint: Any) -> Any:
    """``hint`` with ``int`` moved just before ``float`` when it is a union that has ``float`` first; else ``hint``."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint
    members = typing.get_args(hint)
    if int not in members or float not in members or members.index(int) < members.index(float):
        return hint
    ordered = [m for m in members if m is not int]
    ordered.insert(ordered.index(float), int)
    try:
        return functools.reduce(operator.or_, ordered)
    except TypeError:  # a member that does not support `|` (a forward reference): leave the type as it is
        return hint
