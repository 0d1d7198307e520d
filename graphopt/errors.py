"""Errors that graphopt reports to users as one line (and exit code 2 on the command line)."""

from __future__ import annotations

__all__ = ["GraphoptError", "ModelError", "PatternError", "RuleNameError"]


class GraphoptError(Exception):
    """A problem with the user's input, reported as one line; never a crash."""


class ModelError(GraphoptError):
    """The model cannot be read, is malformed, or is unsupported."""


class PatternError(GraphoptError):
    """A pattern file is malformed; the message starts with file:line:col."""


class RuleNameError(GraphoptError):
    """A rule named on the command line or in options does not exist."""
