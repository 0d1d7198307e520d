"""The NHWC layout pass's vocabulary and graph editing: permutations, value readers, a node builder.

What the rewrite (graphopt.passes.nhwc_rewrite), the Transpose cleanup
(graphopt.passes.transpose_cleanup) and the CPU emulation (graphopt.passes.nhwc_emulation)
share: the NHWC permutations and onnxruntime's internal NHWC domain, small readers of a
value's rank, dtype, constant and attributes, and `_Builder`, which makes uniquely named
nodes, values and initializers in one graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ir.onnx_view import dtype_name

__all__ = ["NHWC_DOMAIN", "TO_NHWC", "TO_NCHW"]

NHWC_DOMAIN = "com.ms.internal.nhwc"
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
_ONNX = ("", "ai.onnx")


def _uses(value: ir.Value) -> list[Any]:
    """The uses of a value by nodes in a graph (a rewrite the driver built and then
    refused can leave a detached node registered as a user)."""
    return [u for u in value.uses() if u.node.graph is not None]


def _x(node: ir.Node, index: int = 0) -> ir.Value:
    """An input the op requires (present in any valid model)."""
    value = node.inputs[index]
    assert value is not None, f"{node.op_type} {node.name} has no input {index}"
    return value


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _dtype(value: ir.Value | None) -> str | None:
    if value is None or value.type is None:
        return None
    return dtype_name(value.type.dtype)


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain in _ONNX and "value" in producer.attributes:
        return producer.attributes["value"].value.numpy()
    return None


def _is_scalar(value: ir.Value) -> bool:
    shape = value.shape
    return shape is not None and all(isinstance(d, int) and d == 1 for d in shape)


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    attr = node.attributes.get(name)
    if attr is None or attr.is_ref():
        return default
    value = attr.value
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else value


def _permute_shape(shape: ir.Shape | None, perm: Sequence[int]) -> ir.Shape | None:
    if shape is None or len(shape) != len(perm):
        return None
    return ir.Shape([shape[i] for i in perm])


def _nhwc_axis(axis: int, rank: int = 4) -> int:
    """Where NCHW axis `axis` is in NHWC."""
    return TO_NHWC.index(axis % rank)


class _Builder:
    """Makes uniquely named nodes, values and initializers in one graph."""

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.graph = model.graph
        self.names: set[str] = {v.name for v in self.graph.inputs if v.name}
        self.names.update(self.graph.initializers)
        for node in ir.traversal.RecursiveGraphIterator(self.graph):
            self.names.update(v.name for v in node.outputs if v.name)
            if node.name:
                self.names.add(node.name)
        self.counter = 0

    def fresh(self, hint: str) -> str:
        while True:
            self.counter += 1
            name = f"{hint}__nhwc{self.counter}"
            if name not in self.names:
                self.names.add(name)
                return name

    def node(self, domain: str, op_type: str, inputs: Sequence[ir.Value | None], attrs: dict[str, Any] | None = None,
             hint: str = "", num_outputs: int = 1) -> ir.Node:
        attributes = []
        for key, value in (attrs or {}).items():
            if isinstance(value, ir.Attr):
                attributes.append(ir.Attr(key, value.type, value.value, ref_attr_name=value.ref_attr_name))
            else:
                attributes.append(ir.convenience.convert_attribute(key, value))
        name = self.fresh(hint or op_type)
        node = ir.Node(domain, op_type, list(inputs), attributes, num_outputs=num_outputs, name=name)
        for i, out in enumerate(node.outputs):
            out.name = self.fresh(f"{name}_out{i}") if num_outputs > 1 else name
        return node

    def constant(self, array: np.ndarray, hint: str) -> ir.Value:
        name = self.fresh(hint)
        tensor = ir.tensor(np.ascontiguousarray(array), name=name)
        value = ir.Value(name=name, const_value=tensor, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype))
        self.graph.register_initializer(value)
        return value


def _detach_and_remove(graph: ir.Graph, nodes: Iterable[ir.Node]) -> None:
    for node in nodes:
        if node.graph is None:
            continue
        for i in range(len(node.inputs)):
            node.replace_input_with(i, None)
        graph.remove(node)

