"""Errors that graphopt reports to users as one line (and exit code 2 on the command line)."""

from __future__ import annotations

__all__ = ["GraphoptError", "ModelError", "PatternError", "RuleNameError", "printable", "escape_markup"]


class GraphoptError(Exception):
    """A problem with the user's input, reported as one line; never a crash."""


class ModelError(GraphoptError):
    """The model cannot be read, is malformed, or is unsupported."""


class PatternError(GraphoptError):
    """A pattern file is malformed; the message starts with file:line:col."""


class RuleNameError(GraphoptError):
    """A rule named on the command line or in options does not exist."""


def printable(text: str) -> str:
    """`text` with control characters escaped (\\x1b, \\n, ...): names from a model or a
    pattern file reach the terminal, and an escape sequence in one must not reach it raw."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def escape_markup(text: str) -> str:
    """`printable(text)` made safe to put into rich markup (what the terminal renderings use)."""
    from rich.markup import escape

    return escape(printable(text))


class VerificationError(GraphoptError):
    """Verification could not be carried out (as opposed to: it found a difference)."""
