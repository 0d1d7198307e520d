"""Symbolic shapes: what a value's dims are, as expressions over the graph's unknown dims.

Exported transformer graphs compute reshape targets at run time
(``Concat(Shape(x)[0:1], Shape(x)[1:2], [12, 64])``), so the static shape
inference the model carries says little (``[unk__3, unk__7, 12, 64]`` or
nothing). Rules that undo reshape/transpose chains need to know that a Reshape
merely restores the dims its input already had, or that two reshapes only merge
and split the same leading dims. This module answers that by evaluating the
shape-computing subgraph symbolically:

* ``value_dims(view, v)`` -- v's dims as a list of sympy expressions (integers,
  named dims such as ``batch``, or a fresh symbol per unknown dim), or None when
  even the rank is unknown;
* ``shape_tensor(view, v)`` -- the *contents* of a 1-D int64 shape tensor (or a
  scalar), element by element, as expressions, or None.

Both walk producers (Reshape, Transpose, MatMul, broadcasting elementwise ops,
Shape, Slice, Gather, Concat, Unsqueeze, arithmetic on shape tensors ...) and fall
back to the view's inferred shape. Equal expressions mean equal dims at run
time; different expressions mean "not known to be equal". sympy's products and
quotients are what resolving a Reshape's -1 needs; it is imported on first use
(graphopt._lazy_sympy), so a run that asks no symbolic question never loads it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from graphopt._lazy_sympy import sympy
from graphopt.ir.view import GraphView
from graphopt.ops.registry import InferContext, has_fact, spec

__all__ = ["Dim", "dim_from_text", "forget_derived_shapes", "value_dims", "shape_tensor", "dims_equal", "static_int", "broadcast_dims", "SymbolicShapes"]

# A dim: a sympy expression (sympy ships no type hints, so Any for mypy).
Dim: TypeAlias = Any

_MAX_DEPTH = 64



def static_int(d: Any) -> int | None:
    """The dim as a Python int when it is a known integer."""
    if isinstance(d, (int, np.integer)):
        return int(d)
    if getattr(d, "is_Integer", False):  # a sympy Integer (told without importing sympy)
        return int(d)
    return None


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_.]*)|(//|[-+*/()]))")


def dim_from_text(text: str) -> Dim:
    """A dim name as shape inference and exporters write it ("batch", "unk__4", "past + seq",
    "2*seq", "(s0 + 1)//2") as an expression over positive integer symbols, so that
    "past + seq" written by the exporter equals past + seq derived from the graph.
    Text that is not such an expression is one opaque symbol, as before. A small parser,
    not sympy's parse_expr: the text comes from the model, and parse_expr evaluates it."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            return _symbol(text)
        pos = m.end()
        if m.group(1):
            tokens.append(("int", m.group(1)))
        elif m.group(2):
            tokens.append(("name", m.group(2)))
        elif m.group(3):
            tokens.append(("op", m.group(3)))
    if not tokens or not any(kind == "op" for kind, _ in tokens):
        return _symbol(text.strip())
    try:
        expr, rest = _parse_sum(tokens)
    except (IndexError, ValueError, ZeroDivisionError):
        return _symbol(text)
    return expr if not rest else _symbol(text)


def _symbol(name: str) -> Dim:
    return sympy.Symbol(name, positive=True, integer=True)


def _parse_sum(tokens: list[tuple[str, str]]) -> tuple[Dim, list[tuple[str, str]]]:
    left, tokens = _parse_product(tokens)
    while tokens and tokens[0] in (("op", "+"), ("op", "-")):
        op = tokens[0][1]
        right, tokens = _parse_product(tokens[1:])
        left = left + right if op == "+" else left - right
    return left, tokens


def _parse_product(tokens: list[tuple[str, str]]) -> tuple[Dim, list[tuple[str, str]]]:
    left, tokens = _parse_atom(tokens)
    while tokens and tokens[0] in (("op", "*"), ("op", "/"), ("op", "//")):
        op = tokens[0][1]
        right, tokens = _parse_atom(tokens[1:])
        left = left * right if op == "*" else sympy.floor(left / right) if op == "//" else left / right
    return left, tokens


