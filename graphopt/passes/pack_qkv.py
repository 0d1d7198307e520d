"""Packed QKV for onnxruntime's GroupQueryAttention: q, k and v projected from one input by three
MatMuls with constant weights become one MatMul with the weights concatenated, its output the op's
packed query (key and value left out; the kernel splits [batch, seq, (heads + 2 kv_heads) * head]
itself), as the onnxruntime-genai builder's models do. A decode step at batch 1 is a matrix-vector
product per projection: one kernel reading the three weights instead of three kernels.

Only where the three MatMul outputs are read by the attention alone (and by Shape nodes of their
batch and seq axes, which then read the packed output), the weights are 2-D
initializers of one dtype with as many rows, and their widths are heads * head, kv * head, kv * head
(the op's attributes; the head size from the past input). Runs after lowering, on com.microsoft nodes.
"""

from __future__ import annotations

import time
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


def _projection(value: ir.Value | None) -> tuple[ir.Node, ir.Value, np.ndarray] | None:
    """(MatMul, its input, its constant 2-D weight) of a value read by the attention and by Shape
    nodes of its batch and seq axes only (the rule counts the new tokens on v)."""
    if value is None or len([u for u, _ in value.uses() if not _batch_seq_shape(u)]) != 1:
        return None
    node = value.producer()
    if node is None or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
        return None
    x, w = node.inputs
    if w is None or w.const_value is None or x is None:
        return None
    array = w.const_value.numpy()
    return (node, x, array) if array.ndim == 2 else None


def _packable(node: ir.Node) -> tuple[list[tuple[ir.Node, ir.Value, np.ndarray]], str | None]:
    parts = [_projection(node.inputs[i] if len(node.inputs) > i else None) for i in range(3)]
    if any(p is None for p in parts):
        return [], "q, k and v are not each a MatMul with a constant 2-D weight read by the attention only"
    found = [p for p in parts if p is not None]
    if len({id(x) for _, x, _ in found}) != 1:
        return [], "q, k and v are projected from different inputs"
    if len({w.dtype for _, _, w in found}) != 1 or len({w.shape[0] for _, _, w in found}) != 1:
        return [], "the weights differ in dtype or rows"
    heads, kv_heads = node.attributes["num_heads"].as_int(), node.attributes["kv_num_heads"].as_int()
    past = node.inputs[3].shape if len(node.inputs) > 3 and node.inputs[3] is not None else None
    head = past[3] if past is not None and len(past) == 4 else None
    if not isinstance(head, int) or [w.shape[1] for _, _, w in found] != [heads * head, kv_heads * head, kv_heads * head]:
        return [], "the weights' widths are not heads, kv_heads, kv_heads times the head size"
    return found, None


def pack_qkv(model: ir.Model, *, stats: Any = None) -> int:
    """Packs every GroupQueryAttention it can; returns how many."""
    started = time.perf_counter()
    graph = model.graph
    packed = 0
    for node in [n for n in graph if n.domain == MS_DOMAIN and n.op_type == "GroupQueryAttention"]:
        parts, problem = _packable(node)
        if problem is not None:
            continue
        (q_node, x, wq), (k_node, _, wk), (v_node, _, wv) = parts
        name = f"{q_node.name}_qkv"
        packed_array = np.concatenate([wq, wk, wv], axis=1)
        weight = ir.Value(name=f"{name}_weight", const_value=ir.tensor(packed_array, name=f"{name}_weight"))
        graph.register_initializer(weight)
        matmul = ir.Node("", "MatMul", [x, weight], name=name)
        matmul.outputs[0].name = f"{name}_output"
        q_value = q_node.outputs[0]
        matmul.outputs[0].type = q_value.type
        if q_value.shape is not None and len(q_value.shape) >= 1:  # [..., (heads + 2 kv_heads) * head]
            matmul.outputs[0].shape = ir.Shape([*list(q_value.shape)[:-1], packed_array.shape[1]])
        graph.insert_before(q_node, matmul)
        for old in (q_node, k_node, v_node):  # the Shape reads of [batch, seq]
            for user, slot in list(old.outputs[0].uses()):
                if user is not node:
                    user.replace_input_with(slot, matmul.outputs[0])
        node.replace_input_with(0, matmul.outputs[0])
        node.replace_input_with(1, None)
        node.replace_input_with(2, None)
        for old in (q_node, k_node, v_node):
            unused = [old.inputs[1]]
            detach_and_remove(model, old)
            for w in unused:  # the separate weights, unless something else reads them
                if w is not None and w.name is not None and not w.uses() and w.name in graph.initializers and not w.is_graph_output():
                    del graph.initializers[w.name]
        packed += 1
    record(stats, packed, started)
    return packed
