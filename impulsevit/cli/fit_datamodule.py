"""The datamodule ``impulsevit fit`` would build from a command line, without the model or the trainer: what ``data
preview`` shows (:mod:`impulsevit.cli.data_preview`) and what ``submit`` plans conversions for
(:mod:`impulsevit.cli.convert_job`). The command-line knowledge (recipe names, the fit parser) stays in ``cli/``; the
tools that use the datamodule (:mod:`impulsevit.tools.preview`) take it built.
"""

from __future__ import annotations

import sys

__all__ = ["build_datamodule"]


def build_datamodule(cli_args: list[str]):  # noqa: ANN201 - any BaseImageDataModule
    """The datamodule of ``impulsevit fit <cli_args>``: the whole command line is parsed by the fit parser, only
    ``data`` is instantiated. Raises ``SystemExit(2)`` with the parser's message on bad keys or values."""
    from lightning.pytorch.cli import instantiate_class

    from impulsevit.cli.argv import prepare_argv
    from impulsevit.cli.trainer_cli import ImpulseCLI

    class _DataOnlyCLI(ImpulseCLI):
        def instantiate_classes(self) -> None:  # the data section only: no model, no trainer, no accelerator
            self.datamodule = instantiate_class((), self._value(self.config, "data").as_dict())

        def after_instantiate_classes(self) -> None:
            pass

    argv = prepare_argv(["fit", *cli_args])[1:]  # recipe names resolved as for fit
    saved = sys.argv
    sys.argv = sys.argv[:1]  # LightningCLI warns when it sees the outer command's own arguments next to ``args``
    try:
        return _DataOnlyCLI(args=argv, run=False).datamodule
    finally:
        sys.argv = saved
