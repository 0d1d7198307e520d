"""SkipLayerNormalization or Add + LayerNormalization: a decision, per node (ort-cpu).

The rules FuseSkipLayerNorm, FoldBiasIntoSkipLayerNorm and FuseSkipRMSNorm fuse a residual
Add (and a bias Add) with the norm after it into com.microsoft.SkipLayerNormalization or
SkipSimplifiedLayerNormalization. onnxruntime's CPU kernels of those ops run slower than
the ops they replace in most shapes (1x128x768 on a 2-core EPYC, one thread: 532 against
84 us for Add + LayerNormalization + the next Add when the sum is used elsewhere, 128 against
61 us for Add + SimplifiedLayerNormalization; benchmarks/ort_cpu_norms.py,
benchmarks/results/ort_cpu_norms-2026-11-27-cpu2core.json), so on the CPU provider the
fused form is a decision (graphopt.decisions), made after lowering for every such node:

* The baseline is the model as graphopt had it before the fusion: [Add(input, bias)] +
  Add(., skip) + LayerNormalization (or SimplifiedLayerNormalization, graphopt.RMSNorm's
  onnxruntime form), the sum going to the readers of the op's 4th output. A node the input
  model already had (no rule made it) has the fused form as its baseline and is left alone.
  onnxruntime's own optimizer then fuses what it fuses itself, as it does on the original.
* A third candidate, `unfused-2d` (SkipLayerNormalization only): the norm reads the sum
  reshaped to [rows, hidden] and its output is reshaped back. Where the sum has no other
  reader, onnxruntime's SkipLayerNormFusion turns plain Add + LayerNormalization into the same
  slow kernel again (for the original model too); it does not match this form (1x128x768:
  491 against 77 us).
* A candidate replaces the baseline only where the cost table predicts it faster by more than
  the noise margin (for every row count the model's symbolic dimensions allow), or where
  `--tune` measures it faster on the CPU provider (each form timed as a small model). A shape
  class nobody measured is split into the plain unfused form.

ort-cuda keeps the rules' fused ops (their CUDA kernels are the reason for the rules); its
decision waits for CUDA entries (benchmarks/ort_cpu_norms.py --provider cuda measures them).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.decisions import DecisionPoint, signature_of
from graphopt.decisions.shapes import norm_worlds
from graphopt.ir.onnx_view import dtype_name
from graphopt.ir.provenance import RULE_KEY
from graphopt.ops.targets import MS_DOMAIN
from graphopt.passes._common import detach_and_remove, record, take_over

__all__ = ["decide_skip_norms", "FUSED", "UNFUSED", "UNFUSED_2D", "DECISION", "SKIP_NORMS"]

DECISION = "skip_norm"
FUSED = "fused"
UNFUSED = "unfused"
#: Add + LayerNormalization of the sum reshaped to [rows, hidden]: where the sum has no other
#: reader, onnxruntime's own optimizer fuses plain Add + LayerNormalization into the slow CPU
#: SkipLayerNormalization kernel again (1x128x768: 491 us); this form it leaves alone (77 us).
UNFUSED_2D = "unfused-2d"
#: fused op -> the norm of its unfused form (domain, op type).
SKIP_NORMS: dict[str, tuple[str, str]] = {
    "SkipLayerNormalization": ("", "LayerNormalization"),
    "SkipSimplifiedLayerNormalization": ("", "SimplifiedLayerNormalization"),
}
#: A symbolic dimension of a timed model gets this size (the first: 1).
_TUNE_DIM = 128


def _inputs(node: ir.Node) -> dict[str, ir.Value | None]:
    """The fused op's inputs by role (SkipSimplified has no beta: its 4th input is the bias)."""
    ins = list(node.inputs) + [None] * 5
    if node.op_type == "SkipLayerNormalization":
        return {"input": ins[0], "skip": ins[1], "gamma": ins[2], "beta": ins[3], "bias": ins[4]}
    return {"input": ins[0], "skip": ins[1], "gamma": ins[2], "beta": None, "bias": ins[3]}


def _epsilon(node: ir.Node) -> float:
    attr = node.attributes.get("epsilon")
    return 1e-12 if attr is None or attr.is_ref() else float(attr.value)  # the contrib schema's default


def _used(value: ir.Value | None, graph: ir.Graph) -> bool:
    return value is not None and (bool(value.uses()) or value in graph.outputs)


