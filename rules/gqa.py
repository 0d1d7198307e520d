"""Native helpers for gqa.pdll: the KV-cache attention's shapes and the repeat of the kv heads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphopt.ir.symbolic import SymbolicShapes, dims_equal, static_int
from graphopt.pattern.native import Attr, RewriteDeclined, Tag, Value, native_constraint, native_rewrite


@dataclass(frozen=True)
class GqaMatch:
    """What FuseGroupQueryAttention bound, as GqaShapes reads it."""

    mha: Value  # the graphopt.MultiHeadAttention's output
    q3: Value  # the attention's query: [batch, seq, heads * head]
    k_new: Value  # [batch, kv_heads, seq, head]
    v_new: Value
    past_k: Value  # [batch, kv_heads, past, head]
    past_v: Value
    kax: Attr  # the Concat axes
    vax: Attr
    heads: Attr  # the attention's num_heads
    bias: Value  # the attention's mask (added to the scores), None without one
    kform: Tag  # repeat, tile or plain: how the cached k reaches the attention
    vform: Tag


def _fmt(dims: Any) -> str:
    return "unknown" if dims is None else "[" + ", ".join(str(d) for d in dims) + "]"


def _repeat_problem(ctx, mha_value, index: int, form: str, name: str, kv_heads: int, group: int) -> str | None:
    """The repeat between the cache Concat and the attention's input `index` gives query head
    i the kv head i // group (repeat_kv / repeat_interleave), or is absent with group 1."""
    view = ctx.view
    node = view.producer(mha_value)
    reshape3 = view.producer(view.inputs(node)[index])
    transpose = view.producer(view.inputs(reshape3)[0])
    repeated = view.inputs(transpose)[0]
    if form == "plain":
        return None if group == 1 else f"{name} has {kv_heads} heads, q {kv_heads * group}, and is not repeated"
    if form == "tile":
        return (f"{name}'s heads are repeated with Tile, as a block (query head i would read kv head i % {kv_heads}); "
                f"GroupQueryAttention gives query head i the kv head i // {group}")
    reshape = view.producer(repeated)
    expand = view.producer(view.inputs(reshape)[0])
    unsqueeze = view.producer(view.inputs(expand)[0])
    cat = view.inputs(unsqueeze)[0]
    dc, du, de, dr = ctx.dims(cat), ctx.dims(view.outputs(unsqueeze)[0]), ctx.dims(view.outputs(expand)[0]), ctx.dims(repeated)
    if dc is None or du is None or de is None or dr is None or len(dc) != 4:
        return f"the dims of {name}'s repeat are not known"
    b, kv, t, h = dc
    if not dims_equal(du, [b, kv, 1, t, h]):
        return f"{name}'s repeat adds its axis at {_fmt(du)}, not [batch, kv_heads, 1, seq, head] (query head i would not read kv head i // {group})"
    if not dims_equal(de, [b, kv, group, t, h]):
        return f"{name}'s repeat expands to {_fmt(de)}, not [batch, {kv_heads}, {group}, seq, head]"
    if not dims_equal(dr, [b, kv * group, t, h]):
        return f"{name}'s repeat is reshaped to {_fmt(dr)}, not [batch, {kv_heads * group}, seq, head]"
    return None


# ----------------------------------------------------------------------------- the mask


def _where_keep(ctx, bias) -> tuple[Any, str | None]:
    """(keep, None) for bias = Where(keep, 0, fill) with a fill whose exp underflows to 0 next to any
    visible score (-inf, or at most float16's lowest: what exporters write in either type), else
    (None, why not)."""
    view = ctx.view
    folded = ctx.array(bias)
    if folded is not None:  # Where(keep, 0, fill) folded (static shapes): keep is where it is 0
        if folded.dtype.kind != "f" or not np.all((folded == 0) | (folded <= -65504.0)):
            return None, "the mask is a constant with values other than 0 and fill <= -65504"
        return folded == 0, None
    node = view.producer(bias)
    if node is None or view.op_key(node) != ("", "Where"):
        return None, f"the mask comes from {'a graph input' if node is None else view.label(node)}, not Where(keep, 0, fill)"
    keep, zero, fill = view.inputs(node)
    fill_value = ctx.scalar(fill)
    if ctx.scalar(zero) != 0.0 or fill_value is None or fill_value > -65504.0:
        return None, f"the mask is Where(keep, {ctx.scalar(zero)}, {fill_value}), not Where(keep, 0, fill <= -65504)"
    return keep, None


