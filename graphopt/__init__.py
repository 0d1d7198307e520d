"""graphopt: a graph-rewrite optimizer for ONNX models and torch.fx graphs."""

from __future__ import annotations

__version__ = "0.1.0"

from graphopt.api import OptimizeOptions, optimize, optimize_file  # noqa: E402
from graphopt.errors import GraphoptError, ModelError, PatternError, RuleNameError  # noqa: E402


def load_patterns(path: str):  # type: ignore[no-untyped-def]
    """Load rules from a .pdll file, a .py file of Python-form rules, or a folder of both."""
    from graphopt.pattern.loader import load_patterns as _load

    return _load(path)


__all__ = [
    "__version__",
    "optimize",
    "optimize_file",
    "OptimizeOptions",
    "load_patterns",
    "GraphoptError",
    "ModelError",
    "PatternError",
    "RuleNameError",
]
