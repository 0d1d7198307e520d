"""Size-bounded constant folding.

A node folds when every input is a constant (an initializer that is not a graph
input, a Constant node, or a result folded earlier in the same pass). Where shape
arithmetic starts from a value's dims (Shape, Size, Gather/Slice of a partly
static shape), the rules in rules/shape_folding.pdll turn the known dims into
constants — declaratively, with near-misses saying which dim was symbolic — and
this pass folds the arithmetic on top of them in the next sweep.

Why our own pass: onnx-ir ships none (onnxscript's folder sits on a different
optimizer stack), and we need the growth rule, graph-output names, subgraphs and
functions handled exactly as below.

* Results become initializers in the main graph (`OnnxView.new_constant`) and
  Constant nodes in subgraphs and function bodies. A folded graph output keeps its
  name (a Constant node with that name takes its place).
* Size rule: a fold may grow the model by at most `size_limit_bytes`, where growth
  = bytes of the new constants - bytes of constant inputs that die with the node.
  Transpose/Cast of a weight used once costs nothing; ConstantOfShape/Expand/Tile of
  a big shape stay. Outputs are estimated *before* evaluating so a huge result is
  never even computed.
* Never folded: non-deterministic ops, ops with subgraphs, ops with attribute
  references (function bodies), non-ONNX domains, Quantize/DequantizeLinear (folding
  them would turn int8 weights into float ones and break QDQ fusion), dead nodes
  (DCE's job), and max/min-like reductions over a NaN (the registry's fact
  `nan_order_sensitive`: what they give there differs between numpy and onnxruntime).
* Evaluation: numpy fast paths for the small ops that shape arithmetic uses (checked
  against onnxruntime in tests); everything else through onnx.reference's op
  classes. A result whose dtype or static shape disagrees with what the graph
  declares is not used.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from graphopt.ir.onnx_view import OnnxView
from graphopt.ops.registry import has_fact
from graphopt.passes._common import ONNX_DOMAINS, has_subgraphs, is_non_deterministic, record, subgraphs

__all__ = ["fold_constants", "DEFAULT_SIZE_LIMIT_BYTES"]

logger = logging.getLogger(__name__)

#: Default bound on how much one fold may grow the model.
DEFAULT_SIZE_LIMIT_BYTES = 1 << 20

# Ops whose output size cannot be bounded from their inputs' sizes (the registry's fact
# `unbounded_output`) are folded only when the graph declares a static output shape we
# can check the size against.

# dtypes numpy handles natively; others (bfloat16, float8, int4, string) go to onnx.reference.
_NATIVE_DTYPES = frozenset(
    {
        ir.DataType.BOOL, ir.DataType.INT8, ir.DataType.INT16, ir.DataType.INT32, ir.DataType.INT64,
        ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64,
        ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE,
    }
)  # fmt: skip


class _NoFold(Exception):
    """The node must stay as it is (e.g. integer division by zero)."""


def fold_constants(
    view: OnnxView,
    *,
    size_limit_bytes: int = DEFAULT_SIZE_LIMIT_BYTES,
    stats: Any = None,
) -> int:
    """Fold constant subexpressions in every scope of `view.model`; returns the nodes folded.

    `stats` is an optional `graphopt.report.model.PassStats` to record the run in.
    """
    started = time.perf_counter()
    folder = _Folder(view, size_limit_bytes)
    model = view.model
    main_opset = model.opset_imports.get("", onnx.defs.onnx_opset_version())
    folder.fold_scope(model.graph, main_opset)
    for function in model.functions.values():
        folder.fold_scope(function, function.opset_imports.get("", main_opset))
    record(stats, folder.count, started)
    return folder.count


# --------------------------------------------------------------------- the pass


class _Folder:
    def __init__(self, view: OnnxView, limit: int) -> None:
        self.view = view
        self.main = view.model.graph
        self.limit = limit
        self.count = 0
        # Constant contents by value (None: not a constant). Safe to cache for the pass:
        # a value never turns constant later, folding replaces it with a new value.
        self.consts: dict[ir.Value, np.ndarray | None] = {}

    def fold_scope(self, scope: ir.Graph | ir.Function, opset: int) -> None:
        # Topological order: a folded result is seen as constant by its users, and an
        # If/Loop body is visited after every outer value it can reference.
        for node in list(scope):
            if node.graph is None:
                continue
            if has_subgraphs(node):
                for graph in subgraphs(node):
                    self.fold_scope(graph, opset)
                continue
            try:
                self.try_fold(node, opset)
            except _NoFold:
                pass

    # ------------------------------------------------------------- one node
    def try_fold(self, node: ir.Node, opset: int) -> None:
        op = node.op_type
        if node.domain not in ONNX_DOMAINS or has_fact(node.domain, op, "never_folded") or is_non_deterministic(node):
            return
        if not any(out.uses() or out.is_graph_output() for out in node.outputs):
            return
        if any(attr.is_ref() for attr in node.attributes.values()):
            return
        version = node.version or opset

        # Every input constant? Check cheaply before loading any tensor.
        for value in node.inputs:
            if value is not None and not self.is_const(value):
                return
        xs: list[np.ndarray | None] = []
        for value in node.inputs:
            if value is None:
                xs.append(None)
                continue
            array = self.const(value)
            if array is None:
                return
            xs.append(array)
        if not xs:
            return  # zero-input ops besides Constant are the random ones

        if op == "Identity":
            self._alias(node)
            return
        dead = _dead_input_bytes(node, xs)
        estimate = _estimate_out_bytes(node, xs)
        if estimate is None or estimate - dead > self.limit:
            return

        with np.errstate(all="ignore"):
            results, fast = _evaluate(node, xs, version)
        if results is None or len(results) != len(node.outputs):
            return
        if not self._results_match(node, results, xs, version, fast):
            return
        self._replace(node, results, dead)

    # ------------------------------------------------------------- inputs
    def is_const(self, value: ir.Value) -> bool:
        if value in self.consts:
            return self.consts[value] is not None
        return self.view.is_const(value)

    def const(self, value: ir.Value) -> np.ndarray | None:
        try:
            return self.consts[value]
        except KeyError:
            pass
        array = self.view.const_array(value)
        if array is not None and array.dtype.kind in "OSUV":
            array = None  # strings and opaque data are not folded
        self.consts[value] = array
        return array

    # ------------------------------------------------------------- checks
    def _results_match(
        self, node: ir.Node, results: Sequence[np.ndarray], xs: Sequence[np.ndarray | None], version: int, fast: bool
    ) -> bool:
        expected: Sequence[ir.DataType | None] = [out.dtype for out in node.outputs]
        if not fast and any(e is None for e in expected):
            # onnx.reference sometimes returns a wider dtype than the spec: ask the schema.
            inferred = _infer_output_dtypes(node, xs, version)
            if inferred is None:
                return False
            expected = [e if e is not None else i for e, i in zip(expected, inferred, strict=False)]
        for out, result, dtype in zip(node.outputs, results, expected, strict=False):
            if not isinstance(result, np.ndarray) or result.dtype.kind in "OSUV":
                return False
            try:
                got = ir.DataType.from_numpy(result.dtype)
            except TypeError:
                return False
            if dtype is not None and got != dtype:
                logger.debug("not folding %s: result dtype %s, graph says %s", node.name, got, dtype)
                return False
            shape = out.shape
            if shape is not None and (
                len(shape) != result.ndim or any(isinstance(d, int) and d != n for d, n in zip(shape, result.shape, strict=False))
            ):
                logger.debug("not folding %s: result shape %s, graph says %s", node.name, result.shape, shape)
                return False
        return True

    # ------------------------------------------------------------- rewriting
    def _replace(self, node: ir.Node, results: Sequence[np.ndarray], dead_bytes: int) -> None:
        needed = [(out, r) for out, r in zip(node.outputs, results, strict=False) if out.uses() or out.is_graph_output()]
        if sum(r.nbytes for _, r in needed) - dead_bytes > self.limit:
            return
        graph = node.graph
        assert graph is not None
        in_main = graph is self.main
        new_nodes: list[ir.Node] = []
        for out, result in needed:
            result = _contiguous(result)
            if out.is_graph_output():
                # Keep the output's name: a Constant node named like it takes its place.
                name = out.name or self.view.fresh_name(node.op_type)
                out.name = self.view.fresh_name(name)
                const_node = self._constant_node(result, name)
                new_nodes.append(const_node)
                new = const_node.outputs[0]
            elif in_main:
                new = self.view.new_constant(graph, result, out.name or node.op_type)
            else:
                const_node = self._constant_node(result, self.view.fresh_name(out.name or node.op_type))
                new_nodes.append(const_node)
                new = const_node.outputs[0]
            self.consts[new] = result
            out.replace_all_uses_with(new, replace_graph_outputs=True)
        if new_nodes:
            graph.insert_before(node, new_nodes)
        self._remove(node)
        self.count += 1

    def _alias(self, node: ir.Node) -> None:
        """Identity of a constant: its users read the constant itself (no copy)."""
        out = node.outputs[0]
        if out.is_graph_output():
            return  # already as cheap as a Constant node would be
        source = node.inputs[0]
        assert source is not None
        out.replace_all_uses_with(source)
        self._remove(node)
        self.count += 1

    def _constant_node(self, array: np.ndarray, name: str) -> ir.Node:
        tensor = ir.tensor(array, name=name)
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], name=self.view.fresh_name("Constant"))
        out = node.outputs[0]
        out.name = name
        out.type = ir.TensorType(tensor.dtype)
        out.shape = ir.Shape(array.shape)
        return node

    def _remove(self, node: ir.Node) -> None:
        """Remove a folded node, and constant inputs only it used (keeps memory flat)."""
        inputs = {v for v in node.inputs if v is not None}
        graph = node.graph
        assert graph is not None
        graph.remove(node, safe=True)
        for value in inputs:
            if value.uses() or value.is_graph_output() or value.is_graph_input():
                continue
            producer = value.producer()
            if value.is_initializer() and value.graph is not None and value.name:
                value.graph.initializers.pop(value.name)
            elif producer is not None and producer.op_type == "Constant" and producer.graph is not None:
                producer.graph.remove(producer, safe=True)
            else:
                continue
            self.consts.pop(value, None)


# --------------------------------------------------------------------- sizes


def _dead_input_bytes(node: ir.Node, xs: Sequence[np.ndarray | None]) -> int:
    """Bytes of constant inputs that only this node uses: they go when it folds."""
    total = 0
    seen: set[ir.Value] = set()
    for value, array in zip(node.inputs, xs, strict=False):
        if value is None or array is None or value in seen or array.dtype == object:
            continue
        seen.add(value)
        if value.is_graph_output() or value.is_graph_input():
            continue
        if all(use.node is node for use in value.uses()):
            total += array.nbytes
    return total


def _estimate_out_bytes(node: ir.Node, xs: Sequence[np.ndarray | None]) -> int | None:
    """An upper estimate of the outputs' size before computing them; None when unbounded.

    Computed from the input data where the op allows (a model's value_info may lie: a
    [1, 1] declared over a 100000 x 100000 ConstantOfShape would have been allocated);
    the declared output shapes only where the data cannot bound the op."""
    declared: int | None = 0
    for out in node.outputs:
        shape, dtype = out.shape, out.dtype
        known = [d for d in shape if isinstance(d, int)] if shape is not None else None
        if shape is None or known is None or dtype is None or len(known) != len(shape):
            declared = None
            break
        declared = (declared or 0) + math.prod(known) * max(int(dtype.itemsize), 1)
    computed = _computed_out_bytes(node, xs)
    if computed is not None:
        return max(computed, declared or 0)
    return None if not has_fact(node.domain, node.op_type, "unbounded_output") or declared is None else int(declared)


def _computed_out_bytes(node: ir.Node, xs: Sequence[np.ndarray | None]) -> int | None:
    """The outputs' size from the input data, or None when the data cannot bound them."""
    op = node.op_type
    if has_fact(node.domain, op, "unbounded_output"):
        return None
    arrays = [x for x in xs if x is not None]
    itemsize = max((x.itemsize for x in arrays if x.dtype != object), default=8)
    try:
        if op == "ConstantOfShape":
            value = node.attributes.get("value")
            itemsize = value.value.dtype.itemsize if value is not None else 4
            count = math.prod(int(d) for d in arrays[0])
        elif op == "Expand":
            count = math.prod(np.broadcast_shapes(arrays[0].shape, tuple(int(d) for d in arrays[1])))
        elif op == "CastLike":  # the second input only lends its type
            count, itemsize = arrays[0].size, arrays[1].itemsize
        elif op == "Tile":
            count = arrays[0].size * math.prod(int(r) for r in arrays[1])
        elif op == "Range":
            start, limit, delta = (float(x) for x in arrays[:3])
            count = max(math.ceil((limit - start) / delta), 0)
        elif op == "OneHot":
            count = arrays[0].size * int(arrays[1].reshape(-1)[0])
            itemsize = arrays[2].itemsize
        elif op == "Gather":
            data, indices = arrays[0], arrays[1]
            axis = _norm(_attr(node, "axis", 0), data.ndim)
            count = data.size // max(data.shape[axis], 1) * indices.size
        elif op in ("MatMul", "Gemm"):
            a, b = arrays[0], arrays[1]
            count = a.size // max(a.shape[-1], 1) * b.shape[-1] * max(b.size // max(b.shape[-2] * b.shape[-1], 1), 1)
        else:
            # Elementwise and broadcasting ops; ops that never grow are bounded by it too.
            try:
                count = math.prod(np.broadcast_shapes(*(x.shape for x in arrays)))
            except ValueError:
                count = 0
            count = max(count, max((x.size for x in arrays), default=0))
    except (ValueError, IndexError, ZeroDivisionError, OverflowError, TypeError):
        return None
    return int(count) * itemsize


