"""graphopt: a graph-rewrite optimizer for ONNX models and torch.fx graphs."""

from __future__ import annotations

import sys

from graphopt._version import __version__
from graphopt.api import OptimizeOptions, optimize, optimize_file
from graphopt.errors import GraphoptError, ModelError, PatternError, RuleNameError
from graphopt.report.model import Report


def load_patterns(path: str):  # type: ignore[no-untyped-def]
    """Load rules from a .pdll file, a .py file of Python-form rules, or a folder of both."""
    from graphopt.pattern.loader import load_patterns as _load

    return _load(path)


def last_report() -> Report | None:
    """The report of the graph `torch.compile(..., backend="graphopt")` compiled last (None before any).

    Reads the torch backend's registry only if the backend ran: importing graphopt never imports torch."""
    backend = sys.modules.get("graphopt.torch_backend")
    return None if backend is None else backend.last_report()


def torch_reports() -> list[Report]:
    """The reports of every graph the torch backend compiled, in order (the index in report file names)."""
    backend = sys.modules.get("graphopt.torch_backend")
    return [] if backend is None else backend.torch_reports()


__all__ = [
    "__version__",
    "last_report",
    "torch_reports",
    "optimize",
    "optimize_file",
    "OptimizeOptions",
    "load_patterns",
    "GraphoptError",
    "ModelError",
    "PatternError",
    "RuleNameError",
]
