"""Errors a user fixes (a bad option, a run directory in use, a checkpoint that does not fit): ``impulsevit`` prints
them as one line and exits with :attr:`UserError.exit_status`, without a traceback (``--debug`` or
``IMPULSEVIT_DEBUG=1`` shows it). Everything else is a bug and keeps its traceback."""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "RunDirError", "TrainingDiverged", "UserError"]


class UserError(Exception):
    """Base of the user-fixable errors; exit status 1."""

    exit_status = 1


class ConfigError(UserError, ValueError):
    """The configuration cannot work (found before any work starts); exit status 2."""

    exit_status = 2


class RunDirError(UserError):
    """The run directory is in use by another process, or holds a run that would be overwritten; exit status 2."""

    exit_status = 2


class TrainingDiverged(UserError, FloatingPointError):
    """Training produced a non-finite loss, gradient or weight (:class:`~impulsevit.callbacks.NonFiniteLossGuard`);
    the message names the step and the last good checkpoint; exit status 1."""


class DataError(UserError):
    """The data cannot be read as configured, found while reading it (a file the dataset needs is missing, a folder
    holds no images, the files do not match the dataset); the message names the dataset and path. Exit status 1."""
