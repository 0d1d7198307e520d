"""Native helpers for canonical.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.pattern.native import native_constraint, native_rewrite


@native_constraint("SomeRangeInputIsAOneElementVector")
def some_range_input_is_a_one_element_vector(ctx, start, limit, delta):
    shapes = [ctx.shape(v) for v in (start, limit, delta)]
    if any(s is None for s in shapes):
        return "an input's shape is unknown"
    if any(s == (1,) for s in shapes) and all(s in ((), (1,)) for s in shapes):
        return True
    return f"inputs have shapes {[list(s) for s in shapes]}"


@native_rewrite("ScalarShape")
def scalar_shape(ctx):
    return {"shape": np.zeros(0, dtype=np.int64)}
