"""FusedConv or Conv + activation: a decision, per node (ort-cpu and ort-cuda).

The conv-activation rules fuse Conv (+ residual Add) + activation into
com.microsoft.FusedConv. One cuDNN/MLAS call does less memory traffic, but a fused
cuDNN call may pick a slower algorithm than the plain convolution (on an H100, six
fused depthwise 3x3 convolutions at batch 32 took 0.97 ms against 0.46 ms as Conv + Relu:
benchmarks/results/decisions_bench-2026-11-25-h100.json), so this is a decision
(graphopt.decisions), made after lowering for every FusedConv:

* The baseline is the model as it came: Conv + Add(Z) + activation, the nodes the
  input had (its BatchNormalization folded, its bias Adds in the Conv). onnxruntime's
  own session optimizer then fuses what it fuses itself, exactly as it does on the
  original model. A node stays FusedConv only where the cost table predicts FusedConv
  faster than the split form by more than the noise margin (for every batch size the
  model allows), or where `--tune` measures it faster on the target's provider (each
  form timed as a one-node model in onnxruntime). A shape class nobody measured is split.
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.decisions import DecisionPoint, conv_class, signature_of
from graphopt.decisions.shapes import batch_buckets
from graphopt.ir.onnx_view import dtype_name
from graphopt.ops.targets import MS_DOMAIN
from graphopt.passes._common import detach_and_remove, record, take_over

__all__ = ["decide_fused_convs", "FUSED", "SPLIT"]

FUSED = "FusedConv"
SPLIT = "Conv+activation"
#: A symbolic dimension of a timed one-node model gets this size (batch: 1).
_TUNE_DIM = 16


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    attr = node.attributes.get(name)
    return default if attr is None or attr.is_ref() else attr.value


def _classes(node: ir.Node) -> list[list[Any]] | None:
    x, w = node.inputs[0], node.inputs[1]
    if x is None or w is None or x.shape is None or x.type is None:
        return None
    w_shape = w.const_value.shape if w.const_value is not None else w.shape
    if w_shape is None:
        return None
    dtype = dtype_name(x.type.dtype) or "?"
    worlds = []
    for batch in batch_buckets(x.shape[0] if len(x.shape) else None):
        cls = conv_class(dtype, list(x.shape), list(w_shape), int(_attr(node, "group", 1)), batch)
        if cls is None:
            return None
        worlds.append([cls])
    return worlds


def _split_nodes(node: ir.Node, x: ir.Value, inputs: list[ir.Value | None], opset: int) -> tuple[list[ir.Node], ir.Value]:
    """Conv(x, w, b) -> Add(z) -> activation, computing what FusedConv(x, w, b, z) does."""
    conv_attrs = [a for k, a in node.attributes.items() if k not in ("activation", "activation_params")]
    w, b = inputs[1], inputs[2] if len(inputs) > 2 else None
    z = inputs[3] if len(inputs) > 3 else None
    name = node.name or "fused_conv"
    made = [ir.Node("", "Conv", [x, w, *([b] if b is not None else [])], conv_attrs, name=f"{name}_conv")]
    y = made[-1].outputs[0]
    if z is not None:
        made.append(ir.Node("", "Add", [y, z], name=f"{name}_add_z"))
        y = made[-1].outputs[0]
    activation = _attr(node, "activation")
    params = list(_attr(node, "activation_params", None) or [])
    if activation is not None:
        attrs: list[ir.Attr] = []
        extra: list[ir.Value | None] = []
        if activation == "LeakyRelu":
            attrs = [ir.AttrFloat32("alpha", float(params[0]))]
        elif activation == "HardSigmoid":
            attrs = [ir.AttrFloat32("alpha", float(params[0])), ir.AttrFloat32("beta", float(params[1]))]
        elif activation == "Clip":
            np_dtype = x.type.dtype.numpy() if x.type is not None else np.float32
            if opset >= 11:
                extra = [ir.Value(name=f"{name}_clip_{k}", const_value=ir.tensor(np.array(v, np_dtype))) for k, v in zip(("min", "max"), params)]
            else:
                attrs = [ir.AttrFloat32("min", float(params[0])), ir.AttrFloat32("max", float(params[1]))]
        made.append(ir.Node("", str(activation), [y, *extra], attrs, name=f"{name}_{str(activation).lower()}"))
        y = made[-1].outputs[0]
    for i, n in enumerate(made):
        n.outputs[0].name = f"{name}_split{i}"
    return made, y


def _rename(made: list[ir.Node], fused_name: str, graph: ir.Graph) -> None:
    """Names as the rewrite driver gives them (`base`, `base_N`): the FusedConv stood in for
    its pattern's root, the op the last split node is, which gets the root's name back
    where it is free; the others get `base_N` names no node has."""
    taken = {n.name for n in graph if n.name} - {fused_name}  # the FusedConv goes
    base = re.sub(r"_\d+$", "", fused_name) or "fused_conv"
    counter = 1
    for n in reversed(made):
        name = base
        while name in taken:
            name, counter = f"{base}_{counter}", counter + 1
        n.name = name
        taken.add(name)


def _split_in_place(model: ir.Model, node: ir.Node, opset: int) -> None:
    x = node.inputs[0]
    assert x is not None
    made, y = _split_nodes(node, x, list(node.inputs), opset)
    _rename(made, node.name or "", model.graph)
    for n in made:
        for v in n.inputs:
            if v is not None and v.const_value is not None and v.name and v.name not in model.graph.initializers and v.producer() is None:
                model.graph.register_initializer(v)
    model.graph.insert_before(node, made)
    old = node.outputs[0]
    # Conv, Add(Z) and the activation all have the fused output's type and shape; passes after
    # this one (layout) need them on every value, not only the last.
    for n in made:
        n.outputs[0].type, n.outputs[0].shape = old.type, old.shape.copy() if old.shape is not None else None
    take_over(old, y)
    detach_and_remove(model, node)


def _one_node_model(node: ir.Node, candidate: str, opset: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """The node alone, in the candidate's form: data inputs become graph inputs (symbolic
    dims: batch 1, others 16), constant inputs initializers."""
    rng = np.random.default_rng(0)
    graph_inputs: list[ir.Value] = []
    initializers: list[ir.Value] = []
    feeds: dict[str, np.ndarray] = {}
    inputs: list[ir.Value | None] = []
    for i, value in enumerate(node.inputs):
        if value is None:
            inputs.append(None)
            continue
        if value.const_value is not None:
            copy = ir.Value(name=f"c{i}", const_value=ir.tensor(value.const_value.numpy(), name=f"c{i}"))
            copy.type, copy.shape = ir.TensorType(value.const_value.dtype), ir.Shape(value.const_value.numpy().shape)
            initializers.append(copy)
            inputs.append(copy)
            continue
        assert value.shape is not None and value.type is not None
        dims = [d if isinstance(d, int) else (1 if j == 0 else _TUNE_DIM) for j, d in enumerate(value.shape)]
        graph_input = ir.Value(name=f"in{i}", type=value.type, shape=ir.Shape(dims))
        graph_inputs.append(graph_input)
        inputs.append(graph_input)
        feeds[graph_input.name or ""] = rng.standard_normal(dims).astype(value.type.dtype.numpy())
    if candidate == FUSED:
        attrs = list(node.attributes.values())
        nodes = [ir.Node(MS_DOMAIN, "FusedConv", inputs, attrs, name="fused")]
        y = nodes[0].outputs[0]
    else:
        nodes, y = _split_nodes(node, inputs[0], inputs, opset)  # type: ignore[arg-type]
        for n in nodes:
            for v in n.inputs:
                if v is not None and v.const_value is not None and all(v is not c for c in initializers):
                    initializers.append(v)
    y.name = "y"
    y.type = node.outputs[0].type
    graph = ir.Graph(graph_inputs, [y], nodes=nodes, initializers=initializers, opset_imports={"": opset, MS_DOMAIN: 1})
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=8))
    return proto.SerializeToString(), feeds


def decide_fused_convs(model: ir.Model, decider: DecisionPoint, *, stats: Any = None) -> int:
    """Decide every com.microsoft.FusedConv of the main graph; returns how many were split."""
    started = time.perf_counter()
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
    split = 0
    for node in list(model.graph):
        if node.domain != MS_DOMAIN or node.op_type != "FusedConv":
            continue
        x = node.inputs[0]
        shape_key = [str(d) for d in x.shape] if x is not None and x.shape is not None else None
        w = node.inputs[1]
        w_shape = list(w.const_value.shape) if w is not None and w.const_value is not None else None
        attrs = sorted((k, repr(a.value)) for k, a in node.attributes.items() if not a.is_ref())
        dtype = dtype_name(x.type.dtype) if x is not None and x.type is not None else None
        buildable = all(v is None or v.const_value is not None or (v.shape is not None and v.type is not None) for v in node.inputs)
        build: Any = (lambda candidate, node=node: _one_node_model(node, candidate, opset)) if buildable else None
        chosen = decider.choose(
            "fused_conv",
            node.name or "FusedConv",
            [FUSED, SPLIT],
            SPLIT,
            _classes(node),
            build=build,
            signature=signature_of("FusedConv", shape_key, w_shape, attrs, dtype, [v is not None for v in node.inputs]),
        ).chosen
        if chosen == SPLIT:
            _split_in_place(model, node, opset)
            split += 1
    record(stats, split, started)
    return split
