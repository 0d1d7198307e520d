"""Constant weights that another quantizer left as QuantizeLinear -> DequantizeLinear: stored quantized.

NVIDIA ModelOpt's int8 and fp8 ONNX exports (onnxruntime's quantize_static with
``AddQDQPairToWeight``) keep every weight a float initializer followed by QuantizeLinear ->
DequantizeLinear. The quantized value is a constant: `fold_weight_quantize` computes it once and
stores it in the QuantizeLinear's output type (int8, uint8, int16, uint16, int4, uint4,
float8e4m3fn, ...), so the DequantizeLinear reads a constant, the form onnxruntime.quantization
writes. Constant folding leaves Quantize/DequantizeLinear alone on purpose (`never_folded`: a
folded DequantizeLinear would hide a node unit); this pass folds only the QuantizeLinear, which
keeps the unit, makes graphopt's own QDQ-unit checks see a weight (a DequantizeLinear of a
constant) where they saw an activation, and makes the weights a quarter of their float size.

The value is computed as the ONNX definition says: saturate(round_half_even(x / scale) + zero point)
(float32 division, as onnxruntime's kernel and the ONNX reference evaluator do), per tensor, per
axis or per block; float8 types round to nearest even and saturate to their largest finite value
unless ``saturate=0``. A QuantizeLinear this pass cannot compute exactly (a type it does not know,
a non-constant input, a scale of another shape) stays as it is.
"""

from __future__ import annotations

import time
from typing import Any

import ml_dtypes
import numpy as np
import onnx_ir as ir

from graphopt.passes._common import ONNX_DOMAINS, as_model, record

__all__ = ["fold_weight_quantize", "quantize_constant"]

_INTEGER = {
    ir.DataType.INT8: (np.int8, -128, 127),
    ir.DataType.UINT8: (np.uint8, 0, 255),
    ir.DataType.INT16: (np.int16, -32768, 32767),
    ir.DataType.UINT16: (np.uint16, 0, 65535),
    ir.DataType.INT4: (ml_dtypes.int4, -8, 7),
    ir.DataType.UINT4: (ml_dtypes.uint4, 0, 15),
}
_FLOAT8 = {
    ir.DataType.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    ir.DataType.FLOAT8E5M2: ml_dtypes.float8_e5m2,
}


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def _output_type(node: ir.Node, zero_point: np.ndarray | None) -> ir.DataType | None:
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        zp = node.inputs[2]
        return zp.const_value.dtype if zp.const_value is not None else None
    declared = _attr(node, "output_dtype", 0)
    return ir.DataType(declared) if declared else ir.DataType.UINT8


def _broadcast(param: np.ndarray, x: np.ndarray, axis: int, block_size: int) -> np.ndarray | None:
    """`param` (a scale or zero point) spread over `x`: per tensor, per axis or per block; None when
    its shape fits none of them."""
    if param.size == 1:
        return param.reshape(())
    axis = axis % x.ndim
    if param.ndim == 1 and block_size == 0:
        if param.shape[0] != x.shape[axis]:
            return None
        shape = [1] * x.ndim
        shape[axis] = param.shape[0]
        return param.reshape(shape)
    if block_size > 0 and param.ndim == x.ndim:
        expected = list(x.shape)
        expected[axis] = -(-x.shape[axis] // block_size)
        if list(param.shape) != expected:
            return None
        return np.repeat(param, block_size, axis=axis).take(range(x.shape[axis]), axis=axis)
    return None


def quantize_constant(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, out_type: ir.DataType,
                      axis: int = 1, block_size: int = 0, saturate: bool = True) -> np.ndarray | None:
    """QuantizeLinear of constants as numpy (its output dtype), or None where not computable exactly."""
    if x.dtype != scale.dtype or x.dtype not in (np.float32, np.float16):
        return None
    spread_scale = _broadcast(scale, x, axis, block_size)
    if spread_scale is None:
        return None
    scaled = (x.astype(np.float32) / spread_scale.astype(np.float32)).astype(np.float32)
    if out_type in _INTEGER:
        dtype, low, high = _INTEGER[out_type]
        zp = np.zeros((), np.float32) if zero_point is None else _broadcast(zero_point.astype(np.float32), x, axis, block_size)
        if zp is None:
            return None
        return np.clip(np.rint(scaled) + zp, low, high).astype(dtype)
    if out_type in _FLOAT8:
        if zero_point is not None and np.any(zero_point.astype(np.float32) != 0):
            return None  # a float8 zero point other than 0: not a form any quantizer writes
        dtype = _FLOAT8[out_type]
        if saturate:
            largest = float(ml_dtypes.finfo(dtype).max)
            scaled = np.clip(scaled, -largest, largest)
        return scaled.astype(dtype)
    return None


def _fold(graph: ir.Graph, node: ir.Node) -> bool:
    if node.op_type != "QuantizeLinear" or node.domain not in ONNX_DOMAINS or len(node.inputs) < 2:
        return False
    x, scale = _const(node.inputs[0]), _const(node.inputs[1])
    zp_value = node.inputs[2] if len(node.inputs) > 2 else None
    zero_point = _const(zp_value)
    if x is None or scale is None or (zp_value is not None and zero_point is None):
        return False
    out_type = _output_type(node, zero_point)
    if out_type is None:
        return False
    folded = quantize_constant(x, scale, zero_point, out_type, _attr(node, "axis", 1), _attr(node, "block_size", 0),
                               bool(_attr(node, "saturate", 1)))
    if folded is None:
        return False
    output = node.outputs[0]
    name = output.name or f"{node.name}_quantized"
    tensor = ir.Tensor(folded, name=name)
    if tensor.dtype != out_type:
        return False
    node.outputs[0].name = f"{name}__folded"
    value = ir.Value(name=name, const_value=tensor, type=ir.TensorType(out_type), shape=ir.Shape(folded.shape))
    graph.register_initializer(value)
    output.replace_all_uses_with(value, replace_graph_outputs=True)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    graph.remove(node)
    return True


def fold_weight_quantize(model_or_view: Any, *, stats: Any = None) -> int:
    """Store each QuantizeLinear of constants (main graph) as a constant of its output type; returns
    how many were folded. Float weights no other node reads are dropped by dead-code elimination."""
    started = time.perf_counter()
    graph = as_model(model_or_view).graph
    folded = sum(_fold(graph, node) for node in list(graph))
    record(stats, folded, started)
    return folded
