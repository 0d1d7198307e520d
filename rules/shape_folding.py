"""Native helpers for shape_folding.pdll."""

from __future__ import annotations

import numpy as np

from graphopt.ir.reshape_target import constant_reshape_target
from graphopt.ir.symbolic import SymbolicShapes, static_int
from graphopt.pattern.ir import MISSING
from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite


def _dims(ctx, x, start, end):
    """x's dims start..end: the recorded ones, and where a recorded dim is not an int, the
    static size derived through the shape computation when there is one."""
    shape = ctx.shape(x)
    if shape is None or any(not isinstance(d, int) for d in shape):
        derived = ctx.dims(x)
        if derived is not None and (shape is None or len(shape) == len(derived)):
            recorded = shape if shape is not None else (None,) * len(derived)
            shape = tuple(d if isinstance(d, int) or static_int(s) is None else static_int(s) for d, s in zip(recorded, derived, strict=True))
    if shape is None:
        return None
    rank = len(shape)
    lo = 0 if start is None else max(0, min(rank, start + rank if start < 0 else start))
    hi = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    return shape[lo:hi]


@native_constraint("ShapeIsStatic")
def shape_is_static(ctx, x, start, end):
    dims = _dims(ctx, x, start, end)
    if dims is None:
        return "the rank is unknown"
    symbolic = [d for d in dims if not isinstance(d, int)]
    return True if not symbolic else f"dims {symbolic} are not static"


@native_rewrite("ShapeConstant")
def shape_constant(ctx, kind, x, start, end):
    """Shape's dims (start..end; Size has neither: all of them), or Size's element count."""
    dims = _dims(ctx, x, start, end)
    if kind == "Size":
        return {"value": np.asarray(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)}
    return {"value": np.asarray(dims, dtype=np.int64)}


@native_constraint("GatheredDimsAreStatic")
def gathered_dims_are_static(ctx, x, start, indices, axis):
    dims = _dims(ctx, x, start, None)
    if dims is None:
        return "the rank is unknown"
    picked = ctx.array(indices)
    if picked is None or picked.dtype.kind not in "iu":
        return "the indices are not constant integers"
    n = len(dims)
    if np.any(picked < -n) or np.any(picked >= n):
        return "the indices are out of range"
    chosen = [dims[int(i)] for i in picked.reshape(-1)]
    symbolic = [d for d in chosen if not isinstance(d, int)]
    return True if not symbolic else f"gathered dims {symbolic} are not static"


@native_rewrite("GatheredDims")
def gathered_dims(ctx, x, start, indices):
    dims = _dims(ctx, x, start, None)
    picked = np.asarray(ctx.array(indices)).astype(np.int64)
    return {"value": np.asarray([dims[int(i)] for i in picked.reshape(-1)], dtype=np.int64).reshape(picked.shape)}


@native_rewrite("SlicedDims")
def sliced_dims(ctx, x, start, end, starts, ends, axes, steps):
    dims = _dims(ctx, x, start, end)
    if dims is None:
        raise RewriteDeclined("the rank is unknown")
    if axes is not None and [int(a) for a in ctx.array(axes).reshape(-1)] not in ([0], [-1]):
        raise RewriteDeclined("slices along an axis a 1-D shape does not have")
    step = 1 if steps is None else int(ctx.array(steps).reshape(-1)[0])
    if step == 0:
        raise RewriteDeclined("a Slice step of 0 is invalid")
    begin, stop = int(ctx.array(starts).reshape(-1)[0]), int(ctx.array(ends).reshape(-1)[0])
    # Python slicing clamps like ONNX Slice does (INT64_MAX / INT64_MIN ends included).
    picked = list(dims)[slice(begin, stop, step)]
    symbolic = [d for d in picked if not isinstance(d, int)]
    if symbolic:
        raise RewriteDeclined(f"sliced dims {symbolic} are not static")
    return {"value": np.asarray(picked, dtype=np.int64)}


def _recorded_parts(ctx, target):
    """The target's entries without symbolic reasoning, where it is a Concat (or one part) of
    constants and Gathers of one dim of a Shape, as exporters write flatten targets: each entry
    an int, or (value, axis) for a dim the recorded shape leaves symbolic; None for other forms."""
    node = ctx.view.producer(target)
    parts = list(ctx.view.inputs(node)) if node is not None and ctx.view.op_key(node) == ("", "Concat") else [target]
    entries: list = []
    for part in parts:
        const = ctx.array(part) if part is not None else None
        if const is not None:
            entries += [int(v) for v in const.reshape(-1)]
            continue
        gather = ctx.view.producer(part) if part is not None else None
        if gather is None or ctx.view.op_key(gather) != ("", "Gather"):
            return None
        data, index = ctx.view.inputs(gather)
        shape_node = ctx.view.producer(data) if data is not None else None
        idx = ctx.array(index) if index is not None else None
        if shape_node is None or ctx.view.op_key(shape_node) != ("", "Shape") or idx is None or idx.size != 1:
            return None
        start, end = ctx.view.attr(shape_node, "start"), ctx.view.attr(shape_node, "end")
        if start not in (MISSING, None, 0) or end not in (MISSING, None):
            return None  # a slice of the shape: its own axes
        source = ctx.view.inputs(shape_node)[0]
        recorded = ctx.shape(source)
        if recorded is None:
            return None
        axis = int(idx.reshape(-1)[0]) % len(recorded)
        dim = recorded[axis]
        entries.append(dim if isinstance(dim, int) else (source, axis))
    return entries


def _recorded_target(ctx, x, target, allowzero):
    """The constant target from recorded shapes alone (no sympy: small models optimize without
    it), or None where that needs symbolic reasoning."""
    entries = _recorded_parts(ctx, target)
    if entries is None:
        return None
    out = []
    for i, entry in enumerate(entries):
        if isinstance(entry, int):
            out.append(entry)
        elif not allowzero and entry[0] is x and entry[1] == i:
            out.append(0)  # the input's own dim at that axis: Reshape's 0 copies it
        else:
            out.append(None)
    unknown = [i for i, v in enumerate(out) if v is None]
    if not unknown:
        return out
    if len(unknown) > 1 or -1 in out:
        return None
    src = ctx.shape(x)
    for i, v in enumerate(out):
        size = (src[i] if src is not None and i < len(src) else None) if v == 0 else v
        if i != unknown[0] and not (isinstance(size, int) and size > 0):
            return None  # -1 beside a dim that may be 0 is ambiguous: the symbolic path decides
    out[unknown[0]] = -1
    return out


def _known_target(ctx, x, target, allowzero):
    """The constant a Reshape's computed target can be replaced with, or why there is none."""
    if ctx.array(target) is not None:
        return "the target is a constant (nothing to do)"
    recorded = _recorded_target(ctx, x, target, allowzero)
    if recorded is not None:
        return recorded
    values = SymbolicShapes(ctx.view).tensor(target)
    if values is None:
        return "the target's values are not known"
    return constant_reshape_target(ctx.dims(x), values, allowzero)


@native_constraint("ReshapeTargetIsKnown")
def reshape_target_is_known(ctx, x, target, allowzero):
    found = _known_target(ctx, x, target, allowzero)
    return found if isinstance(found, str) else True


@native_rewrite("KnownReshapeTarget")
def known_reshape_target(ctx, x, target, allowzero):
    found = _known_target(ctx, x, target, allowzero)
    if isinstance(found, str):
        raise RewriteDeclined(found)
    return {"value": np.asarray(found, dtype=np.int64)}
