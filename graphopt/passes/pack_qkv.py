"""Packed QKV for onnxruntime's GroupQueryAttention: q, k and v projected from one input by three
MatMuls with constant weights become one MatMul with the weights concatenated, its output the op's
packed query (key and value left out; the kernel splits [batch, seq, (heads + 2 kv_heads) * head]
itself), as the onnxruntime-genai builder's models do. A decode step at batch 1 is a matrix-vector
product per projection: one kernel reading the three weights instead of three kernels.

Each projection is MatMul(x, W) or, with a bias (Qwen2's q / k / v, the onnxruntime-genai builder's
packed MatMul + Add for it), Add(MatMul(x, W), b) with b a constant [width] on either side of the Add:
the packed form is then MatMul(x, [Wq | Wk | Wv]) + [bq | bk | bv] (zeros for a projection without one).
A checkpoint that is packed already (Phi-3's qkv_proj) exports q, k, v as Slices of one product on the
last axis: where they cut it into [0, q), [q, q + kv), [q + kv, q + 2 kv) in order and nothing else reads
them, the op takes the product itself.
The projections may also be com.microsoft.MatMulNBits (after `--weights`, which runs before this pass):
with equal K, bits, block_size and accuracy_level, scales of one type and zero points on all three or none,
and no g_idx or bias input, they become one MatMulNBits whose packed weights, scales and zero points are
the three's stacked along N. Each output column is quantized on its own, so this is the same operator as
quantizing the packed weight (the builder's int4 models quantize their packed qkv_proj).
Only where the three projections are read by the attention alone (and by Shape nodes of their
batch and seq axes, which then read the packed output), the weights are 2-D
initializers of one dtype with as many rows, and their widths are heads * head, kv * head, kv * head
(the op's attributes; the head size from the past input). Runs after lowering, on com.microsoft nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ops.targets import MS_DOMAIN
from graphopt.passes._common import detach_and_remove, record

__all__ = ["pack_qkv"]


def _batch_seq_shape(node: ir.Node) -> bool:
    """A Shape node reading axes within [batch, seq]: the packed output has the same."""
    if node.op_type != "Shape" or node.domain not in ("", "ai.onnx"):
        return False
    start = node.attributes["start"].as_int() if "start" in node.attributes else 0
    end = node.attributes["end"].as_int() if "end" in node.attributes else None
    return end is not None and 0 <= start < end <= 2


@dataclass(frozen=True)
class _Projection:
    matmul: ir.Node
    add: ir.Node | None  # the bias Add after it, if any
    x: ir.Value
    weight: np.ndarray | None  # [K, N]; None for a MatMulNBits (its arrays in `nbits`)
    bias: np.ndarray | None  # [N]
    #: A MatMulNBits' per-column arrays, each [N, ...]: qweight, scales and (if any) zero points.
    nbits: dict[str, np.ndarray] | None = None

    @property
    def output(self) -> ir.Value:
        return (self.add or self.matmul).outputs[0]

    @property
    def width(self) -> int:
        return int(self.weight.shape[1]) if self.weight is not None else _attr(self.matmul, "N")

    @property
    def dtype(self) -> np.dtype:
        return self.weight.dtype if self.weight is not None else self.nbits["scales"].dtype  # type: ignore[index]

    @property
    def form(self) -> tuple[Any, ...]:
        """What must be equal for the three to be packed: the float weight's type and rows, or the
        MatMulNBits attributes, scale type and whether it has zero points."""
        if self.weight is not None:
            return ("MatMul", self.weight.dtype, self.weight.shape[0])
        assert self.nbits is not None
        attrs = tuple(_attr(self.matmul, a) for a in ("K", "bits", "block_size", "accuracy_level"))
        return ("MatMulNBits", *attrs, self.dtype, "zero_points" in self.nbits)


def _attr(node: ir.Node, name: str) -> int:
    return node.attributes[name].as_int() if name in node.attributes else 0


def _nbits_arrays(node: ir.Node) -> dict[str, np.ndarray] | None:
    """A MatMulNBits' constant qweight, scales and zero points, each as [N, ...]; None when one is not
    constant, or it has a g_idx or bias input (not packed here)."""
    n = _attr(node, "N")
    names = ("qweight", "scales", "zero_points")
    arrays = {}
    for slot, name in enumerate(names, start=1):
        value = node.inputs[slot] if len(node.inputs) > slot else None
        if value is None:
            continue
        array = _const(value)
        if array is None or array.size % n:
            return None
        arrays[name] = array.reshape(n, -1) if name != "qweight" else array
    if "qweight" not in arrays or "scales" not in arrays or arrays["qweight"].shape[0] != n:
        return None
    if any(v is not None for v in node.inputs[4:]):
        return None
    return arrays


def _const(value: ir.Value | None) -> np.ndarray | None:
    return None if value is None or value.const_value is None else value.const_value.numpy()


def _single_reader(value: ir.Value) -> bool:
    return len([u for u, _ in value.uses() if not _batch_seq_shape(u)]) == 1


def _projection(value: ir.Value | None) -> _Projection | None:
    """The MatMul (and bias Add) with a constant 2-D weight (and constant [N] bias) making a value read
    by the attention and by Shape nodes of its batch and seq axes only (the rule counts the new tokens on v)."""
    if value is None or not _single_reader(value):
        return None
    node = value.producer()
    add = None
    if node is not None and node.op_type == "Add" and node.domain in ("", "ai.onnx"):
        add = node
        for product, addend in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            producer = None if product is None else product.producer()
            if _const(addend) is not None and product is not None and producer is not None and producer.op_type in ("MatMul", "MatMulNBits") \
                    and len(product.uses()) == 1:
                node = producer
                break
        else:
            return None
    if node is None:
        return None
    nbits = None
    if node.op_type == "MatMulNBits" and node.domain == MS_DOMAIN:
        nbits = _nbits_arrays(node)
        x, array = node.inputs[0], None
        if nbits is None or x is None:
            return None
    elif node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
        x, w = node.inputs
        array = _const(w)
        if array is None or x is None or array.ndim != 2:
            return None
    else:
        return None
    projection = _Projection(node, add, x, array, None, nbits)
    if add is not None:
        bias = next(b for b in (_const(add.inputs[0]), _const(add.inputs[1])) if b is not None)
        if bias.shape != (projection.width,) or bias.dtype != projection.dtype:
            return None  # not a per-column bias of this projection
        projection = _Projection(node, add, x, array, bias, nbits)
    return projection


def _packable(node: ir.Node) -> tuple[list[_Projection], str | None]:
    parts = [_projection(node.inputs[i] if len(node.inputs) > i else None) for i in range(3)]
    if any(p is None for p in parts):
        return [], "q, k and v are not each a MatMul with a constant 2-D weight (and a constant bias) read by the attention only"
    found = [p for p in parts if p is not None]
    if len({id(p.x) for p in found}) != 1:
        return [], "q, k and v are projected from different inputs"
    if len({p.form for p in found}) != 1:
        return [], "the weights differ in dtype or rows (or MatMulNBits attributes, scale type, zero points)"
    heads, kv_heads = node.attributes["num_heads"].as_int(), node.attributes["kv_num_heads"].as_int()
    past = node.inputs[3].shape if len(node.inputs) > 3 and node.inputs[3] is not None else None
    head = past[3] if past is not None and len(past) == 4 else None
    if not isinstance(head, int) or [p.width for p in found] != [heads * head, kv_heads * head, kv_heads * head]:
        return [], "the weights' widths are not heads, kv_heads, kv_heads times the head size"
    return found, None


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    graph.register_initializer(value)
    return value


def _slice_of(value: ir.Value | None) -> tuple[ir.Node, ir.Value, int, int] | None:
    """(Slice, its input, start, end) of a value read by the attention (and batch / seq Shapes) only, a step-1
    Slice of the last axis of a 3-D value with a static last dim, bounds clamped to it."""
    if value is None or not _single_reader(value):
        return None
    node = value.producer()
    if node is None or node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 4:
        return None
    data = node.inputs[0]
    bounds = [_const(v) for v in node.inputs[1:]]
    if data is None or data.shape is None or len(data.shape) != 3 or not isinstance(width := data.shape[2], int):
        return None
    if len(bounds) < 4:
        bounds.append(np.ones(1, np.int64))
    values = [int(b.item()) if b is not None and b.size == 1 else None for b in bounds[:4]]
    if None in values or values[3] != 1 or values[2] not in (2, -1):
        return None
    start, end = (min(max(v + width if v < 0 else v, 0), width) for v in (values[0], values[1]) if v is not None)
    return node, data, start, end


def _already_packed(node: ir.Node) -> ir.Value | None:
    """The product q, k, v are consecutive Slices of (the whole of it, in that order), else None."""
    parts = [_slice_of(node.inputs[i] if len(node.inputs) > i else None) for i in range(3)]
    if any(p is None for p in parts):
        return None
    found = [p for p in parts if p is not None]
    data = found[0][1]
    heads, kv_heads = node.attributes["num_heads"].as_int(), node.attributes["kv_num_heads"].as_int()
    past = node.inputs[3].shape if len(node.inputs) > 3 and node.inputs[3] is not None else None
    head = past[3] if past is not None and len(past) == 4 else None
    if not isinstance(head, int) or any(p[1] is not data for p in found) or data.shape is None:
        return None
    q, kv = heads * head, kv_heads * head
    spans = [(p[2], p[3]) for p in found]
    return data if spans == [(0, q), (q, q + kv), (q + kv, q + 2 * kv)] and data.shape[2] == q + 2 * kv else None


def _read_packed(node: ir.Node, separate: list[ir.Value], packed: ir.Value) -> None:
    """The op reads `packed` as its query, key and value left out; other readers of the separate q/k/v
    (the Shape reads of [batch, seq]) read `packed` too."""
    for value in separate:
        for user, slot in list(value.uses()):
            if user is not node:
                user.replace_input_with(slot, packed)
    node.replace_input_with(0, packed)
    node.replace_input_with(1, None)
    node.replace_input_with(2, None)


def _take_packed(model: ir.Model, node: ir.Node, packed: ir.Value) -> None:
    """The op reads `packed` as its query, key and value left out; the Slices go (their Shape readers read `packed`)."""
    slices = [node.inputs[i].producer() for i in range(3)]  # type: ignore[union-attr]
    _read_packed(node, [s.outputs[0] for s in slices], packed)  # type: ignore[union-attr]
    for s in slices:
        detach_and_remove(model, s)  # type: ignore[arg-type]


def _packed_matmul(graph: ir.Graph, name: str, parts: list[_Projection], width: int) -> ir.Node:
    """One MatMul (or MatMulNBits) computing the three projections side by side."""
    q = parts[0]
    if q.weight is not None:
        packed = np.concatenate([p.weight for p in parts], axis=1)  # type: ignore[misc]
        return ir.Node("", "MatMul", [q.x, _initializer(graph, f"{name}_weight", packed)], name=name)
    inputs: list[ir.Value | None] = [q.x]
    for slot, key in enumerate(("qweight", "scales", "zero_points"), start=1):
        if key not in q.nbits:  # type: ignore[operator]
            break
        stacked = np.concatenate([p.nbits[key] for p in parts], axis=0)  # type: ignore[index]
        original = q.matmul.inputs[slot].const_value.shape  # type: ignore[union-attr]
        if key != "qweight" and len(original) == 1:  # the flat [N * blocks] form stays flat
            stacked = stacked.reshape(-1)
        inputs.append(_initializer(graph, f"{name}_{key}", stacked))
    attrs = [ir.AttrInt64("N", width) if a.name == "N" else a for a in q.matmul.attributes.values()]
    return ir.Node(MS_DOMAIN, "MatMulNBits", inputs, attrs, name=name)


def pack_qkv(model: ir.Model, *, stats: Any = None) -> int:
    """Packs every GroupQueryAttention it can; returns how many."""
    started = time.perf_counter()
    graph = model.graph
    packed = 0
    for node in [n for n in graph if n.domain == MS_DOMAIN and n.op_type == "GroupQueryAttention"]:
        already = _already_packed(node)
        if already is not None:
            _take_packed(model, node, already)
            packed += 1
            continue
        parts, problem = _packable(node)
        if problem is not None:
            continue
        q = parts[0]
        name = f"{q.matmul.name}_qkv"
        width = sum(p.width for p in parts)
        matmul = _packed_matmul(graph, name, parts, width)
        packed_value = matmul.outputs[0]
        packed_value.name = f"{name}_output"
        graph.insert_before(q.matmul, matmul)
        if any(p.bias is not None for p in parts):
            bias = np.concatenate([p.bias if p.bias is not None else np.zeros(p.width, p.dtype) for p in parts])
            add = ir.Node("", "Add", [packed_value, _initializer(graph, f"{name}_bias", bias)], name=f"{name}_bias_add")
            graph.insert_after(matmul, add)
            packed_value = add.outputs[0]
            packed_value.name = f"{name}_biased"
        q_value = q.output
        for value in {id(v): v for v in (matmul.outputs[0], packed_value)}.values():
            value.type = q_value.type
            if q_value.shape is not None and len(q_value.shape) >= 1:  # [..., (heads + 2 kv_heads) * head]
                value.shape = ir.Shape([*list(q_value.shape)[:-1], width])
        _read_packed(node, [p.output for p in parts], packed_value)
        for p in parts:
            unused = [v for n in (p.add, p.matmul) if n is not None for v in n.inputs if v is not None and v.const_value is not None]
            for old in (p.add, p.matmul):
                if old is not None:
                    detach_and_remove(model, old)
            for w in unused:  # the separate weights and biases, unless something else reads them
                if w.name is not None and not w.uses() and w.name in graph.initializers and not w.is_graph_output():
                    del graph.initializers[w.name]
        packed += 1
    record(stats, packed, started)
    return packed
