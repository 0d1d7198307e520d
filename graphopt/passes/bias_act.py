"""A GEMM's bias in the activation or in the GEMM: a decision, per node (ort-cpu, ort-cuda).

The rule FuseBiasGelu moves the bias Add after a MatMul into the GELU that reads it
(com.microsoft.BiasGelu, or FastGelu's bias input for the tanh form). onnxruntime's own
optimizer does the opposite where the Add follows a MatMul: its MatMulAddFusion (level 1) folds
the Add into a Gemm before its BiasGeluFusion (level 2) could fuse it into the activation. Which
is faster is a property of the provider and the shape, not of the rule: on the CPU provider
(2-core EPYC, one thread) ConvNeXt's MLP ran MatMul 111.5 + BiasGelu 141 us against Gemm ~115 +
Gelu 97 us, so the whole model was 1.05x its original. So for every such node a rule made, this
pass decides (graphopt.decisions) after lowering:

* The baseline is the model as graphopt had it before the fusion: MatMul -> Add(bias) -> the
  activation alone (com.microsoft.Gelu, or FastGelu without a bias), which onnxruntime turns into
  Gemm + activation as it does for the original.
* `fused` (the rule's form) stays where the cost table (benchmarks/ort_bias_act.py, per row and N
  bucket) predicts it faster by more than the noise margin for every row count the model allows,
  or where `--tune` measures it faster on the provider.

Only nodes whose input is a MatMul's (constant 2-D weight, no other reader) are decided: elsewhere
onnxruntime has no Gemm to fold the bias into and fuses the Add into the activation itself.

The shipped entries (2026-11-28): on the CPU provider (a 2-core EPYC at 1 and 2 threads, a Xeon at
4) the fused form wins only for 1-4 rows with N <= 512 (and the tanh form at 5-48 rows, N > 3072),
so MLPs at sequence or image sizes get Gemm + activation; on the CUDA provider (H200, f32 and f16)
the fused form wins in every class (0.52-0.92x: onnxruntime's CUDA Gemm copies the bias into its
output before the GEMM, one more kernel), so it stays.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.decisions import DecisionPoint, signature_of
from graphopt.decisions.shapes import bias_act_worlds
from graphopt.ir.onnx_view import dtype_name
from graphopt.ir.provenance import RULE_KEY
from graphopt.ops.targets import MS_DOMAIN
from graphopt.passes._common import detach_and_remove, record, take_over

__all__ = ["decide_bias_activations", "FUSED", "UNFUSED", "DECISION", "BIAS_ACTIVATIONS"]

DECISION = "bias_act"
FUSED = "fused"
UNFUSED = "unfused"
#: the fused op -> its activation without the bias (both com.microsoft)
BIAS_ACTIVATIONS: dict[str, str] = {"BiasGelu": "Gelu", "FastGelu": "FastGelu"}
#: A symbolic dimension of a timed model gets this size (the first: 1).
_TUNE_DIM = 128


def _gemm_site(node: ir.Node, graph: ir.Graph) -> ir.Node | None:
    """The MatMul whose output is this bias activation's input, if onnxruntime could fold the
    bias into it (a constant 2-D weight, a constant 1-D bias, nobody else reading the product)."""
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    x, bias = node.inputs[0], node.inputs[1]
    producer = x.producer()
    if producer is None or producer.domain not in ("", "ai.onnx") or producer.op_type != "MatMul":
        return None
    weight = producer.inputs[1] if len(producer.inputs) > 1 else None
    if weight is None or weight.const_value is None or len(weight.const_value.shape) != 2:
        return None
    if bias.const_value is None or len(bias.const_value.shape) != 1:
        return None
    if len(x.uses()) != 1 or x in graph.outputs:
        return None
    return producer


def _unfused_nodes(node: ir.Node, x: ir.Value, bias: ir.Value, name: str) -> list[ir.Node]:
    add = ir.Node("", "Add", [x, bias], name=f"{name}_bias")
    act = ir.Node(MS_DOMAIN, BIAS_ACTIVATIONS[node.op_type], [add.outputs[0]], name=name)
    return [add, act]


def _split_in_place(model: ir.Model, node: ir.Node) -> None:
    name = node.name or node.op_type
    x, bias = node.inputs[0], node.inputs[1]
    assert x is not None and bias is not None
    made = _unfused_nodes(node, x, bias, name)
    taken = {n.name for n in model.graph if n.name}
    add = made[0]
    base = candidate = add.name or name
    counter = 1
    while candidate in taken:
        candidate, counter = f"{base}_{counter}", counter + 1
    add.name = candidate
    model.graph.insert_before(node, made)
    out = node.outputs[0]
    for n in made:
        n.outputs[0].type = out.type
        n.outputs[0].shape = out.shape.copy() if out.shape is not None else None
    add.outputs[0].name = f"{name}_biased"
    take_over(out, made[1].outputs[0])
    detach_and_remove(model, node)


def _small_model(node: ir.Node, matmul: ir.Node, candidate: str, opset: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """The MatMul and the activation alone in the candidate's form (symbolic dims: 1, then 128)."""
    a = matmul.inputs[0]
    assert a is not None and a.shape is not None and a.type is not None
    weight, bias = matmul.inputs[1], node.inputs[1]
    assert weight is not None and weight.const_value is not None and bias is not None and bias.const_value is not None
    dims = [d if isinstance(d, int) else (1 if j == 0 else _TUNE_DIM) for j, d in enumerate(a.shape)]
    x = ir.Value(name="x", type=a.type, shape=ir.Shape(dims))
    w = ir.Value(name="w", const_value=ir.tensor(weight.const_value.numpy(), name="w"))
    b = ir.Value(name="bias", const_value=ir.tensor(bias.const_value.numpy(), name="bias"))
    mm = ir.Node("", "MatMul", [x, w], name="matmul")
    if candidate == FUSED:
        nodes = [mm, ir.Node(MS_DOMAIN, node.op_type, [mm.outputs[0], b], name="act")]
    else:
        nodes = [mm, *_unfused_nodes(node, mm.outputs[0], b, "act")]
    y = nodes[-1].outputs[0]
    y.name, y.type = "y", node.outputs[0].type
    graph = ir.Graph([x], [y], nodes=nodes, initializers=[w, b], opset_imports={"": max(opset, 13), MS_DOMAIN: 1})
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=8))
    rng = np.random.default_rng(0)
    return proto.SerializeToString(), {"x": rng.standard_normal(dims).astype(a.type.dtype.numpy())}