def _unfused_nodes(
    node: ir.Node, inputs: dict[str, ir.Value | None], name: str, two_d: bool = False
) -> tuple[list[ir.Node], ir.Value, ir.Value, ir.Node]:
    """[Add(input, bias)] -> Add(., skip) -> norm: (nodes, the sum, the normalized output, the norm).
    `two_d`: the norm reads the sum reshaped to [rows, hidden] and its output is reshaped back, a
    form onnxruntime's SkipLayerNormFusion (a 3-D Add right before the norm) leaves alone."""
    made: list[ir.Node] = []
    first = inputs["input"]
    if inputs["bias"] is not None:
        made.append(ir.Node("", "Add", [first, inputs["bias"]], name=f"{name}_add_bias"))
        first = made[-1].outputs[0]
    made.append(ir.Node("", "Add", [first, inputs["skip"]], name=f"{name}_add_skip"))
    total = norm_in = made[-1].outputs[0]
    shape = inputs["input"].shape if inputs["input"] is not None else None
    if two_d:
        assert shape is not None and isinstance(shape[-1], int)
        rows_hidden = ir.Value(name=f"{name}_rows_hidden", const_value=ir.tensor(np.array([-1, shape[-1]], np.int64), name=f"{name}_rows_hidden"))
        made.append(ir.Node("", "Reshape", [total, rows_hidden], name=f"{name}_to_2d"))
        norm_in = made[-1].outputs[0]
    domain, op = SKIP_NORMS[node.op_type]
    norm_inputs = [norm_in, inputs["gamma"], *([inputs["beta"]] if inputs["beta"] is not None else [])]
    norm = ir.Node(domain, op, norm_inputs, [ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", _epsilon(node))], name=f"{name}_norm")
    made.append(norm)
    if two_d:
        assert shape is not None
        if all(isinstance(d, int) for d in shape):
            back = ir.Value(name=f"{name}_shape", const_value=ir.tensor(np.array(list(shape), np.int64), name=f"{name}_shape"))
        else:
            made.append(ir.Node("", "Shape", [total], name=f"{name}_shape"))
            back = made[-1].outputs[0]
        made.append(ir.Node("", "Reshape", [norm.outputs[0], back], name=f"{name}_from_2d"))
    return made, total, made[-1].outputs[0], norm


def _split_in_place(model: ir.Model, node: ir.Node, two_d: bool) -> None:
    name = node.name or node.op_type
    made, total, normed, norm = _unfused_nodes(node, _inputs(node), name, two_d)
    # The norm stands in for the fused op (which stood in for the input's norm): it takes its name.
    norm.name = node.name
    taken = {n.name for n in model.graph if n.name}
    for n in made:
        if n is norm:
            continue
        base = candidate = n.name or name
        counter = 1
        while candidate in taken:
            candidate, counter = f"{base}_{counter}", counter + 1
        n.name = candidate
        taken.add(candidate)
        for v in n.inputs:
            if v is not None and v.const_value is not None and v.producer() is None and v.name not in model.graph.initializers:
                model.graph.register_initializer(v)
    model.graph.insert_before(node, made)
    out = node.outputs[0]
    for n in made:  # the sums and the output have the fused output's type and shape; the 2-D ones its type
        same_shape = n.op_type == "Add" or n.outputs[0] is normed
        if n.op_type != "Shape":
            n.outputs[0].type = out.type
        if same_shape:
            n.outputs[0].shape = out.shape.copy() if out.shape is not None else None
    for old, new, suffix in ((out, normed, "norm"), (node.outputs[3] if len(node.outputs) > 3 else None, total, "sum")):
        if old is None or not _used(old, model.graph):
            new.name = f"{name}_{suffix}"
            continue
        take_over(old, new)
    detach_and_remove(model, node)


def _small_model(node: ir.Node, candidate: str, opset: int, sum_used: bool) -> tuple[bytes, dict[str, np.ndarray]]:
    """The node alone in the candidate's form, its sum read by an Add as the next residual does
    when the model uses it; data inputs become graph inputs (symbolic dims: 1, then 128)."""
    rng = np.random.default_rng(0)
    roles = _inputs(node)
    graph_inputs: list[ir.Value] = []
    initializers: list[ir.Value] = []
    feeds: dict[str, np.ndarray] = {}
    copies: dict[str, ir.Value | None] = {}
    for role, value in roles.items():
        if value is None:
            copies[role] = None
        elif value.const_value is not None:
            array = value.const_value.numpy()
            copy = ir.Value(name=role, const_value=ir.tensor(array, name=role), type=ir.TensorType(value.const_value.dtype), shape=ir.Shape(array.shape))
            initializers.append(copy)
            copies[role] = copy
        else:
            assert value.shape is not None and value.type is not None
            dims = [d if isinstance(d, int) else (1 if j == 0 else _TUNE_DIM) for j, d in enumerate(value.shape)]
            copy = ir.Value(name=role, type=value.type, shape=ir.Shape(dims))
            graph_inputs.append(copy)
            feeds[role] = rng.standard_normal(dims).astype(value.type.dtype.numpy())
            copies[role] = copy
    if candidate == FUSED:
        ordered = [copies["input"], copies["skip"], copies["gamma"]]
        ordered += [copies["beta"], copies["bias"]] if node.op_type == "SkipLayerNormalization" else [copies["bias"]]
        while ordered and ordered[-1] is None:
            ordered.pop()
        fused = ir.Node(MS_DOMAIN, node.op_type, ordered, [ir.AttrFloat32("epsilon", _epsilon(node))], num_outputs=4, name="fused")
        nodes, total, y = [fused], fused.outputs[3], fused.outputs[0]
    else:
        nodes, total, y, _ = _unfused_nodes(node, copies, "unfused", two_d=candidate == UNFUSED_2D)
        for n in nodes:
            initializers += [v for v in n.inputs if v is not None and v.const_value is not None and v.producer() is None
                             and all(v is not c for c in initializers)]
    if sum_used:
        nodes.append(ir.Node("", "Add", [total, y], name="next_residual"))
        y = nodes[-1].outputs[0]
    y.name = "y"
    y.type = node.outputs[0].type
    graph = ir.Graph(graph_inputs, [y], nodes=nodes, initializers=initializers, opset_imports={"": max(opset, 17), MS_DOMAIN: 1})
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=8))
    return proto.SerializeToString(), feeds


