"""graphopt: a graph-rewrite optimizer for ONNX models and torch.fx graphs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from graphopt._lazy_onnx import lighten_onnx_import
from graphopt._lazy_sympy import defer_sympy

# Before anything imports onnx-ir: it imports sympy (a quarter of a second), which most runs never use.
defer_sympy()
# Before anything imports onnx: importlib.metadata (for its __version__) and two submodules nobody uses (~0.017 s).
lighten_onnx_import()

from graphopt._version import __version__  # noqa: E402
from graphopt.errors import GraphoptError, ModelError, PatternError, RuleNameError  # noqa: E402

if TYPE_CHECKING:
    from graphopt.api import OptimizeOptions, optimize, optimize_file
    from graphopt.report.model import Report

# Imported on first use, so `import graphopt` (and `graphopt --help`) stays fast: the
# optimizer pulls in onnx, onnx-ir and sympy, which take most of a second to import.
_LAZY = {
    "optimize": "graphopt.api",
    "optimize_file": "graphopt.api",
    "OptimizeOptions": "graphopt.api",
    "Report": "graphopt.report.model",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphopt' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def load_patterns(path: str):  # type: ignore[no-untyped-def]
    """Load rules from a .pdll file, a .py file of Python-form rules, or a folder of both."""
    from graphopt.pattern.loader import load_patterns as _load

    return _load(path)


def last_report() -> Report | None:
    """The report of the graph `torch.compile(..., backend="graphopt")` compiled last (None before any).

    Reads the torch backend's registry only if the backend ran: importing graphopt never imports torch."""
    backend = sys.modules.get("graphopt.torch_backend")
    return None if backend is None else backend.last_report()


def compile(model: Any, *, options: dict[str, Any] | None = None, mode: str | None = None, **torch_compile_kwargs: Any) -> Any:  # noqa: A001
    """`torch.compile(model, backend="graphopt", ...)`, with graphopt's options checked first.

    torch.compile hands the options to the backend only when dynamo compiles the first graph,
    so a misspelt rule would surface then, inside dynamo's traceback; here it is a
    GraphoptError at once."""
    import torch

    from graphopt.torch_backend import check_options

    check_options(options, mode)
    return torch.compile(model, backend="graphopt", options=options, mode=mode, **torch_compile_kwargs)


def check_torch_options(options: dict[str, Any] | None = None, mode: str | None = None) -> None:
    """Raise GraphoptError now if `torch.compile(..., backend="graphopt", options=...)` would fail on them."""
    from graphopt.torch_backend import check_options

    check_options(options, mode)


def torch_reports() -> list[Report]:
    """The reports of every graph the torch backend compiled, in order (the index in report file names)."""
    backend = sys.modules.get("graphopt.torch_backend")
    return [] if backend is None else backend.torch_reports()


__all__ = [
    "__version__",
    "last_report",
    "torch_reports",
    "compile",
    "check_torch_options",
    "optimize",
    "optimize_file",
    "OptimizeOptions",
    "load_patterns",
    "GraphoptError",
    "ModelError",
    "PatternError",
    "RuleNameError",
    "Report",
]
