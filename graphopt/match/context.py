"""What native helpers see: `ctx`, read-only questions about bound values (on ONNX and
FX graphs alike), plus constant creation during a rewrite.

The questions helpers used to answer by hand in every rules/*.py file live here
once: a one-element constant as a float (`scalar`), a constant's elements as ints
(`ints`), a constant Slice on one axis (`one_axis_slice`), symbolic dims (`dims`, memoized
per graph) and the cheap answer the recorded shapes give first (`same_recorded_shape`), the
static last dim (`last_dim`).
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

    def ints(self, value: Any) -> list[int] | None:
        """A constant's elements as Python ints (None: absent or not a constant)."""
        array = self.array(value)
        return None if array is None else [int(v) for v in np.asarray(array).reshape(-1)]

    def one_axis_slice(self, starts: Any, ends: Any, axes: Any, steps: Any, rank: int) -> tuple[int, int, int, int] | str:
        """A Slice's constant bounds on one axis as (axis, start, stop, step), the axis made
        non-negative and the bounds as written (axes default to 0, steps to 1); else why not."""
        s, e = self.ints(starts), self.ints(ends)
        a = [0] if axes is None else self.ints(axes)
        p = [1] if steps is None else self.ints(steps)
        if s is None or e is None or a is None or p is None:
            return "a Slice bound is not constant"
        if not len(s) == len(e) == len(a) == len(p) == 1:
            return "a Slice cuts more than one axis"
        return (a[0] + rank if a[0] < 0 else a[0]), s[0], e[0], p[0]

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

    def same_recorded_shape(self, a: Any, b: Any) -> bool | None:
        """What the recorded shapes alone settle about a and b having the same dims: True when
        both are fully known and equal (a symbolic dim's name stands for one size throughout a
        graph), False when their ranks or static sizes differ, None when only `dims` can tell.
        Most questions are settled here, without the symbolic evaluation (and sympy) `dims` needs."""
        sa, sb = self.shape(a), self.shape(b)
        if sa is None or sb is None:
            return None
        if len(sa) != len(sb) or any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(sa, sb)):
            return False
        if sa == sb and None not in sa:
            return True
        return None

    def shape_text(self, value: Any) -> str:
        """The recorded shape as messages print it: `[N, 64, ?]` (`?`: unknown dim), `?` for an unknown rank."""
        shape = self.shape(value)
        return "?" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"

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
