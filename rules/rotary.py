"""Native helpers for rotary.pdll: the rotation's slices, the cos / sin values and their layout."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphopt.pattern.native import RewriteDeclined, native_constraint, native_rewrite

_INT64_MAX = np.iinfo(np.int64).max


def _head(ctx, x) -> tuple[int, int] | str:
    """(rank, head_dim) of x: a static, even last dim."""
    shape = ctx.shape(x)
    if shape is None or not shape:
        return "the rotated input's shape is unknown"
    if not isinstance(shape[-1], int):
        return "the rotated input's last dim is not static"
    if shape[-1] % 2:
        return f"the rotated input's last dim {shape[-1]} is odd"
    return len(shape), shape[-1]


def _slice_indices(ctx, starts, ends, axes, steps, rank: int, dim: int) -> tuple[int, list[int]] | str:
    """(axis, indices taken) of a Slice with constant bounds on one axis of size dim."""
    got = ctx.one_axis_slice(starts, ends, axes, steps, rank)
    if isinstance(got, str):
        return got
    axis, start, stop, step = got
    return axis, list(range(dim))[slice(start, stop, step)]


def _is_last(axis, rank: int) -> bool:
    return axis is not None and int(axis) in (-1, rank - 1)


def _same_dim(a: Any, b: Any) -> bool:
    return a == b and a is not None


@native_constraint("RotarySlices")
def rotary_slices(ctx, form, x, x1, s1, e1, a1, p1, s2, e2, a2, p2, cax, u1, u2, rshape):
    """The two Slices cut x's last axis into the halves (half: x1 = [0, d/2), x2 = [d/2, d))
    or the even / odd positions (interleaved: x1 = 0::2, x2 = 1::2), the Concat joins
    (-x2, x1) on the last axis (interleaved: stacked on a new last axis, then flattened
    back to x's shape)."""
    head = _head(ctx, x)
    if isinstance(head, str):
        return head
    rank, dim = head
    if form == "half":
        want1, want2 = list(range(dim // 2)), list(range(dim // 2, dim))
    else:
        want1, want2 = list(range(0, dim, 2)), list(range(1, dim, 2))
    for name, cut, want in (("first", (s1, e1, a1, p1), want1), ("second", (s2, e2, a2, p2), want2)):
        got = _slice_indices(ctx, *cut, rank, dim)
        if isinstance(got, str):
            return got
        axis, indices = got
        if axis != rank - 1:
            return f"the {name} Slice cuts axis {axis}, not the last one (rank {rank})"
        if indices != want:
            what = "half" if form == "half" else "every other element"
            return f"the {name} Slice takes {_span(indices)} of the last axis ({dim}), not the {name} {what} {_span(want)}"
    if form == "half":
        if not _is_last(cax, rank):
            return f"the Concat joins axis {cax}, not the last one"
        return True
    # interleaved: Unsqueeze both on a new last axis, Concat there, Reshape back to x's shape
    for name, axes in (("first", u1), ("second", u2)):
        got = ctx.ints(axes)
        if got is None or len(got) != 1 or got[0] not in (-1, rank):
            return f"the {name} Unsqueeze adds axes {got}, not a new last axis"
    if not _is_last(cax, rank + 1):
        return f"the stacking Concat joins axis {cax}, not the new last axis"
    return _flattens_back(ctx, x, x1, rshape, rank, dim)


def _span(indices: list[int]) -> str:
    if not indices:
        return "nothing"
    step = indices[1] - indices[0] if len(indices) > 1 else 1
    return f"[{indices[0]}:{indices[-1] + 1}{'' if step == 1 else f':{step}'}]"


def _flattens_back(ctx, x, x1, rshape, rank: int, dim: int):
    """The Reshape after the stacking Concat gives x's shape back (merges only the last two axes)."""
    target = ctx.ints(rshape)
    xshape = ctx.shape(x)
    if target is not None:
        if len(target) != rank or target[-1] != dim:
            return f"the Reshape after the stack makes {target}, not x's shape"
        for t, d in zip(target[:-1], xshape[:-1]):
            if not (t == 0 or t == -1 or t == d):
                return f"the Reshape after the stack makes {target}, not x's shape {list(xshape)}"
        if target.count(-1) > 1:
            return f"the Reshape after the stack makes {target}"
        return True
    # A computed target (Shape / Concat at run time): trust the inferred shape of the Reshape's output.
    out = _stack_reshape_output(ctx, x1)
    oshape = None if out is None else ctx.shape(out)
    if oshape is None or len(oshape) != rank or not all(_same_dim(a, b) for a, b in zip(oshape, xshape)):
        return f"the Reshape after the stack is not known to give x's shape back (it gives {None if oshape is None else list(oshape)})"
    return True


def _stack_reshape_output(ctx, x1):
    view = ctx.view
    value = x1
    for op in ("Unsqueeze", "Concat", "Reshape"):
        users = [u for u in view.users(value) if view.op_key(u) == ("", op)]
        if len(users) != 1:
            return None
        value = view.outputs(users[0])[0]
    return value


# ----------------------------------------------------------------------------- cos / sin


def _axis_list(ctx, node, index: int, attr: str) -> list[int] | None:
    view = ctx.view
    inputs = view.inputs(node)
    if len(inputs) > index and inputs[index] is not None:
        return ctx.ints(inputs[index])
    value = view.attr(node, attr)
    try:
        return [int(v) for v in np.asarray(value).reshape(-1)]
    except (TypeError, ValueError):
        return None


def _keeps_last(ctx, node, data, out) -> bool | str:
    """Whether a node that does not compute (layout and selection ops) keeps every row of
    the last axis intact: the last axis in is the last axis out, unsliced."""
    view = ctx.view
    op = view.op_key(node)[1]
    in_shape, out_shape = ctx.shape(data), ctx.shape(out)
    in_rank = None if in_shape is None else len(in_shape)
    out_rank = None if out_shape is None else len(out_shape)
    if op in ("Cast", "Identity", "Neg"):
        return True
    if op == "Unsqueeze":
        axes = _axis_list(ctx, node, 1, "axes")
        if axes is None or out_rank is None:
            return False
        return all((a + out_rank if a < 0 else a) != out_rank - 1 for a in axes)
    if op == "Squeeze":
        return in_shape is not None and in_shape[-1] != 1 and isinstance(in_shape[-1], int)
    if op in ("Slice",):
        axes = _axis_list(ctx, node, 3, "axes")
        if axes is None or in_rank is None:
            return False
        return all((a + in_rank if a < 0 else a) != in_rank - 1 for a in axes)
    if op in ("Gather", "GatherElements"):
        axis = view.attr(node, "axis")
        axis = 0 if axis is None or not isinstance(axis, (int, np.integer)) else int(axis)
        if in_rank is None:
            return False
        if op == "GatherElements":
            return False  # may reorder within rows
        return (axis + in_rank if axis < 0 else axis) != in_rank - 1
    if op == "Transpose":
        perm = view.attr(node, "perm")
        try:
            perm = [int(p) for p in perm]
        except TypeError:
            return False
        return bool(perm) and perm[-1] == len(perm) - 1
    if op in ("Expand", "Reshape"):
        return (in_shape is not None and out_shape is not None and isinstance(in_shape[-1], int)
                and in_shape[-1] == out_shape[-1] and in_shape[-1] != 1)
    return False


_SCALING = ("Mul", "Div", "Add", "Sub")


def _scalar_operand(ctx, node) -> Any | None:
    """The non-constant input of a Mul / Div / Add / Sub whose other input is a constant
    that is the same along the last axis (a scalar, or a last dim of 1)."""
    inputs = ctx.view.inputs(node)
    if len(inputs) != 2:
        return None
    for i, c in ((0, 1), (1, 0)):
        array = ctx.array(inputs[c])
        if array is not None and (array.ndim == 0 or array.shape[-1] == 1) and not ctx.view.is_const(inputs[i]):
            if ctx.view.op_key(node)[1] in ("Div", "Sub") and c == 0:
                return None  # c / v and c - v: fine for equality but keep it simple
            return inputs[i]
    return None


def _repeats_pairs(ctx, node) -> bool:
    """Reshape(Expand / Tile(Unsqueeze(c, new last axis), [.., 2]) or Concat(u, u) on that axis)."""
    view = ctx.view
    data = view.inputs(node)[0]
    rep = view.producer(data)
    if rep is None:
        return False
    op = view.op_key(rep)[1]
    inputs = view.inputs(rep)
    if op == "Concat":
        if len(inputs) != 2 or inputs[0] is not inputs[1]:
            return False
        u = inputs[0]
        rank = ctx.rank(u)
        if rank is None or not _is_last(view.attr(rep, "axis"), rank):
            return False
    elif op in ("Expand", "Tile"):
        u, times = inputs[0], ctx.ints(inputs[1])
        rank = ctx.rank(u)
        if times is None or rank is None or times[-1] != 2 or any(t != 1 for t in times[:-1]):
            return False
        if op == "Tile" and len(times) != rank:
            return False
    else:
        return False
    producer = view.producer(u)
    if producer is None or view.op_key(producer) != ("", "Unsqueeze"):
        return False
    axes = _axis_list(ctx, producer, 1, "axes")
    if axes is None or rank is None or (rank - 1) not in [a + rank if a < 0 else a for a in axes]:
        return False
    src = ctx.shape(view.inputs(producer)[0])
    out = ctx.shape(view.outputs(node)[0])
    return (src is not None and out is not None and isinstance(src[-1], int)
            and out[-1] == 2 * src[-1])


def _trace(ctx, value, form: str, name: str) -> tuple[str | None, str | None]:
    """Follow cos / sin up through ops that keep rows intact to where its last axis is made
    of repeated half-width values. Returns (problem, trig op met on the way)."""
    view = ctx.view
    trig = None
    for _ in range(32):
        array = ctx.array(value)
        if array is not None:
            if array.ndim == 0 or array.shape[-1] % 2:
                return f"the constant {name} has an odd last axis", trig
            half = array.shape[-1] // 2
            if form == "half":
                same = np.array_equal(array[..., :half], array[..., half:])
            else:
                same = np.array_equal(array[..., 0::2], array[..., 1::2])
            return (None if same else f"the constant {name}'s {'halves' if form == 'half' else 'pairs'} differ"), trig
        node = view.producer(value)
        if node is None:
            return f"{name} is a graph input: its halves are not known to repeat", trig
        domain, op = view.op_key(node)
        inputs = view.inputs(node)
        if domain != "":
            return f"{name} comes from {domain}.{op}", trig
        if op in ("Cos", "Sin"):
            trig = trig or op.lower()
            value = inputs[0]
            continue
        if form == "half" and op == "Concat" and len(inputs) == 2 and inputs[0] is inputs[1]:
            rank = ctx.rank(value)
            if rank is not None and _is_last(view.attr(node, "axis"), rank):
                return None, trig
            return f"{name} is a Concat of one value twice, but not on the last axis", trig
        if form == "interleaved" and op == "Reshape" and _repeats_pairs(ctx, node):
            return None, trig
        if op in _SCALING:
            other = _scalar_operand(ctx, node)
            if other is None:
                return f"{name} is a {op} of values that may differ along the last axis", trig
            value = other
            continue
        if inputs and inputs[0] is not None and _keeps_last(ctx, node, inputs[0], view.outputs(node)[0]) is True:
            value = inputs[0]
            continue
        what = "cat(c, c)" if form == "half" else "c repeated pairwise"
        return f"{name} is not known to be {what} ({op} in the way)", trig
    return f"{name} comes from too long a chain", trig


@native_constraint("RotaryCosSin")
def rotary_cos_sin(ctx, form, x, cos, sin):
    """cos and sin have x's rank, dtype and last dim, the same shape, and repeat their
    half-width values (cat(c, c), or pairwise for the interleaved form), so the fused op's
    half-width caches carry all of them; traced to Cos / Sin ops, cos is the one from Cos."""
    head = _head(ctx, x)
    if isinstance(head, str):
        return head
    rank, dim = head
    for name, v in (("cos", cos), ("sin", sin)):
        shape = ctx.shape(v)
        if shape is None or len(shape) != rank:
            return f"{name} has shape {None if shape is None else list(shape)}, not rank {rank}"
        if shape[-1] != dim:
            return f"{name}'s last dim is {shape[-1]}, the rotated input's {dim} (a partial rotary is fused on its rotated Slice only)"
        if ctx.dtype(v) != ctx.dtype(x):
            return f"{name} is {ctx.dtype(v)}, the input {ctx.dtype(x)}"
    if list(ctx.shape(cos)) != list(ctx.shape(sin)):
        return f"cos and sin differ in shape: {list(ctx.shape(cos))} vs {list(ctx.shape(sin))}"
    kinds = {}
    for name, v in (("cos", cos), ("sin", sin)):
        problem, trig = _trace(ctx, v, form, name)
        if problem is not None:
            return problem
        kinds[name] = trig
    if kinds["cos"] == "sin" or kinds["sin"] == "cos":
        return "cos and sin are swapped: x is multiplied by a Sin and the rotated half by a Cos"
    return True


def _check_layout(ctx, x, cos, layout: str, batch: str) -> str | None:
    """None if x is 4-D with the heads on axis 1 ("bnsh") or 2 ("bsnh"), cos broadcasts over
    the heads (1 there) and has x's sequence dim, and its batch dim is 1 ("one") or x's
    batch ("batch"); otherwise why not."""
    xs, cs = ctx.shape(x), ctx.shape(cos)
    if xs is None or len(xs) != 4 or cs is None or len(cs) != 4:
        return f"the rotated input has shape {None if xs is None else list(xs)}, not 4-D"
    heads, seq = (1, 2) if layout == "bnsh" else (2, 1)
    if cs[heads] != 1:
        want = "[batch, heads, seq, head]" if layout == "bnsh" else "[batch, seq, heads, head]"
        return f"cos {list(cs)} does not broadcast over axis {heads}: not the {want} layout"
    if cs[seq] == 1 and xs[seq] != 1:
        return f"cos {list(cs)} has one position for the sequence of x {list(xs)}"
    if isinstance(cs[seq], int) and isinstance(xs[seq], int) and cs[seq] != xs[seq]:
        return f"cos {list(cs)} and x {list(xs)} differ in sequence length"
    one = cs[0] == 1
    same = _same_dim(cs[0], xs[0]) and not one
    if batch == "one" and not one:
        return f"cos {list(cs)} has a batch dim {cs[0]}, not 1 (positions shared by the batch)"
    if batch == "batch" and not same:
        return f"cos {list(cs)} has a batch dim {cs[0]}, not x's {xs[0]}"
    return None


def _layout(ctx, x, cos) -> tuple[str | None, str]:
    """("bnsh" | "bsnh" | "batched", "") for the layouts the rule rewrites, else (None, why not)."""
    problem = _check_layout(ctx, x, cos, "bnsh", "one")
    if problem is None:
        return "bnsh", ""
    if _check_layout(ctx, x, cos, "bnsh", "batch") is None:
        return "batched", ""
    if _check_layout(ctx, x, cos, "bsnh", "one") is None:
        return "bsnh", ""
    return None, problem


@native_constraint("RotaryLayout")
def rotary_layout(ctx, x, cos):
    """x and cos in one of the layouts FuseRotaryEmbedding rewrites (see rotary.pdll)."""
    layout, problem = _layout(ctx, x, cos)
    return True if layout is not None else problem


@native_rewrite("RotaryCaches")
def rotary_caches(ctx, form, x, cos):
    """Slice bounds that cut the half-width values out of cos / sin on the last axis, the
    shapes and scalars the rewrites use, and the layout (which replacement applies)."""
    head = _head(ctx, x)
    if isinstance(head, str):
        raise RewriteDeclined(head)
    _, dim = head
    layout, problem = _layout(ctx, x, cos)
    if layout is None:
        raise RewriteDeclined(problem)
    i64 = np.int64
    step = 1 if form == "half" else 2
    return {
        "starts": np.array([0], i64),
        "ends": np.array([dim // 2 if form == "half" else dim], i64),
        "axes": np.array([-1], i64),
        "steps": np.array([step], i64),
        "cache2d": np.array([-1, dim // 2], i64),
        "cache3d": np.array([0, -1, dim // 2], i64),
        "hidden3d": np.array([0, 0, -1], i64),
        "offset": np.array([0], i64),
        "zero": np.array(0, i64),
        "one": np.array(1, i64),
        "last": np.array([-1], i64),
        "ones2": np.array([1, 1], i64),
        "interleaved": 0 if form == "half" else 1,
        "layout": layout,
        # The standard RotaryEmbedding takes [batch, heads, seq, head] with caches per batch row.
        "standard_layout": "bnsh" if layout in ("bnsh", "batched") else layout,
    }