# --------------------------------------------------------------------- evaluation

_FastOp = Callable[[ir.Node, list[Any], int], "list[np.ndarray] | None"]


# Ops whose result over a NaN depends on the implementation (the registry's fact
# `nan_order_sensitive`) are left for the runtime when a NaN is among their inputs.


def _holds_nan(xs: list[Any]) -> bool:
    return any(isinstance(x, np.ndarray) and x.dtype.kind in "fc" and bool(np.isnan(x).any()) for x in xs)


def _evaluate(node: ir.Node, xs: list[Any], version: int) -> tuple[Any, bool]:
    """(results, computed_by_fast_path); results None when the node cannot be evaluated."""
    if has_fact(node.domain, node.op_type, "nan_order_sensitive") and _holds_nan(xs):
        return None, False
    fast = _FAST_OPS.get(node.op_type)
    if fast is not None:
        try:
            results = fast(node, xs, version)
        except _NoFold:
            return None, True
        except (ValueError, IndexError, TypeError, OverflowError) as e:
            logger.debug("fast path for %s failed: %s", node.op_type, e)
            return None, True
        if results is not None:
            return results, True
    if any(x is not None and x.dtype == object for x in xs):
        return None, False
    return _reference_eval(node, xs, version), False


@lru_cache(maxsize=512)
def _reference_op(op_type: str, version: int) -> Any:
    from onnx.reference.ops import load_op

    return load_op("", op_type, version)


