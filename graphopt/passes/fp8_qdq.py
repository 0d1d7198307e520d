"""FP8 QDQ models (NVIDIA ModelOpt's fp8 ONNX export) on onnxruntime targets: what can be done, and a guard.

ModelOpt's FP8 form is float8e4m3fn QuantizeLinear -> DequantizeLinear on the weights and on the
activations of MatMul/Gemm/Conv (opset 19+). No onnxruntime provider has a kernel that computes
with float8 operands there (graphopt.quant.fp8_onnx: MatMul/Gemm take no float8 type; the CUDA
provider's GemmFloat8 scales whole tensors and wants another form), so the Q/DQ stay and the ops
run in float. On ort-cpu and ort-cuda this pass does two things, both exact:

* a weight's DequantizeLinear of a float8 constant is folded to the float values it computes
  (onnxruntime folds the weight's QuantizeLinear itself, then dequantizes the weight every run);
* Relu -> QuantizeLinear(float8, zero point 0) becomes QuantizeLinear -> DequantizeLinear -> Relu.
  onnxruntime 1.32's ReluQuantFusion (ENABLE_EXTENDED and above) drops a Relu feeding a
  QuantizeLinear whose zero point is the lowest value of its type -- right for uint8 0 or int8
  -128, wrong for float8, whose 0 is in the middle: the negative values pass and the outputs
  change (a ModelOpt-style fp8 MLP: max error 4.6 against 5.3 of output magnitude). Float8
  quantization with a zero point of 0 and a positive scale is odd and monotone, so
  DQ(Q(Relu(x))) = Relu(DQ(Q(x))): the Relu moves after every DequantizeLinear of that Q.

Float8 Q/DQ of activations stay (they are the model's numerics); `fp8_note` says why in the report.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.passes._common import ONNX_DOMAINS, detach_and_remove, record

__all__ = ["fp8_note", "guard_fp8_qdq"]

_FLOAT8 = frozenset({ir.DataType.FLOAT8E4M3FN, ir.DataType.FLOAT8E4M3FNUZ, ir.DataType.FLOAT8E5M2, ir.DataType.FLOAT8E5M2FNUZ})


def _is(node: ir.Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain in ONNX_DOMAINS


def _quantized_type(q: ir.Node) -> ir.DataType | None:
    out = q.outputs[0]
    if out.type is not None:
        return out.dtype
    zp = q.inputs[2] if len(q.inputs) > 2 else None
    return zp.const_value.dtype if zp is not None and zp.const_value is not None else None


def _zero_and_positive(q: ir.Node) -> bool:
    """The float8 QuantizeLinear's zero point is 0 (or absent) and its scales are constant and > 0."""
    scale = q.inputs[1] if len(q.inputs) > 1 else None
    if scale is None or scale.const_value is None or not np.all(scale.const_value.numpy().astype(np.float32) > 0):
        return False
    zp = q.inputs[2] if len(q.inputs) > 2 else None
    if zp is None:
        return True
    return zp.const_value is not None and bool(np.all(zp.const_value.numpy().astype(np.float32) == 0))