def _unfused_problem(node: ir.Node, target: Any, dtype: str | None, opset: int) -> str | None:
    """Why the unfused form cannot run on the target (None: it can)."""
    domain, op = SKIP_NORMS[node.op_type]
    if opset < 17 and op == "LayerNormalization":
        return f"the model's opset {opset} has no LayerNormalization"
    if any(_used(v, node.graph) for v in node.outputs[1:3] if node.graph is not None):
        return "its mean / inv_std_var outputs are used"
    if target is None:
        return None
    return target.why_not("", "Add", dtype, opset) or target.why_not(domain, op, dtype, opset)


def decide_skip_norms(model: ir.Model, decider: DecisionPoint, target: Any = None, *, stats: Any = None) -> int:
    """Decide every com.microsoft.Skip(Simplified)LayerNormalization a rule made in the main
    graph; returns how many were split back into Add + norm."""
    started = time.perf_counter()
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
    split = 0
    for node in list(model.graph):
        if node.domain != MS_DOMAIN or node.op_type not in SKIP_NORMS or RULE_KEY not in node.metadata_props:
            continue  # a fused op the input had is its own baseline: left as it came
        x = node.inputs[0]
        dtype = dtype_name(x.type.dtype) if x is not None and x.type is not None else None
        roles = _inputs(node)
        sum_used = _used(node.outputs[3] if len(node.outputs) > 3 else None, model.graph)
        shape = list(x.shape) if x is not None and x.shape is not None else None
        site = node.name or node.op_type
        problem = _unfused_problem(node, target, dtype, opset)
        if problem is not None:
            record_ = decider.choose(DECISION, site, [FUSED, UNFUSED], UNFUSED, None, forced=FUSED)
            record_.reason = f"kept fused: the unfused form cannot be used here ({problem})"
            continue
        worlds = norm_worlds(node.op_type, dtype or "?", shape, bias=roles["bias"] is not None, sum_used=sum_used) if shape else None
        buildable = all(v is None or v.const_value is not None or (v.shape is not None and v.type is not None) for v in roles.values())
        build: Any = (lambda candidate, node=node, sum_used=sum_used: _small_model(node, candidate, opset, sum_used)) if buildable else None
        candidates = [FUSED, UNFUSED]
        if node.op_type == "SkipLayerNormalization" and shape is not None and isinstance(shape[-1], int):
            candidates.append(UNFUSED_2D)  # onnxruntime fuses no SimplifiedLayerNormalization back
        chosen = decider.choose(
            DECISION,
            site,
            candidates,
            UNFUSED,
            worlds,
            build=build,
            signature=signature_of(node.op_type, [str(d) for d in shape] if shape else None, dtype, sum_used,
                                   [role for role, v in roles.items() if v is not None], _epsilon(node)),
        ).chosen
        if chosen != FUSED:
            _split_in_place(model, node, two_d=chosen == UNFUSED_2D)
            split += 1
    record(stats, split, started)
    return split