def _range(ctx, value) -> tuple[Any, Any] | None:
    """(start, length) as symbolic scalars of value = Range(start, limit, 1) or Range(0, n, 1) + c."""
    view, sym = ctx.view, SymbolicShapes(ctx.view)
    node = view.producer(value)
    if node is None:
        return None
    op = view.op_key(node)
    ins = view.inputs(node)
    if op == ("", "Add"):
        for r, c in ((ins[0], ins[1]), (ins[1], ins[0])):
            inner, offset = _range(ctx, r), sym.tensor(c)
            if inner is not None and offset is not None and len(offset) == 1 and inner[0] == 0:
                return offset[0], inner[1]
        return None
    if op != ("", "Range") or ctx.scalar(ins[2]) != 1.0:
        return None
    start, limit = sym.tensor(ins[0]), sym.tensor(ins[1])
    if start is None or limit is None or len(start) != 1 or len(limit) != 1:
        return None
    return start[0], limit[0] - start[0]


def _positions(ctx, value, axis: int) -> tuple[Any, Any] | None:
    """(start, length) of a Range moved by Unsqueezes onto `axis` (-1 or -2) of a 4-D tensor of 1s
    elsewhere, or of such a constant (folded where the shapes are static)."""
    view = ctx.view
    dims = ctx.dims(value)
    if dims is None or len(dims) != 4 or any(static_int(d) != 1 for i, d in enumerate(dims) if i != axis % 4):
        return None
    const = ctx.array(value)
    if const is not None:
        flat = const.reshape(-1)
        if const.dtype.kind not in "iu" or not flat.size or not np.array_equal(flat, flat[0] + np.arange(flat.size)):
            return None
        return int(flat[0]), int(flat.size)
    while (node := view.producer(value)) is not None and view.op_key(node) == ("", "Unsqueeze"):
        value = view.inputs(node)[0]
    found = _range(ctx, value)
    return found if found is not None and ctx.rank(value) == 1 else None


def _is_causal(ctx, keep, past, seq, total, depth: int = 0) -> bool:
    """keep is false wherever key position t > past + query row s: an And with (or a broadcast
    of) kv_pos <= q_pos, kv_pos = 0 .. total - 1 on the last axis, q_pos = past .. past + seq - 1 on
    the one before."""
    view = ctx.view
    const = keep if isinstance(keep, np.ndarray) else ctx.array(keep)
    if const is not None:
        allowed = _causal_constant(past, seq, total)
        return allowed is not None and const.dtype == np.bool_ and const.ndim >= 2 and const.shape[-2:] == allowed.shape \
            and not np.any(const & ~allowed)
    node = view.producer(keep)
    if node is None or depth > 16:
        return False
    op = view.op_key(node)
    ins = view.inputs(node)
    if op == ("", "And"):
        return any(_is_causal(ctx, x, past, seq, total, depth + 1) for x in ins)
    if op in (("", "Expand"), ("", "Cast")):
        return ctx.dtype(ins[0]) == "bool" and _is_causal(ctx, ins[0], past, seq, total, depth + 1)
    if op in (("", "LessOrEqual"), ("", "GreaterOrEqual")):
        kv, q = ins if op[1] == "LessOrEqual" else ins[::-1]
        kv_pos, q_pos = _positions(ctx, kv, -1), _positions(ctx, q, -2)
        if kv_pos is None or q_pos is None:
            return False
        return dims_equal([kv_pos[0], kv_pos[1], q_pos[0], q_pos[1]], [0, total, past, seq])
    return False


def _causal_constant(past, seq, total) -> np.ndarray | None:
    """kv_pos <= past + q_pos as a [seq, total] bool array, where the three are static."""
    p, s, t = static_int(past), static_int(seq), static_int(total)
    if p is None or s is None or t is None:
        return None
    return np.arange(t)[None, :] <= p + np.arange(s)[:, None]


def _and_terms(ctx, keep, depth: int = 0) -> list[Any]:
    """The terms And-ed into keep (through Expand and Casts of bool)."""
    view = ctx.view
    node = view.producer(keep)
    if node is None or depth > 16:
        return [keep]
    op, ins = view.op_key(node), view.inputs(node)
    if op == ("", "And"):
        return [term for x in ins for term in _and_terms(ctx, x, depth + 1)]
    if op in (("", "Expand"), ("", "Cast")) and ctx.dtype(ins[0]) == "bool":
        return _and_terms(ctx, ins[0], depth + 1)
    return [keep]


