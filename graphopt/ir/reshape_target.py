"""A Reshape target as a constant, from dims known symbolically (graphopt/ir/symbolic.py).

Exporters compute Reshape targets at run time from Shape ops; when the values are known
as expressions, the target can be a constant: static values as they are, and one symbolic
value as 0 (Reshape copies the input's dim at that axis) or -1 (Reshape resolves it from
the element count). Both are exact only under conditions, written out below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphopt.ir.symbolic import dims_equal, static_int

__all__ = ["constant_reshape_target"]


def constant_reshape_target(src: Sequence[Any] | None, values: Sequence[Any], allowzero: int = 0) -> list[int] | str:
    """The constant target that reshapes an input of dims `src` as the target `values` does, or why there is none.

    A symbolic value becomes 0 where the input has the same dim at that axis (not under
    allowzero, where 0 means an empty dim). Any other symbolic value becomes -1, which
    Reshape resolves to the element count over the other dims: the same value for every
    input the original target accepts, provided none of the other dims can be 0 (-1 beside
    a 0 is ambiguous, and onnxruntime refuses it) — so they must be static and positive,
    and there is at most one such value."""
    out: list[int | None] = []
    for i, value in enumerate(values):
        known = static_int(value)
        if known is not None:
            out.append(known)
        elif not allowzero and src is not None and i < len(src) and dims_equal([src[i]], [value]):
            out.append(0)
        else:
            out.append(None)
    rest = [i for i, v in enumerate(out) if v is None]
    if len(rest) > 1:
        return f"target values {[str(values[i]) for i in rest]} are not static"
    if rest:
        if -1 in out:
            return f"target value {values[rest[0]]} is not static and the target has a -1 already"
        for i, v in enumerate(out):
            size = static_int(src[i]) if v == 0 and not allowzero and src is not None and i < len(src) else v
            if i != rest[0] and (size is None or size <= 0):
                return f"target value {values[rest[0]]} would be -1 beside a dim that may be 0 ({values[i]})"
        out[rest[0]] = -1
    return [int(v) for v in out if v is not None]