def _parse_atom(tokens: list[tuple[str, str]]) -> tuple[Dim, list[tuple[str, str]]]:
    kind, text = tokens[0]
    if kind == "int":
        return sympy.Integer(int(text)), tokens[1:]
    if kind == "name":
        return _symbol(text), tokens[1:]
    if text == "(":
        inner, rest = _parse_sum(tokens[1:])
        if not rest or rest[0] != ("op", ")"):
            raise ValueError("unbalanced parenthesis")
        return inner, rest[1:]
    if text == "-":
        inner, rest = _parse_atom(tokens[1:])
        return -inner, rest
    raise ValueError(f"unexpected {text}")


def dims_equal(a: Sequence[Any] | None, b: Sequence[Any] | None) -> bool:
    """Both known, same rank, every dim provably equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x == y or sympy.expand(x - y) == 0 for x, y in zip(a, b, strict=True))


class SymbolicShapes:
    """Evaluates dims and shape tensors of the values of one view (memoized on the view)."""

    def __init__(self, view: GraphView) -> None:
        self.view = view
        # A value's dims never change while it exists (rewrites replace values by
        # equivalent ones), so one cache serves every question asked of this view.
        # Keys are ids; the values themselves are kept so that an id is not reused.
        cache: tuple[dict[int, list[Dim] | None], dict[int, list[Dim] | None], list[Any]] | None
        cache = getattr(view, "_symbolic_shapes_cache", None)
        if cache is None:
            cache = ({}, {}, [])
            try:
                view._symbolic_shapes_cache = cache  # type: ignore[attr-defined]
            except AttributeError:
                pass
        self._dims: dict[int, list[Dim] | None] = cache[0]
        self._tensors: dict[int, list[Dim] | None] = cache[1]
        self._keep: list[Any] = cache[2]

    # ---------------------------------------------------------------- dims of a value
    def _warm(self, value: Any) -> None:
        """Evaluate every uncached ancestor of `value` first, producers before users, so
        that the recursive evaluation below stays shallow however deep the model is."""
        view = self.view
        order: list[Any] = []
        seen: set[int] = set()
        stack: list[tuple[Any, bool]] = [(value, False)]
        while stack:
            v, ready = stack.pop()
            if ready:
                order.append(v)
                continue
            if id(v) in seen or id(v) in self._dims:
                continue
            seen.add(id(v))
            stack.append((v, True))
            node = view.producer(v)
            if node is not None:
                stack.extend((x, False) for x in view.inputs(node) if x is not None and id(x) not in seen)
        for v in order[:-1]:
            self.dims(v, depth=1)
            if (view.dtype(v) or "").startswith(("i", "u")):
                self.tensor(v, depth=1)

    def dims(self, value: Any, depth: int = 0) -> list[Dim] | None:
        if value is None:
            return None
        key = id(value)
        if depth == 0 and key not in self._dims:
            self._warm(value)
        if key not in self._dims:
            self._keep.append(value)
            self._dims[key] = None  # cycles (there are none in a valid graph) end here
            self._dims[key] = self._merge(value, self._derive_dims(value, depth))
        return self._dims[key]

    def _static_dims(self, value: Any, depth: int) -> list[Dim] | None:
        """dims() with known integers as Python ints (what the registry's inference functions take)."""
        dims = self.dims(value, depth)
        return None if dims is None else [static_int(x) if static_int(x) is not None else x for x in dims]

    def _inferred(self, value: Any) -> list[Dim] | None:
        shape = self.view.shape(value)
        if shape is None:
            return None
        return [self._dim_from_inference(value, i, d) for i, d in enumerate(shape)]

    def _dim_from_inference(self, value: Any, i: int, d: Any) -> Dim:
        if isinstance(d, int) and d >= 0:
            return sympy.Integer(d)
        if isinstance(d, str) and d:
            return dim_from_text(d)
        return self._fresh(value, i)

    def _fresh(self, value: Any, i: int) -> Dim:
        name = getattr(value, "name", None) or f"v{id(value)}"
        return sympy.Symbol(f"{name}#{i}", positive=True, integer=True)

    def _merge(self, value: Any, derived: list[Dim] | None) -> list[Dim] | None:
        """Derived dims, with the view's static ints and names filling what derivation could not know."""
        inferred = self._inferred(value)
        if derived is None:
            return inferred
        if inferred is None or len(inferred) != len(derived):
            return derived
        merged = []
        for d, s in zip(derived, inferred, strict=True):
            if static_int(s) is not None:
                merged.append(s)
            elif _opaque(d) and not _opaque(s):
                merged.append(s)  # a named dim beats an opaque one
            else:
                merged.append(d)
        return merged

    def _derive_dims(self, value: Any, depth: int) -> list[Dim] | None:
        view = self.view
        node = view.producer(value)
        if node is None or depth > _MAX_DEPTH:
            return None
        domain, op = view.op_key(node)
        ins = list(view.inputs(node))
        d = depth + 1
        if view.output_index(value) != 0 and op not in ("Split",):
            return None
        declared = spec(domain, op) if domain == "graphopt" else None
        if declared is not None and declared.infer is not None:  # graphopt's own ops: their declared inference
            ctx = InferContext(declared, lambda i: self._static_dims(ins[i], d) if ins[i] is not None else None, lambda name: view.attr(node, name), len(ins))
            shapes = declared.infer(ctx)
            index = view.output_index(value)
            found = shapes[index] if index < len(shapes) else None
            return None if found is None else [sympy.Integer(x) if isinstance(x, int) else x for x in found]
        if has_fact(domain, op, "same_shape") or has_fact(domain, op, "elementwise"):
            return self.dims(ins[0], d) if ins else None
        if has_fact(domain, op, "broadcasting"):
            return _broadcast([self.dims(x, d) for x in ins if x is not None])
        if op == "Reshape":
            return self._reshape(node, ins, d)
        if op == "Transpose":
            src = self.dims(ins[0], d)
            if src is None:
                return None
            perm = view.attr(node, "perm")
            perm = list(range(len(src)))[::-1] if not isinstance(perm, (list, tuple)) else list(perm)
            return [src[p] for p in perm] if len(perm) == len(src) else None
        if op == "MatMul":
            a, b = self.dims(ins[0], d), self.dims(ins[1], d)
            if a is None or b is None or len(a) < 2 or len(b) < 2:
                return None
            batch = _broadcast([a[:-2], b[:-2]])
            return None if batch is None else [*batch, a[-2], b[-1]]
        if op == "Unsqueeze":
            src = self.dims(ins[0], d)
            axes = _axes(view, node, ins, 1)
            if src is None or axes is None:
                return None
            out: list[Dim | None] = [None] * (len(src) + len(axes))
            for axis in axes:
                out[axis % len(out)] = sympy.Integer(1)
            it = iter(src)
            return [x if x is not None else next(it) for x in out]
        if op == "Squeeze":
            src = self.dims(ins[0], d)
            axes = _axes(view, node, ins, 1)
            if src is None:
                return None
            if axes is None:
                return [x for x in src if static_int(x) != 1]
            drop = {a % len(src) for a in axes}
            return [x for i, x in enumerate(src) if i not in drop]
        if op == "Expand":
            target = self.tensor(ins[1], d)
            src = self.dims(ins[0], d)
            return None if target is None or src is None else _broadcast([src, target])
        if op == "Range" and len(ins) == 3:
            # Range(start, limit, 1) has limit - start elements (positions past .. past + seq: seq)
            start, limit, delta = (self.tensor(x, d) for x in ins)
            if start is None or limit is None or delta is None or not (len(start) == len(limit) == len(delta) == 1):
                return None
            return [sympy.expand(limit[0] - start[0])] if static_int(delta[0]) == 1 else None
        if op == "Tile":
            src, repeats = self.dims(ins[0], d), self.tensor(ins[1], d)
            return None if src is None or repeats is None or len(repeats) != len(src) else [s * r for s, r in zip(src, repeats)]
        if op == "Concat":
            parts = [self.dims(x, d) for x in ins]
            if any(p is None for p in parts) or not parts:
                return None
            rank = len(parts[0])  # type: ignore[arg-type]
            axis = int(view.attr(node, "axis")) % rank
            out2 = list(parts[0])  # type: ignore[arg-type]
            out2[axis] = sympy.Add(*[p[axis] for p in parts])  # type: ignore[index]
            return out2
        if op == "Split":
            src = self.dims(ins[0], d)
            if src is None:
                return None
            axis = view.attr(node, "axis")
            axis = (axis if isinstance(axis, int) else 0) % len(src)
            n = len(view.outputs(node))
            has_sizes = len(ins) > 1 and ins[1] is not None
            sizes = view.const_array(ins[1]) if has_sizes else None
            out3 = list(src)
            if sizes is not None:
                out3[axis] = sympy.Integer(int(sizes.reshape(-1)[view.output_index(value)]))
            elif has_sizes:
                # sizes computed at run time (ONNX's expanded RotaryEmbedding): their symbolic values, or nothing
                # known; never the equal split, which only holds without a `split` input
                split_sizes = self.tensor(ins[1], d)
                if split_sizes is None or len(split_sizes) != n:
                    return None
                out3[axis] = split_sizes[view.output_index(value)]
            elif static_int(src[axis]) is not None and static_int(src[axis]) % n == 0:  # type: ignore[operator]
                out3[axis] = sympy.Integer(static_int(src[axis]) // n)  # type: ignore[operator]
            else:
                return None
            return out3
        if op == "Slice":
            return self._slice(node, ins, d)
        if op == "Pad" and len(ins) in (2, 3):  # opset 11+ pads as an input, no axes: begins then ends
            src, pads = self.dims(ins[0], d), self.tensor(ins[1], d)
            if src is None or pads is None or len(pads) != 2 * len(src):
                return None
            return [x + pads[i] + pads[i + len(src)] for i, x in enumerate(src)]
        if op == "Shape":
            t = self.tensor(value, d)
            return None if t is None else [sympy.Integer(len(t))]
        if op == "Gather":
            data, idx = self.dims(ins[0], d), self.dims(ins[1], d)
            if data is None or idx is None:
                return None
            axis = view.attr(node, "axis")
            axis = (axis if isinstance(axis, int) else 0) % len(data)
            return [*data[:axis], *idx, *data[axis + 1:]]
        return None

    def _slice(self, node: Any, ins: list[Any], depth: int) -> list[Dim] | None:
        """Dims of a Slice (opset 10+: starts, ends, axes, steps as inputs) with step 1, where the
        bounds may be computed at run time (``x[..., 4:Shape(x)[-1]]``, as exporters write it)."""
        src = self.dims(ins[0], depth)
        if src is None or len(ins) < 3:
            return None
        starts, ends = self.tensor(ins[1], depth), self.tensor(ins[2], depth)
        axes = self.tensor(ins[3], depth) if len(ins) > 3 and ins[3] is not None else [sympy.Integer(i) for i in range(len(starts or []))]
        steps = self.tensor(ins[4], depth) if len(ins) > 4 and ins[4] is not None else None
        if starts is None or ends is None or axes is None or not len(starts) == len(ends) == len(axes):
            return None
        if steps is not None and any(static_int(x) != 1 for x in steps):
            return None
        out = list(src)
        for start, end, axis in zip(starts, ends, axes, strict=True):
            a = static_int(axis)
            if a is None or not -len(src) <= a < len(src):
                return None
            size = _sliced_size(src[a % len(src)], start, end)
            if size is None:
                return None
            out[a % len(src)] = size
        return out

    def _reshape(self, node: Any, ins: list[Any], depth: int) -> list[Dim] | None:
        src = self.dims(ins[0], depth)
        target = self.tensor(ins[1], depth)
        if target is None:
            return None
        allowzero = self.view.attr(node, "allowzero")
        allowzero = 0 if not isinstance(allowzero, int) else allowzero
        out: list[Dim | None] = []
        for i, t in enumerate(target):
            if static_int(t) == 0 and not allowzero:
                if src is None or i >= len(src):
                    return None
                out.append(src[i])
            elif static_int(t) == -1:
                out.append(None)
            else:
                out.append(t)
        if any(x is None for x in out):
            if src is None or sum(x is None for x in out) != 1:
                return None
            known = sympy.Mul(*[x for x in out if x is not None])
            total = sympy.Mul(*src)
            # cancel: batch*4*(past+seq)*16 / (16*past + 16*seq) is 4*batch, which dims_equal must see.
            out[out.index(None)] = sympy.cancel(total / known)
        return out  # type: ignore[return-value]

    # ---------------------------------------------------------------- contents of a shape tensor
    def tensor(self, value: Any, depth: int = 0) -> list[Dim] | None:
        if value is None:
            return None
        key = id(value)
        if depth == 0 and key not in self._tensors and key not in self._dims:
            self._warm(value)
        if key not in self._tensors:
            self._keep.append(value)
            self._tensors[key] = None
            self._tensors[key] = self._derive_tensor(value, depth)
        return self._tensors[key]

    def _derive_tensor(self, value: Any, depth: int) -> list[Dim] | None:
        view = self.view
        const = view.const_array(value)
        if const is not None:
            if const.dtype.kind not in "iu" or const.ndim > 1 or const.size > 64:
                return None
            return [sympy.Integer(int(x)) for x in const.reshape(-1)]
        node = view.producer(value)
        if node is None or depth > _MAX_DEPTH:
            return None
        _, op = view.op_key(node)
        ins = list(view.inputs(node))
        d = depth + 1
        if op == "Shape":
            src = self.dims(ins[0], d)
            if src is None:
                return None
            start, end = view.attr(node, "start"), view.attr(node, "end")
            start = start if isinstance(start, int) else 0
            end = end if isinstance(end, int) else len(src)
            return list(src[slice(start, end)])
        if op in ("Cast", "Identity", "Squeeze", "Unsqueeze"):
            return self.tensor(ins[0], d)
        if op == "Reshape":
            target = self.tensor(ins[1], d)
            inner = self.tensor(ins[0], d)
            if inner is None or target is None or len(target) > 1:
                return None
            return inner
        if op == "Concat":
            parts = [self.tensor(x, d) for x in ins]
            if any(p is None for p in parts):
                return None
            return [x for p in parts for x in p]  # type: ignore[union-attr]
        if op == "Gather":
            data = self.tensor(ins[0], d)
            idx = view.const_array(ins[1])
            if data is None or idx is None or idx.ndim > 1:
                return None
            try:
                return [data[int(i)] for i in idx.reshape(-1)]
            except IndexError:
                return None
        if op == "Slice":
            data = self.tensor(ins[0], d)
            args = [view.const_array(x) if x is not None else None for x in ins[1:5]]
            args += [None] * (4 - len(args))
            if data is None or args[0] is None or args[1] is None:
                return None
            if args[2] is not None and [int(a) for a in args[2].reshape(-1)] not in ([0], [-1]):
                return None
            step = int(args[3].reshape(-1)[0]) if args[3] is not None else 1
            start, end = int(args[0].reshape(-1)[0]), int(args[1].reshape(-1)[0])
            end = max(min(end, len(data)), -len(data) - 1)
            return list(data[slice(start, end, step)])
        if op == "ConstantOfShape":
            n = self.tensor(ins[0], d)
            fill = view.attr(node, "value")
            fill_arr = np.asarray(getattr(fill, "numpy", lambda: fill)()) if fill is not None else np.zeros(1)
            if n is None or len(n) != 1 or static_int(n[0]) is None or fill_arr.size != 1:
                return None
            if fill_arr.dtype.kind not in "iub":
                return None
            return [sympy.Integer(int(fill_arr.reshape(-1)[0]))] * static_int(n[0])  # type: ignore[operator]
        if op == "Equal":
            a, b = self.tensor(ins[0], d), self.tensor(ins[1], d)
            if a is None or b is None or len(a) != len(b):
                return None
            eqs = [sympy.Eq(x, y) for x, y in zip(a, b, strict=True)]
            if any(e not in (sympy.true, sympy.false) for e in eqs):
                return None
            return [sympy.Integer(1 if e == sympy.true else 0) for e in eqs]
        if op == "Where":
            parts = [self.tensor(x, d) for x in ins]
            if len(parts) != 3 or any(t is None for t in parts):
                return None
            size = max(len(t) for t in parts)  # type: ignore[arg-type]
            cond, yes, no = ([*t] * size if len(t) == 1 else t for t in parts)  # type: ignore[arg-type,misc,operator]
            if not len(cond) == len(yes) == len(no) == size:  # type: ignore[arg-type]
                return None
            return [x if static_int(k) == 1 else y for k, x, y in zip(cond, yes, no, strict=True)]  # type: ignore[arg-type]
        if op in ("ReduceProd", "ReduceSum"):
            # tf2onnx flattens leading dims as ReduceProd(Gather(Shape(x), axes)).
            data = self.tensor(ins[0], d)
            axes = _axes(view, node, ins, 1)
            if data is None or axes not in (None, [0], [-1]) or (axes is None and view.attr(node, "noop_with_empty_axes") == 1):
                return None
            return [sympy.Mul(*data) if op == "ReduceProd" else sympy.Add(*data)]
        if op in ("Max", "Min"):
            parts = [self.tensor(x, d) for x in ins]
            if not parts or any(p is None for p in parts):
                return None
            size = max(len(p) for p in parts)  # type: ignore[arg-type]
            if any(len(p) not in (1, size) for p in parts):  # type: ignore[arg-type]
                return None
            pick = sympy.Max if op == "Max" else sympy.Min
            return [pick(*[p[i] if len(p) > 1 else p[0] for p in parts]) for i in range(size)]  # type: ignore[index,arg-type]
        if op in ("Add", "Sub", "Mul", "Div"):
            a, b = self.tensor(ins[0], d), self.tensor(ins[1], d)
            if a is None or b is None:
                return None
            if len(a) == 1 and len(b) != 1:
                a = a * len(b)
            if len(b) == 1 and len(a) != 1:
                b = b * len(a)
            if len(a) != len(b):
                return None
            out = []
            for x, y in zip(a, b, strict=True):
                if op == "Add":
                    out.append(x + y)
                elif op == "Sub":
                    out.append(x - y)
                elif op == "Mul":
                    out.append(x * y)
                else:
                    q = _int_div(x, y)
                    if q is None:
                        return None
                    out.append(q)
            return out
        return None


def _int_div(x: Dim, y: Dim) -> Dim | None:
    """Division of shape-tensor elements, which are integers: ONNX's Div truncates toward
    zero (torch's chunk writes ceil(n / k) as (n + k - 1) / k). Symbolic only where the
    result is provably the floor (a nonnegative dividend, a positive static divisor)."""
    a, b = static_int(x), static_int(y)
    if b == 0:
        return None
    if a is not None and b is not None:
        q = abs(a) // abs(b)
        return sympy.Integer(q if (a >= 0) == (b > 0) else -q)
    q = x / y
    if q.is_integer:
        return q
    if b is not None and b > 0 and x.is_nonnegative:
        return sympy.floor(q)
    return None


def _sliced_size(dim: Dim, start: Dim, end: Dim) -> Dim | None:
    """Length of dim[start:end] (step 1) when it is known: all static, or a static start
    and an end that is at least the dim (INT_MAX, or the dim itself read through Shape)."""
    n, s, e = static_int(dim), static_int(start), static_int(end)
    if n is not None and s is not None and e is not None:
        return sympy.Integer(len(range(n)[slice(s, e)]))
    if s is None:
        return None
    if e is not None and e >= 2**31 - 1 or e is None and sympy.simplify(end - dim) == 0:
        if s >= 0:
            return dim - s if s else dim  # (a dim below the start gives 0 at run time: a degenerate model)
        return sympy.Min(-s, dim) if n is None else sympy.Integer(min(-s, n))
    return None


def _opaque(d: Dim) -> bool:
    """A dim known only by a made-up name: ours (``value#i``) or onnx shape inference's (``unk__N``)."""
    return bool(d.free_symbols) and all("#" in str(x) or str(x).startswith("unk__") for x in d.free_symbols)


def _axes(view: GraphView, node: Any, ins: list[Any], index: int) -> list[int] | None:
    if len(ins) > index and ins[index] is not None:
        arr = view.const_array(ins[index])
        return None if arr is None else [int(a) for a in arr.reshape(-1)]
    axes = view.attr(node, "axes")
    return [int(a) for a in axes] if isinstance(axes, (list, tuple)) else None


def _broadcast(shapes: Sequence[list[Dim] | None]) -> list[Dim] | None:
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)  # type: ignore[arg-type]
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]  # type: ignore[arg-type,index]
        non_one = [x for x in dims if static_int(x) != 1]
        if not non_one:
            out.append(sympy.Integer(1))
            continue
        ints = [x for x in non_one if static_int(x) is not None]
        named = [x for x in non_one if not _opaque(x)]
        out.append(ints[0] if ints else named[0] if named else non_one[0])
    return out


def forget_derived_shapes(view: GraphView) -> None:
    """Drop what was derived on `view`: after shape inference ran again, the recorded shapes
    it fell back to may say more than the dims cached from them."""
    view.__dict__.pop("_symbolic_shapes_cache", None)


def value_dims(view: GraphView, value: Any) -> list[Dim] | None:
    return SymbolicShapes(view).dims(value)


def shape_tensor(view: GraphView, value: Any) -> list[Dim] | None:
    return SymbolicShapes(view).tensor(value)


def broadcast_dims(shapes: Sequence[list[Dim] | None]) -> list[Dim] | None:
    """Numpy-style broadcast of symbolic dims (None when any is unknown)."""
    return _broadcast(shapes)
