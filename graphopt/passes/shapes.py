"""Shape and type inference that keeps symbolic dims.

Built on onnx-ir's helper for onnx's C API: it serializes the model without its
large initializers (so models over 2 GB work); onnx.shape_inference runs with data
propagation (Shape -> Gather -> Reshape chains get real dims), and the results are
merged back by value name. Our additions:

* non-strict inference: one node onnx cannot infer (com.microsoft and other custom
  domains, a bad annotation) stops only what depends on it, not the whole model;
  if inference fails altogether the model is left as it was;
* the merge never loses information: a dim that was an int stays that int, a named
  symbolic dim is not replaced by an anonymous one, a known rank is not dropped;
* the count of values whose type or shape got more precise.

Only value types and shapes change; nodes and initializers stay as they were.

`refine_shapes` runs inference again between rule sweeps, where it can make a Shape or
Size static: the first inference cannot see through shape arithmetic that onnx's data
propagation does not follow (ReduceProd, Max, Pad or Resize to computed sizes ...), so
everything downstream keeps unknown dims until constant folding has turned that
arithmetic into constants.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import onnx
import onnx_ir as ir

from graphopt.ir.onnx_view import OnnxView
from graphopt.passes._common import as_model, record, subgraphs

__all__ = ["infer_shapes", "refine_shapes"]

logger = logging.getLogger(__name__)

_Snapshot = tuple[ir.TypeProtocol | None, ir.Shape | None]


def infer_shapes(model: ir.Model | OnnxView, *, data_prop: bool = True, stats: Any = None) -> int:
    """Infer types and shapes in place; returns the number of values made more precise."""
    started = time.perf_counter()
    model = as_model(model)
    before: dict[ir.Value, _Snapshot] = {v: (v.type, v.shape.copy() if v.shape is not None else None) for v in _values(model)}
    order = list(model.graph.initializers)
    try:
        _infer_into(model, data_prop)
    except Exception as e:  # noqa: BLE001 - the pass restores the model; we only log
        logger.warning("shape inference failed, shapes left as they were: %s", e)
        _restore(before)
        _restore_order(model.graph, order)
        record(stats, 0, started)
        return 0
    # The pass re-adds the large initializers it hid from onnx at the end: put them back.
    _restore_order(model.graph, order)
    changed = sum(_merge(value, type_, shape) for value, (type_, shape) in before.items())
    record(stats, changed, started)
    return changed


def refine_shapes(model: ir.Model | OnnxView, *, stats: Any = None) -> int:
    """Infer again when a Shape or Size reads a value with a dim that is not static.

    Returns how many such values got more precise dims (what lets the next rules fold a
    Shape, or a Gather of its dims). Values that only gained a shape — outputs of nodes
    a rewrite made — are not counted: the sweep that made them already counts as a change.
    """
    started = time.perf_counter()
    model = as_model(model)
    pending = {value: _dims(value) for value in _values_read_by_shape_ops(model)}
    if not pending:
        record(stats, 0, started)
        return 0
    infer_shapes(model)
    changed = sum(1 for value, dims in pending.items() if _dims(value) != dims)
    record(stats, changed, started)
    return changed


def _dims(value: ir.Value) -> tuple[int | str | None, ...] | None:
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else d.value for d in value.shape)


def _values_read_by_shape_ops(model: ir.Model) -> list[ir.Value]:
    """Inputs of Shape and Size nodes whose shape has an unknown rank or a dim that is not an int."""
    found = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.op_type not in ("Shape", "Size") or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        value = node.inputs[0]
        if value is not None and (value.shape is None or not value.shape.is_static()):
            found.append(value)
    return found


def _infer_into(model: ir.Model, data_prop: bool) -> None:
    """onnx's shape inference, merged into the model by name.

    Not onnx-ir's ShapeInferencePass: its merge copies only the element type, so a
    sequence value comes back as a tensor (onnx-ir 1.1), which onnxruntime then
    refuses. Large initializers are hidden from onnx's C API as onnx-ir's pass hides
    them (so models above 2 GB work; `_call_onnx_api`) and whole types are merged here.
    """

    def run(proto: onnx.ModelProto) -> onnx.ModelProto:
        _import_every_domain(proto)
        return onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=data_prop)

    inferred = ir.serde.deserialize_model(_call_onnx_api(run, model))
    for original_graph, inferred_graph in zip(model.graphs(), inferred.graphs(), strict=False):
        inferred_values = ir.convenience.create_value_mapping(inferred_graph)
        for name, value in ir.convenience.create_value_mapping(original_graph).items():
            new = inferred_values.get(name)
            if new is None:
                continue
            if new.type is not None:
                value.type = new.type
            if new.shape is not None:
                value.shape = new.shape


#: Initializers above this many bytes are hidden from onnx's C API (as onnx-ir's _c_api_utils).
_BIG_TENSOR_BYTES = 1000


def _call_onnx_api(func: Callable[[onnx.ModelProto], onnx.ModelProto], model: ir.Model) -> onnx.ModelProto:
    """`func` on the model serialized with its large initializers turned into graph inputs; the
    model is left as it was, whatever `func` does.

    onnx-ir 1.1's `onnx_ir.passes.common._c_api_utils.call_onnx_api`, step for step: a private
    helper, and importing it imports all of onnx-ir's passes (~6 ms of a small model's start)."""
    initializer_values = tuple(model.graph.initializers.values())
    tensors = {v.name: v.const_value for v in initializer_values}
    original_inputs_len = len(model.graph.inputs)
    for initializer in initializer_values:
        if initializer.const_value is not None:  # shape inference reads the input's type and shape
            if initializer.shape is None:
                initializer.shape = initializer.const_value.shape  # type: ignore[assignment]
            if initializer.dtype is None:
                initializer.dtype = initializer.const_value.dtype
        if initializer not in model.graph.inputs:
            model.graph.inputs.append(initializer)
        if initializer.const_value is None:  # no data (weights not loaded): an input only
            assert initializer.name is not None
            model.graph.initializers.pop(initializer.name)
        elif initializer.const_value.nbytes > _BIG_TENSOR_BYTES:
            initializer.const_value = None
            assert initializer.name is not None
            model.graph.initializers.pop(initializer.name)
    proto = ir.serde.serialize_model(model)
    try:
        return func(proto)
    finally:
        for initializer in initializer_values:
            initializer.const_value = tensors[initializer.name]
            if initializer.const_value is not None:
                model.graph.register_initializer(initializer)
            else:
                model.graph.initializers.add(initializer)  # register_initializer wants a value
        inputs = model.graph.inputs[:original_inputs_len]
        model.graph.inputs.clear()
        model.graph.inputs.extend(inputs)


def _import_every_domain(proto: onnx.ModelProto) -> None:
    """Give each node domain the model does not import an opset import (on the copy onnx reads):
    onnx refuses a model with, for example, graphopt's own ops that lowering has not yet
    replaced, where non-strict inference would only skip them."""
    imported = {opset.domain for opset in proto.opset_import}
    stack = [proto.graph]
    missing: set[str] = set()
    while stack:
        graph = stack.pop()
        for node in graph.node:
            if node.domain not in imported and node.domain != "ai.onnx":
                missing.add(node.domain)
            for attr in node.attribute:
                stack.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
    for function in proto.functions:
        missing.update(node.domain for node in function.node if node.domain not in imported and node.domain != "ai.onnx")
    proto.opset_import.extend(onnx.helper.make_opsetid(domain, 1) for domain in sorted(missing) if domain)


def _values(model: ir.Model) -> Iterator[ir.Value]:
    """Every value of the main graph and its subgraphs (the pass does not touch functions)."""
    stack: list[ir.Graph] = [model.graph]
    while stack:
        graph = stack.pop()
        yield from graph.inputs
        yield from graph.initializers.values()
        for node in graph:
            yield from node.outputs
            stack.extend(subgraphs(node))


def _restore(before: dict[ir.Value, _Snapshot]) -> None:
    for value, (type_, shape) in before.items():
        value.type = type_
        value.shape = shape


def _restore_order(graph: ir.Graph, order: list[str]) -> None:
    initializers = graph.initializers
    if list(initializers) == order:
        return
    values = [initializers.pop(name) for name in order if name in initializers]
    for value in values:
        initializers.add(value)


def _merge(value: ir.Value, old_type: ir.TypeProtocol | None, old_shape: ir.Shape | None) -> bool:
    """Keep the more precise of the old and the inferred type/shape; True if it improved."""
    new_shape = value.shape
    improved = False
    if old_type is not None:
        if value.type != old_type:
            value.type = old_type  # the graph's own annotation wins a conflict
    elif value.type is not None:
        improved = True
    if old_shape is None:
        return improved or new_shape is not None
    if new_shape is None or len(new_shape) != len(old_shape):
        value.shape = old_shape
        return improved
    dims: list[int | str | None] = []
    for old, new in zip(old_shape, new_shape, strict=False):
        if isinstance(old, int):
            dims.append(old)
        elif isinstance(new, int):
            dims.append(new)
            improved = True
        elif old.value is None and new.value is not None:
            dims.append(new.value)
            improved = True
        else:
            dims.append(old.value)
    merged = ir.Shape(dims)
    if merged != new_shape:
        value.shape = merged
    return improved