def _window_of(ctx, term, past, seq, total) -> int | None:
    """w where the term is kv_pos > q_pos - w (Greater(kv, Sub(q, w)) or Less(Sub(q, w), kv), w a constant > 0;
    the positions as _is_causal reads them): the sliding window (Mistral, Gemma-2) of w keys up to the query's own."""
    view = ctx.view
    node = view.producer(term)
    if node is None or view.op_key(node) not in (("", "Greater"), ("", "Less")):
        return None
    kv, bound = view.inputs(node) if view.op_key(node) == ("", "Greater") else view.inputs(node)[::-1]
    sub = view.producer(bound)
    if sub is None or view.op_key(sub) != ("", "Sub"):
        return None
    q, width = view.inputs(sub)
    w = ctx.scalar(width)
    if w is None or w != int(w) or w < 1:
        return None
    kv_pos, q_pos = _positions(ctx, kv, -1), _positions(ctx, q, -2)
    if kv_pos is None or q_pos is None or not dims_equal([kv_pos[0], kv_pos[1], q_pos[0], q_pos[1]], [0, total, past, seq]):
        return None
    return int(w)


def _everywhere_true(ctx, term) -> bool:
    array = ctx.array(term)
    return array is not None and array.dtype == np.bool_ and bool(array.all())


def _mask_plan(ctx, bias, past, seq, total) -> tuple[str | None, str | None, int]:
    """("causal" | "padding", None, window): the mask is causal alone, or causal and a sliding window of `window`
    keys (GroupQueryAttention's causal = 1 and local_window_size do all it does; window -1 without one), or causal
    and more (it also goes in as attention_bias, which carries any window itself); (None, why not, -1)."""
    if bias is None and static_int(seq) == 1:  # one query at the last position: causal hides nothing (a decode step)
        return "causal", None, -1
    if bias is None:
        return None, ("the attention has no mask: bidirectional over the cache, while GroupQueryAttention "
                      "runs several new tokens over a past at batch > 1 only with causal = 1"), -1
    keep, problem = _where_keep(ctx, bias)
    if keep is None:
        return None, problem, -1
    if not _is_causal(ctx, keep, past, seq, total):
        return None, ("the mask is not known to hide every key after the query's position (kv_pos <= past + q_pos, "
                      "Range-built): GroupQueryAttention's causal = 1 would hide them"), -1
    value, node = keep, None
    while not isinstance(value, np.ndarray) and (node := ctx.view.producer(value)) is not None \
            and ctx.view.op_key(node) in (("", "Expand"), ("", "Cast")):
        value = ctx.view.inputs(node)[0]
    const = value if isinstance(value, np.ndarray) else ctx.array(value)
    allowed = _causal_constant(past, seq, total)
    if const is not None:  # folded: only causal if it is the causal pattern itself, in every leading row
        only_causal = allowed is not None and const.shape[-2:] == allowed.shape and bool(np.all(const == allowed))
        return ("causal" if only_causal else "padding"), None, -1
    windows, other = set(), False
    for term in _and_terms(ctx, keep):
        if isinstance(term, np.ndarray) or _everywhere_true(ctx, term):
            continue
        window = _window_of(ctx, term, past, seq, total)
        if window is not None:
            windows.add(window)
        elif not _is_causal(ctx, term, past, seq, total):
            other = True
    if other or len(windows) > 1:
        return "padding", None, -1
    return "causal", None, (windows.pop() if windows else -1)