def _fold_weight_dequantize(model: ir.Model, dq: ir.Node) -> bool:
    data = dq.inputs[0] if dq.inputs else None
    if data is None or data.const_value is None or data.const_value.dtype not in _FLOAT8:
        return False
    scale = dq.inputs[1] if len(dq.inputs) > 1 else None
    zp = dq.inputs[2] if len(dq.inputs) > 2 else None
    if scale is None or scale.const_value is None or (zp is not None and zp.const_value is not None
                                                      and np.any(zp.const_value.numpy().astype(np.float32) != 0)):
        return False
    if zp is not None and zp.const_value is None:
        return False
    x = data.const_value.numpy().astype(np.float32)
    s = scale.const_value.numpy()
    if s.size != 1:
        axis = int(dq.attributes["axis"].value) if "axis" in dq.attributes else 1
        if s.ndim != 1 or "block_size" in dq.attributes and int(dq.attributes["block_size"].value) > 0:
            return False
        shape = [1] * x.ndim
        shape[axis % x.ndim] = s.shape[0]
        s = s.reshape(shape)
    value = (x * s.astype(np.float32)).astype(s.dtype)
    out = dq.outputs[0]
    name = out.name or f"{dq.name}_dequantized"
    out.name = f"{name}__fp8"
    folded = ir.Value(name=name, const_value=ir.Tensor(value, name=name), type=ir.TensorType(ir.DataType.from_numpy(value.dtype)),
                      shape=ir.Shape(value.shape))
    model.graph.register_initializer(folded)
    out.replace_all_uses_with(folded, replace_graph_outputs=True)
    constants = [v for v in dq.inputs if v is not None]
    detach_and_remove(model, dq)
    for v in constants:
        if v.name is not None and v.name in model.graph.initializers and not v.uses() and not v.is_graph_output():
            model.graph.initializers.pop(v.name)
    return True


def _move_relu(model: ir.Model, relu: ir.Node) -> bool:
    out = relu.outputs[0]
    users = [user for user, _ in out.uses()]
    if out.is_graph_output() or len(users) != 1 or not _is(users[0], "QuantizeLinear"):
        return False
    q = users[0]
    if _quantized_type(q) not in _FLOAT8 or not _zero_and_positive(q):
        return False
    dqs = [user for user, _ in q.outputs[0].uses()]
    if q.outputs[0].is_graph_output() or not dqs or not all(_is(dq, "DequantizeLinear") for dq in dqs):
        return False
    q.replace_input_with(0, relu.inputs[0])
    for i, dq in enumerate(dqs):
        dq_out = dq.outputs[0]
        readers = list(dq_out.uses())
        moved = ir.Node("", "Relu", [dq_out], name=f"{relu.name or 'Relu'}_after_dq{'' if i == 0 else f'_{i}'}")
        moved.outputs[0].type, moved.outputs[0].shape = dq_out.type, dq_out.shape
        model.graph.insert_after(dq, moved)
        for user, index in readers:
            user.replace_input_with(index, moved.outputs[0])
        outputs = model.graph.outputs
        for j, output in enumerate(outputs):
            if output is dq_out:  # the graph output keeps its name: now Relu's
                name = dq_out.name
                dq_out.name = f"{name}__before_relu"
                moved.outputs[0].name = name
                outputs[j] = moved.outputs[0]
    detach_and_remove(model, relu)
    return True


def guard_fp8_qdq(model: ir.Model, target: Any, *, stats: Any = None) -> int:
    """On ort-cpu / ort-cuda: fold float8 weight dequantization, move Relu after float8 Q -> DQ.
    Returns the changes made."""
    started = time.perf_counter()
    changed = 0
    if target.name in ("ort-cpu", "ort-cuda"):
        for node in list(model.graph):
            if _is(node, "DequantizeLinear"):
                changed += _fold_weight_dequantize(model, node)
        for node in list(model.graph):
            if _is(node, "Relu"):
                changed += _move_relu(model, node)
    record(stats, changed, started)
    return changed


def fp8_note(model: ir.Model, target_name: str) -> str | None:
    """The report's line on a model with float8 Quantize/DequantizeLinear: why they stay; None without any."""
    has_fp8 = any(_is(n, "QuantizeLinear") and _quantized_type(n) in _FLOAT8 for n in model.graph)
    if not has_fp8:
        return None
    from graphopt.quant.fp8_onnx import fp8_refusal

    reason = fp8_refusal(target_name).split(": ", 1)[-1].split("; ")[0]
    return (f"float8 QuantizeLinear/DequantizeLinear kept as they are, the ops between them run in float: {reason}"
            + ("; float8 weights stored dequantized, Relu moved after the float8 Q/DQ (onnxruntime's ReluQuantFusion "
               "would drop it)" if target_name in ("ort-cpu", "ort-cuda") else ""))
