"""What native helpers see: `ctx`, read-only questions about bound values (on ONNX and
FX graphs alike), plus constant creation during a rewrite.

The questions helpers used to answer by hand in every rules/*.py file live here
once: a one-element constant as a float (`scalar`), symbolic dims (`dims`, memoized
per graph), the static last dim (`last_dim`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.ir.symbolic import Dim, SymbolicShapes, static_int
from graphopt.ir.view import GraphView

__all__ = ["MatchContext"]


class MatchContext:
    def __init__(self, view: GraphView, scope: Any = None) -> None:
        self.view = view
        self.scope = scope
        self._symbolic: SymbolicShapes | None = None

    # ------------------------------------------------------------ constants
    def array(self, value: Any) -> np.ndarray | None:
        """The value's contents, if it is a constant."""
        return None if value is None else self.view.const_array(value)

    def scalar(self, value: Any) -> float | None:
        """A one-element constant as a float (None: not a constant, or not one element)."""
        array = self.array(value)
        return None if array is None or array.size != 1 else float(array.reshape(-1)[0])

    def constant(self, array: np.ndarray, name_hint: str = "const") -> Any:
        return self.view.new_constant(self.scope, np.asarray(array), name_hint)

    # ------------------------------------------------------------ types and shapes
    def dtype(self, value: Any) -> str | None:
        return None if value is None else self.view.dtype(value)

    def shape(self, value: Any) -> tuple[int | str | None, ...] | None:
        """The recorded shape: ints, names of symbolic dims, None for unknown dims."""
        return None if value is None else self.view.shape(value)

    def rank(self, value: Any) -> int | None:
        shape = self.shape(value)
        return None if shape is None else len(shape)

    def dims(self, value: Any) -> list[Dim] | None:
        """The dims as symbolic expressions (evaluated through shape computations), or None."""
        if value is None:
            return None
        if self._symbolic is None:
            self._symbolic = SymbolicShapes(self.view)
        return self._symbolic.dims(value)

    def last_dim(self, value: Any) -> int | None:
        """The static size of the last axis (None: unknown rank, rank 0 or a symbolic dim)."""
        shape = self.shape(value)
        return static_int(shape[-1]) if shape else None

    def opset(self, domain: str = "") -> int | None:
        return self.view.opset(domain)