@native_constraint("GqaShapes", params=GqaMatch)
def gqa_shapes(ctx, m: GqaMatch):
    """q [B, S, N * H]; new k, v [B, KV, S, H] (one head size, as many new tokens as q); past k, v
    [B, KV, P, H], concatenated on axis 2; N a multiple of KV, the kv heads repeated so that query
    head i reads kv head i // (N / KV); one float dtype."""
    dk, dv, dpk, dpv = (ctx.dims(x) for x in (m.k_new, m.v_new, m.past_k, m.past_v))
    if any(d is None or len(d) != 4 for d in (dk, dv, dpk, dpv)):
        return f"new k, new v, past k, past v have dims {', '.join(_fmt(d) for d in (dk, dv, dpk, dpv))}; expected 4-D [batch, kv_heads, seq, head]"
    for name, axis in (("k", m.kax), ("v", m.vax)):
        if axis not in (2, -2):
            return f"the {name} cache is concatenated on axis {axis}, not the sequence axis 2"
    heads, kv_heads, head = m.heads, static_int(dk[1]), static_int(dk[3])
    if kv_heads is None or head is None:
        return f"the kv heads or the head size are not static: new k {_fmt(dk)}"
    if kv_heads == 0 or heads % kv_heads:
        return f"{heads} query heads are not a multiple of {kv_heads} kv heads"
    batch, seq = dk[0], dk[2]
    for name, d in (("new v", dv), ("past k", dpk), ("past v", dpv)):
        if not dims_equal([d[0], d[1], d[3]], [batch, kv_heads, head]):
            return f"{name} has dims {_fmt(d)}, not [{batch}, {kv_heads}, _, {head}] (GroupQueryAttention takes one head size for q, k and v)"
    if not dims_equal([dv[2]], [seq]):
        return f"the new v has {dv[2]} tokens, the new k {seq}"
    if not dims_equal([dpk[2]], [dpv[2]]):
        return f"the past k and v have different lengths ({dpk[2]}, {dpv[2]})"
    dtypes = {ctx.dtype(x) for x in (m.k_new, m.v_new, m.past_k, m.past_v)}
    if len(dtypes) != 1 or not dtypes <= {"f32", "f16", "bf16"}:
        return f"k, v and the cache are {sorted(map(str, dtypes))}, not one of f32, f16, bf16"
    group = heads // kv_heads
    total = dpk[2] + seq
    inputs = ctx.view.inputs(ctx.view.producer(m.mha))
    for index, length, name in ((0, seq, "q"), (1, total, "k"), (2, total, "v")):
        d3 = ctx.dims(inputs[index])
        if not dims_equal(d3, [batch, length, heads * head]):
            what = "GroupQueryAttention appends as many tokens as it attends from" if name == "q" else "its heads merged"
            return f"the attention's {name} is {_fmt(d3)}, not [{batch}, {length}, {heads * head}] ({what})"
    for index, form, name in ((1, m.kform, "the cached k"), (2, m.vform, "the cached v")):
        problem = _repeat_problem(ctx, m.mha, index, form, name, kv_heads, group)
        if problem is not None:
            return problem
    _, problem, _ = _mask_plan(ctx, m.bias, dpk[2], seq, total)
    return True if problem is None else problem


@native_rewrite("GqaPlan")
def gqa_plan(ctx, k_new, past_k, bias):
    dk, dp = ctx.dims(k_new), ctx.dims(past_k)
    kv_heads = static_int(dk[1]) if dk is not None else None
    if kv_heads is None or dp is None:  # checked by GqaShapes
        raise RewriteDeclined("the number of kv heads is not static")
    mask, problem, window = _mask_plan(ctx, bias, dp[2], dk[2], dp[2] + dk[2])
    if mask is None:
        raise RewriteDeclined(problem or "the mask is not causal")
    return {
        "kv_heads": int(kv_heads),
        "to_bsd": np.array([0, 0, -1], dtype=np.int64),
        "one": np.array([1], dtype=np.int64),
        "scalar": np.array([], dtype=np.int64),
        "mask": mask,
        "window": window,
    }


# ----------------------------------------------------------------------------- rotary into the op


def _same_constant(ctx, a, b) -> bool:
    x, y = ctx.array(a), ctx.array(b)
    return x is not None and y is not None and x.dtype == y.dtype and x.shape == y.shape and bool(np.array_equal(x, y))


def _slice_span(ctx, node, dim: int) -> tuple[int, int] | None:
    """(start, end) of a Slice on the last axis (of `dim`) with step 1, else None."""
    ins = ctx.view.inputs(node)
    starts, ends = ctx.ints(ins[1]), ctx.ints(ins[2])
    axes = ctx.ints(ins[3]) if len(ins) > 3 and ins[3] is not None else [0]
    steps = ctx.ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1]
    rank = ctx.rank(ins[0])
    if None in (starts, ends, axes, steps, rank) or len(starts) != 1 or len(ends) != 1 or len(axes) != 1 or steps != [1]:
        return None
    if axes[0] % rank != rank - 1:
        return None
    start, end = (min(max(v + dim if v < 0 else v, 0), dim) for v in (starts[0], ends[0]))
    return start, end


