"""How a weight-quantized MatMul is written into an ONNX graph (graphopt.passes.weight_quant picks one).

* "MatMulNBits": com.microsoft.MatMulNBits (ort-cpu, ort-cuda): packed weights [N, k_blocks, blob],
  scales [N * k_blocks] in the activation's type, packed zero points only when asymmetric.
* "DequantizeLinear": opset >= 21 blocked DequantizeLinear (axis 0, block_size) of a [K, N] int4/uint4/
  int8/uint8 initializer -> MatMul. Standard ops: any runtime with opset 21 loads it.
* "Cast-Mul": before opset 21 (int8 only): Cast(int8 [k_blocks, block, N]) -> (Sub zero point) ->
  Mul(scales [k_blocks, 1, N]) -> Reshape [k_blocks * block, N] -> (Slice [:K]) -> MatMul.

Every form computes y = A @ dequantize(q) (+ bias), dequantize as graphopt.quant.blockwise defines it.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx_ir as ir

from graphopt.quant.blockwise import BlockQuantized, pack, pack_zero_points

__all__ = ["FORMS", "MS_DOMAIN", "emit", "emit_again", "stored_bytes"]

MS_DOMAIN = "com.microsoft"
FORMS = ("MatMulNBits", "DequantizeLinear", "Cast-Mul")

#: A fresh unique name from a hint.
Namer = Callable[[str], str]


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    tensor = ir.Tensor(array, name=name)
    value = ir.Value(name=name, const_value=tensor, type=ir.TensorType(tensor.dtype), shape=ir.Shape(array.shape))
    graph.register_initializer(value)
    return value


def _kn(quantized: BlockQuantized) -> np.ndarray:
    """The quantized values as [K, N] (the padding of the last block dropped)."""
    return quantized.q.reshape(quantized.n, -1)[:, : quantized.k].T.copy()


def stored_bytes(quantized: BlockQuantized) -> int:
    """Bytes of the packed weight, scales and (asymmetric) zero points."""
    weight = quantized.n * quantized.k_blocks * quantized.block_size * quantized.bits // 8
    zero_points = 0 if quantized.symmetric else pack_zero_points(quantized.zero_points, quantized.bits).nbytes
    return weight + quantized.scales.nbytes + zero_points


def emit(form: str, graph: ir.Graph, a: ir.Value, quantized: BlockQuantized, fresh: Namer, accuracy_level: int = 0) -> list[ir.Node]:
    """The nodes computing A @ dequantize(quantized) (initializers registered on `graph`); the last
    node's output is the result."""
    if form == "MatMulNBits":
        return _matmul_nbits(graph, a, quantized, fresh, accuracy_level)
    if form == "DequantizeLinear":
        return _dequantize_linear(graph, a, quantized, fresh)
    if form == "Cast-Mul":
        return _cast_mul(graph, a, quantized, fresh)
    raise ValueError(f"unknown weight form {form!r}")


def emit_again(a: ir.Value, first: list[ir.Node], fresh: Namer) -> list[ir.Node]:
    """Another layer with the weight `first` (what `emit` made) reads: the same initializers (MatMulNBits)
    or the same dequantized weight (the standard forms), so a shared weight is stored once."""
    last = first[-1]
    if last.op_type == "MatMulNBits":
        attrs = [attr for attr in last.attributes.values()]
        return [ir.Node(MS_DOMAIN, "MatMulNBits", [a, *last.inputs[1:]], attrs, name=fresh("MatMulNBits"))]
    return [ir.Node("", "MatMul", [a, last.inputs[1]], name=fresh("MatMul"))]


def _matmul_nbits(graph: ir.Graph, a: ir.Value, quantized: BlockQuantized, fresh: Namer, accuracy_level: int) -> list[ir.Node]:
    bits = quantized.bits
    inputs = [
        a,
        _initializer(graph, fresh("qweight"), pack(quantized.q, bits)),
        _initializer(graph, fresh("scales"), quantized.scales.reshape(-1)),
    ]
    if not quantized.symmetric:  # absent: the kernel's default zero point 2**(bits-1), what symmetric used
        inputs.append(_initializer(graph, fresh("zero_points"), pack_zero_points(quantized.zero_points, bits).reshape(-1)))
    attrs = [
        ir.AttrInt64("K", quantized.k),
        ir.AttrInt64("N", quantized.n),
        ir.AttrInt64("bits", bits),
        ir.AttrInt64("block_size", quantized.block_size),
        ir.AttrInt64("accuracy_level", accuracy_level),
    ]
    return [ir.Node(MS_DOMAIN, "MatMulNBits", inputs, attrs, name=fresh("MatMulNBits"))]


