"""Native helpers for canonical.pdll."""

from __future__ import annotations

import math

import numpy as np

from graphopt.ir.reshape_target import constant_reshape_target
from graphopt.ir.symbolic import SymbolicShapes, dims_equal, static_int
from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


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


# ------------------------------------------------------------ reshape / transpose chains


@native_rewrite("ComposePerms")
def compose_perms(ctx, p1, p2):
    """Transpose(Transpose(x, p1), p2) == Transpose(x, [p1[i] for i in p2])."""
    return {"perm": [int(p1[int(i)]) for i in p2]}


@native_constraint("IsIdentityPerm")
def is_identity_perm(ctx, perm):
    if isinstance(perm, (list, tuple)) and list(perm) == list(range(len(perm))):
        return True
    return f"perm {perm} moves axes"


@native_constraint("SameDims")
def same_dims(ctx, a, b):
    recorded = ctx.same_recorded_shape(a, b)
    if recorded is not None:
        return True if recorded else f"dims {ctx.shape_text(a)} and {ctx.shape_text(b)} are not known to be equal"
    da, db = ctx.dims(a), ctx.dims(b)
    if da is None or db is None:
        return "the dims are not known"
    if not dims_equal(da, db):
        return f"dims {list(da)} and {list(db)} are not known to be equal"
    return True


@native_constraint("ReshapeIgnoresMiddle")
def reshape_ignores_middle(ctx, x, middle, s2, allowzero):
    """Reshape(middle, s2) == Reshape(x, s2): true unless s2 has a 0 (copy the input's dim)
    where x and middle may differ; -1 resolves from the element count, which they share."""
    sym = SymbolicShapes(ctx.view)
    target = sym.tensor(s2)
    if target is None:
        return "the outer reshape's target is not known"
    zeros = [i for i, t in enumerate(target) if static_int(t) == 0]
    if not zeros or allowzero:
        return True
    dx, dm = sym.dims(x), sym.dims(middle)
    if dx is None or dm is None:
        return "the target copies dims (0) that are not known"
    for i in zeros:
        if i >= len(dx) or i >= len(dm) or not dims_equal([dx[i]], [dm[i]]):
            return f"the target copies dim {i} (0), which the inner reshape changes"
    return True


@native_constraint("IsBatchedLastTwoTranspose")
def is_batched_last_two_transpose(ctx, x, flat, out):
    dx, df, do = ctx.dims(x), ctx.dims(flat), ctx.dims(out)
    if dx is None or df is None or do is None:
        return "the dims are not known"
    if len(dx) < 3 or len(df) != 3:
        return f"ranks {len(dx)} -> {len(df)} are not a flatten of leading dims"
    lead, a, b = dx[:-2], dx[-2], dx[-1]
    if not dims_equal(df, [math.prod(lead), a, b]):
        return f"{list(df)} is not {list(dx)} with its leading dims merged"
    if not dims_equal(do, [*lead, b, a]):
        return f"{list(do)} does not restore the leading dims of {list(dx)}"
    return True


@native_rewrite("LastTwoSwapped")
def last_two_swapped(ctx, x):
    rank = len(ctx.dims(x))  # type: ignore[arg-type]
    return {"perm": [*range(rank - 2), rank - 1, rank - 2]}


@native_constraint("OneIsAReshape")
def one_is_a_reshape(ctx, first, second):
    """Unsqueeze of Unsqueeze (and Squeeze of Squeeze) stay: they are the form in which
    exporters build attention masks, which the attention rules read."""
    if {first, second} & {"Reshape", "Flatten"}:
        return True
    return f"{second} of {first}: no Reshape to merge into"


def _reshape_of_dims(ctx, x, y):
    """The constant Reshape target that turns x into y's dims, or why there is none."""
    dx, dy = ctx.dims(x), ctx.dims(y)
    if dx is None or dy is None:
        return "the dims are not known"
    return constant_reshape_target(dx, dy)


@native_constraint("ReshapeOfDimsIsKnown")
def reshape_of_dims_is_known(ctx, x, y):
    found = _reshape_of_dims(ctx, x, y)
    return found if isinstance(found, str) else True


@native_rewrite("ReshapeOfDims")
def reshape_of_dims(ctx, x, y):
    found = _reshape_of_dims(ctx, x, y)
    if isinstance(found, str):
        raise RewriteDeclined(found)
    return {"value": np.asarray(found, dtype=np.int64)}
