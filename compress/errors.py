"""Exception types the CLI maps to exit codes.

Every error a user can cause is a ``CompressError`` whose message is one line naming the file,
key or value and the fix. The CLI prints it and exits 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations


class CompressError(Exception):
    """A problem with the user's input or environment; the message says what to change."""


class RecipeError(CompressError):
    """A recipe or target profile that does not validate."""


class DataError(CompressError):
    """A data file that cannot be read or does not match the recipe's columns/labels."""


class ModelError(CompressError):
    """A model folder that is missing, unsafe or incompatible."""


class ExportError(CompressError):
    """An export or quantization that failed or did not pass its check against the source."""


class TrainingError(CompressError):
    """Training that cannot continue (e.g. a non-finite loss)."""


class RunLockedError(CompressError):
    """Another compress process holds the run folder."""


class UnreadableFile(CompressError, OSError):
    """A file compress needs that is missing, not a regular file or not readable.

    Also an ``OSError`` so code that treats an unreadable optional file as absent keeps doing so.
    """


class BadFile(CompressError, ValueError):
    """A file that was read but whose content compress cannot use (syntax, shape, size, depth).

    Also a ``ValueError`` so code that treats a corrupt optional file as absent keeps doing so.
    """


class GateFailure(CompressError):
    """One or more gates failed; the CLI exits 1 instead of 2."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def missing_dependency(package: str, feature: str) -> CompressError:
    """The error for an optional dependency that is not installed, with the exact install command."""
    return CompressError(f"{feature} needs the Python package '{package}': pip install {package}")