def _dequantize_linear(graph: ir.Graph, a: ir.Value, quantized: BlockQuantized, fresh: Namer) -> list[ir.Node]:
    q = _kn(quantized)
    if quantized.symmetric:  # signed values around 0 and no zero point input (its default is 0)
        signed = q.astype(np.int16) - (1 << (quantized.bits - 1))
        stored = signed.astype(ml_dtypes.int4 if quantized.bits == 4 else np.int8)
        zero_points = None
    else:
        stored = q.astype(ml_dtypes.uint4 if quantized.bits == 4 else np.uint8)
        zp = quantized.zero_points.T.copy()
        zero_points = zp.astype(ml_dtypes.uint4) if quantized.bits == 4 else zp.astype(np.uint8)
    inputs = [_initializer(graph, fresh("qweight"), stored), _initializer(graph, fresh("scales"), quantized.scales.T.copy())]
    if zero_points is not None:
        inputs.append(_initializer(graph, fresh("zero_points"), zero_points))
    attrs = [ir.AttrInt64("axis", 0), ir.AttrInt64("block_size", quantized.block_size)]
    dequantize = ir.Node("", "DequantizeLinear", inputs, attrs, name=fresh("DequantizeLinear"))
    matmul = ir.Node("", "MatMul", [a, dequantize.outputs[0]], name=fresh("MatMul"))
    return [dequantize, matmul]


def _cast_mul(graph: ir.Graph, a: ir.Value, quantized: BlockQuantized, fresh: Namer) -> list[ir.Node]:
    if quantized.bits != 8:
        raise ValueError("the Cast-Mul form stores int8 only")
    n, k_blocks, block = quantized.q.shape
    q = quantized.q.transpose(1, 2, 0)  # [k_blocks, block, N]
    float_type = ir.DataType.from_numpy(quantized.scales.dtype)
    nodes: list[ir.Node] = []
    if quantized.symmetric:
        stored = (q.astype(np.int16) - 128).astype(np.int8)
    else:
        stored = q.astype(np.uint8)
    cast = ir.Node("", "Cast", [_initializer(graph, fresh("qweight"), stored)], [ir.AttrInt64("to", int(float_type))], name=fresh("Cast"))
    nodes.append(cast)
    current = cast.outputs[0]
    if not quantized.symmetric:
        zero_points = quantized.zero_points.T.reshape(k_blocks, 1, n).astype(quantized.scales.dtype)
        sub = ir.Node("", "Sub", [current, _initializer(graph, fresh("zero_points"), zero_points)], name=fresh("Sub"))
        nodes.append(sub)
        current = sub.outputs[0]
    scales = quantized.scales.T.reshape(k_blocks, 1, n).copy()
    mul = ir.Node("", "Mul", [current, _initializer(graph, fresh("scales"), scales)], name=fresh("Mul"))
    shape = _initializer(graph, fresh("shape"), np.array([k_blocks * block, n], dtype=np.int64))
    reshape = ir.Node("", "Reshape", [mul.outputs[0], shape], name=fresh("Reshape"))
    nodes += [mul, reshape]
    current = reshape.outputs[0]
    if quantized.k != k_blocks * block:  # the zero padding of the last block
        starts = _initializer(graph, fresh("starts"), np.array([0], dtype=np.int64))
        ends = _initializer(graph, fresh("ends"), np.array([quantized.k], dtype=np.int64))
        axes = _initializer(graph, fresh("axes"), np.array([0], dtype=np.int64))
        cut = ir.Node("", "Slice", [current, starts, ends, axes], name=fresh("Slice"))
        nodes.append(cut)
        current = cut.outputs[0]
    nodes.append(ir.Node("", "MatMul", [a, current], name=fresh("MatMul")))
    return nodes