def _nolog(*args: Any) -> None:
    pass


def _reference_eval(node: ir.Node, xs: list[np.ndarray | None], version: int) -> list[np.ndarray] | None:
    proto = ir.serde.serialize_node(node)
    try:
        op_class = _reference_op(node.op_type, version)
        impl = op_class(proto, {"log": _nolog, "opsets": {"": version}, "verbose": 0, "new_ops": None})
        results = impl.run(*xs)
    except Exception as e:  # noqa: BLE001 - any failure just means "not folded"
        logger.debug("onnx.reference could not evaluate %s: %s", node.op_type, e)
        return None
    return [np.asarray(r) if isinstance(r, np.ndarray) or np.isscalar(r) else r for r in results]


def _infer_output_dtypes(node: ir.Node, xs: Sequence[np.ndarray | None], version: int) -> list[ir.DataType] | None:
    try:
        proto = ir.serde.serialize_node(node)
        schema = onnx.defs.get_schema(node.op_type, version, "")
        types = {
            name: onnx.helper.make_tensor_type_proto(int(ir.DataType.from_numpy(x.dtype)), x.shape)
            for name, x in zip(proto.input, xs, strict=False)
            if name and x is not None
        }
        inferred = onnx.shape_inference.infer_node_outputs(schema, proto, types, opset_imports=[onnx.helper.make_opsetid("", version)])
        return [ir.DataType(inferred[name].tensor_type.elem_type) for name in proto.output]
    except Exception as e:  # noqa: BLE001
        logger.debug("no output types for %s: %s", node.op_type, e)
        return None