def _partial_problem(ctx, rotated, name: str, head: int, half: int) -> str | None:
    """Concat(rotary(Slice [0, 2 * half)), Slice [2 * half, head)) on the last axis: the first 2 * half dims
    rotated, the rest passed through in place; None when it is, else why not."""
    view = ctx.view
    concat = view.producer(rotated)
    ins = view.inputs(concat)
    axis = view.attr(concat, "axis")
    if len(ins) != 2 or axis is None or int(axis) % 4 != 3:
        return f"the partial rotary's Concat of {name} joins {len(ins)} inputs on axis {axis}, not 2 on the last"
    rot_slice = view.producer(view.inputs(view.producer(ins[0]))[0])
    spans = [_slice_span(ctx, n, head) for n in (rot_slice, view.producer(ins[1]))]
    if spans != [(0, 2 * half), (2 * half, head)]:
        return f"{name}'s partial rotary cuts the head ({head}) at {spans}, not [(0, {2 * half}), ({2 * half}, {head})] (the caches' width twice)"
    return None


@native_constraint("RotaryFoldable")
def rotary_foldable(ctx, q4, k4, qpos, kpos, cos, sin, kcos, ksin, past_k, qform, kform, gqa):
    """q [B, N, S, H] and k [B, KV, S, H] rotated from offset 0 (a one-element position 0: token s
    reads cache row s) by one cos / sin pair of [rows, R / 2] (k's the same values as q's, or
    constants equal to them: the FX graph holds one constant per FuseRotaryEmbedding rewrite), R the
    whole head or (partial) the first R dims of it, the rest passed through. Padded with `past` rows
    in front, row past + s is row s, whatever the number of rows."""
    for name, q_cache, k_cache in (("cos", cos, kcos), ("sin", sin, ksin)):
        if q_cache is not k_cache and not _same_constant(ctx, q_cache, k_cache):
            return f"q and k are rotated by different {name} caches"
    for name, pos in (("q", qpos), ("k", kpos)):
        if ctx.ints(pos) != [0]:
            return f"the rotary of {name} reads its cache at positions {ctx.ints(pos)}, not from offset 0"
    dq, dk, dc, ds, dp = (ctx.dims(x) for x in (q4, k4, cos, sin, past_k))
    if any(d is None for d in (dq, dk, dc, ds, dp)) or len(dq) != 4 or len(dk) != 4 or len(dc) != 2 or len(ds) != 2:
        return "the rotated q, k or the cos / sin caches are not [batch, heads, seq, head] and [rows, rotary / 2]"
    head, half = static_int(dq[3]), static_int(dc[1])
    if head is None or half is None or not dims_equal([ds[1], dk[3], dp[3]], [half, head, head]):
        return f"the cos / sin caches {_fmt(dc)}, {_fmt(ds)} and q {_fmt(dq)}, k {_fmt(dk)} differ in the rotated width or head"
    if qform != kform:
        return f"q's rotary is {qform}, k's {kform}"
    if qform == "whole":
        return True if 2 * half == head else f"the cos / sin caches {_fmt(dc)} do not rotate the whole head of q {_fmt(dq)}"
    # onnxruntime's limit, which the kernels' contracts check too (the padded caches' width derived through the Pad):
    # kept here for torch, whose lowering is held to onnxruntime's kernel only at widths that kernel runs.
    if half % 8:
        return (f"a partial rotary of {2 * half} dims: onnxruntime's GroupQueryAttention rotates with caches of a width that is "
                f"a multiple of 8, not {half} (the rotary stays graphopt.RotaryEmbedding)")
    view = ctx.view
    for index, name in ((0, "q"), (1, "k")):  # the op's input: Reshape(Transpose(rotated))
        transpose = view.producer(view.inputs(view.producer(view.inputs(view.producer(gqa))[index]))[0])
        problem = _partial_problem(ctx, view.inputs(transpose)[0], name, head, half)
        if problem is not None:
            return problem
    return True


@native_rewrite("RotaryPads")
def rotary_pads(ctx, past_k):
    return {"zeros": np.zeros(3, dtype=np.int64)}