def decide_bias_activations(model: ir.Model, decider: DecisionPoint, target: Any = None, *, stats: Any = None) -> int:
    """Decide every com.microsoft.BiasGelu / FastGelu-with-bias a rule made after a MatMul in the
    main graph; returns how many were split back into Add + activation."""
    started = time.perf_counter()
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 17))
    split = 0
    for node in list(model.graph):
        if node.domain != MS_DOMAIN or node.op_type not in BIAS_ACTIVATIONS or RULE_KEY not in node.metadata_props:
            continue  # a fused op the input had is its own baseline: left as it came
        matmul = _gemm_site(node, model.graph)
        if matmul is None:
            continue  # no Gemm for onnxruntime to fold the bias into: the fused op is its own best form
        x = node.inputs[0]
        assert x is not None
        dtype = dtype_name(x.type.dtype) if x.type is not None else None
        site = node.name or node.op_type
        problem = None if target is None else (
            target.why_not("", "Add", dtype, opset) or target.why_not(MS_DOMAIN, BIAS_ACTIVATIONS[node.op_type], dtype, opset))
        if problem is not None:
            kept = decider.choose(DECISION, site, [FUSED, UNFUSED], UNFUSED, None, forced=FUSED)
            kept.reason = f"kept fused: the unfused form cannot be used here ({problem})"
            continue
        shape = list(x.shape) if x.shape is not None else None
        worlds = bias_act_worlds(node.op_type, dtype or "?", shape) if shape else None
        a = matmul.inputs[0]
        buildable = a is not None and a.shape is not None and a.type is not None
        build: Any = (lambda candidate, node=node, matmul=matmul: _small_model(node, matmul, candidate, opset)) if buildable else None
        weight = matmul.inputs[1]
        assert weight is not None and weight.const_value is not None
        chosen = decider.choose(
            DECISION, site, [FUSED, UNFUSED], UNFUSED, worlds, build=build,
            signature=signature_of(node.op_type, [str(d) for d in shape] if shape else None, dtype, list(weight.const_value.shape)),
        ).chosen
        if chosen != FUSED:
            _split_in_place(model, node)
            split += 1
    record(stats, split, started)
    return split