# --------------------------------------------------------------------- numpy fast paths
# Each returns the outputs, or None to hand the node to onnx.reference; _NoFold (or a
# numpy error) leaves the node as it is.


def _attr(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _norm(axis: int, rank: int) -> int:
    return int(axis) + rank if axis < 0 else int(axis)


def _clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def _contiguous(a: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    return a if a.flags.c_contiguous else a.copy(order="C")


def _native(*arrays: np.ndarray) -> bool:
    return all(a.dtype.kind in "biuf" and a.dtype.itemsize <= 8 and a.dtype.name != "bfloat16" for a in arrays)


def _binary(fn: Callable[[Any, Any], Any], kinds: str) -> _FastOp:
    def run(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
        a, b = xs
        if a.dtype != b.dtype or a.dtype.kind not in kinds or not _native(a):
            return None
        return [np.asarray(fn(a, b))]

    return run


def _unary(fn: Callable[[Any], Any], kinds: str) -> _FastOp:
    def run(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
        (a,) = xs
        if a.dtype.kind not in kinds or not _native(a):
            return None
        return [np.asarray(fn(a))]

    return run


def _div(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    a, b = xs
    if a.dtype != b.dtype or not _native(a):
        return None
    if a.dtype.kind == "f":
        return [np.asarray(np.divide(a, b))]
    if a.dtype.kind not in "iu":
        return None
    if np.any(b == 0):
        raise _NoFold  # undefined at runtime: leave it to the runtime
    # ONNX (and onnxruntime) integer division truncates toward zero; numpy's // floors.
    q = np.floor_divide(a, b)
    q = q + ((np.remainder(a, b) != 0) & ((a < 0) != (b < 0))).astype(a.dtype)
    return [np.asarray(q, dtype=a.dtype)]


def _where(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    c, x, y = xs
    if c.dtype != np.bool_ or x.dtype != y.dtype or not _native(x):
        return None
    return [np.asarray(np.where(c, x, y))]


def _cast(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    (x,) = xs
    to = ir.DataType(_attr(node, "to", 0))
    if to not in _NATIVE_DTYPES or not _native(x):
        return None
    target = to.numpy()
    if x.dtype.kind == "f" and target.kind in "iu" and x.size:
        info = np.iinfo(target)
        if not np.all(np.isfinite(x)) or x.min() < info.min or x.max() > info.max:
            raise _NoFold  # out-of-range float -> int is undefined behaviour
    return [np.asarray(x.astype(target))]


def _cast_like(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    x, like = xs
    if not (_native(x) and _native(like)):
        return None
    if x.dtype.kind == "f" and like.dtype.kind in "iu" and x.size:
        info = np.iinfo(like.dtype)
        if not np.all(np.isfinite(x)) or x.min() < info.min or x.max() > info.max:
            raise _NoFold  # out-of-range float -> int is undefined behaviour
    return [np.asarray(x.astype(like.dtype))]


def _gather(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data, indices = xs
    if indices.dtype.kind not in "iu":
        return None
    axis = _norm(_attr(node, "axis", 0), data.ndim)
    return [np.asarray(np.take(data, indices, axis=axis))]


def _concat(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    arrays = [x for x in xs if x is not None]
    if len({a.dtype for a in arrays}) != 1:
        return None
    axis = _norm(_attr(node, "axis", 0), arrays[0].ndim)
    return [np.concatenate(arrays, axis=axis)]


def _axes_from(node: ir.Node, xs: list[Any]) -> list[int] | None:
    if len(xs) > 1 and xs[1] is not None:
        return [int(a) for a in xs[1].reshape(-1)]
    axes = _attr(node, "axes", None)
    return None if axes is None else [int(a) for a in axes]


def _unsqueeze(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    axes = _axes_from(node, xs)
    if axes is None:
        return None
    rank = data.ndim + len(axes)
    out = data
    for axis in sorted(_norm(a, rank) for a in axes):
        out = np.expand_dims(out, axis)
    return [out]


def _squeeze(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    axes = _axes_from(node, xs)
    if axes is None:
        return [np.squeeze(data)]
    return [np.squeeze(data, axis=tuple(_norm(a, data.ndim) for a in axes))]


def _slice(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    if len(xs) >= 3:
        starts, ends = xs[1].reshape(-1), xs[2].reshape(-1)
        axes = xs[3].reshape(-1) if len(xs) > 3 and xs[3] is not None else range(len(starts))
        steps = xs[4].reshape(-1) if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    else:  # opset < 10: attributes
        starts, ends = _attr(node, "starts", None), _attr(node, "ends", None)
        if starts is None or ends is None:
            return None
        axes = _attr(node, "axes", range(len(starts)))
        steps = [1] * len(starts)
    index: list[slice] = [slice(None)] * data.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=False):
        axis, start, end, step = _norm(int(axis), data.ndim), int(start), int(end), int(step)
        dim = data.shape[axis]
        if step == 0:
            raise _NoFold
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if dim == 0:
            index[axis] = slice(0, 0)
        elif step > 0:
            index[axis] = slice(_clamp(start, 0, dim), _clamp(end, 0, dim), step)
        else:
            end = _clamp(end, -1, dim - 1)
            index[axis] = slice(_clamp(start, 0, dim - 1), end if end >= 0 else None, step)
    return [_contiguous(data[tuple(index)])]


def _reshape(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    if len(xs) < 2 or xs[1] is None:
        return None  # opset 1 Reshape (shape attribute)
    data, shape = xs[0], [int(d) for d in xs[1].reshape(-1)]
    if not _attr(node, "allowzero", 0):
        shape = [data.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [data.reshape(shape)]


def _transpose(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data = xs[0]
    perm = _attr(node, "perm", None)
    perm = list(range(data.ndim))[::-1] if perm is None else [int(p) for p in perm]
    return [_contiguous(np.transpose(data, perm))]


def _range(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    start, limit, delta = xs
    if start.dtype.kind not in "iu" or not (start.dtype == limit.dtype == delta.dtype):
        return None  # float ranges: onnx.reference
    if int(delta) == 0:
        raise _NoFold
    return [np.arange(int(start), int(limit), int(delta), dtype=start.dtype)]


def _constant_of_shape(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    shape = [int(d) for d in xs[0].reshape(-1)]
    value = node.attributes.get("value")
    fill = value.value.numpy().reshape(-1) if value is not None else np.zeros(1, np.float32)
    if not _native(fill):
        return None
    return [np.full(shape, fill[0], dtype=fill.dtype)]


def _expand(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data, shape = xs
    target = np.broadcast_shapes(data.shape, tuple(int(d) for d in shape.reshape(-1)))
    return [np.array(np.broadcast_to(data, target))]


def _tile(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    data, repeats = xs
    return [np.tile(data, [int(r) for r in repeats.reshape(-1)])]


def _shape(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    dims = xs[0].shape
    rank = len(dims)
    start = _clamp(_norm(int(_attr(node, "start", 0)), rank), 0, rank)
    end = _clamp(_norm(int(_attr(node, "end", rank)), rank), 0, rank)
    return [np.array(dims[start:end], dtype=np.int64)]


def _size(node: ir.Node, xs: list[Any], version: int) -> list[np.ndarray] | None:
    return [np.array(xs[0].size, dtype=np.int64)]


_FAST_OPS: dict[str, _FastOp] = {
    "Shape": _shape,  # of a constant; Shape of a computed value is the shape rules' job
    "Size": _size,
    "Add": _binary(np.add, "iuf"),
    "Sub": _binary(np.subtract, "iuf"),
    "Mul": _binary(np.multiply, "iuf"),
    "Div": _div,
    "Equal": _binary(np.equal, "biuf"),
    "Less": _binary(np.less, "iuf"),
    "Greater": _binary(np.greater, "iuf"),
    "LessOrEqual": _binary(np.less_equal, "iuf"),
    "GreaterOrEqual": _binary(np.greater_equal, "iuf"),
    "And": _binary(np.logical_and, "b"),
    "Or": _binary(np.logical_or, "b"),
    "Xor": _binary(np.logical_xor, "b"),
    "Not": _unary(np.logical_not, "b"),
    "Neg": _unary(np.negative, "if"),
    "Sqrt": _unary(np.sqrt, "f"),
    "Reciprocal": _unary(np.reciprocal, "f"),
    "Where": _where,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Gather": _gather,
    "Concat": _concat,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Slice": _slice,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "Range": _range,
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
}
