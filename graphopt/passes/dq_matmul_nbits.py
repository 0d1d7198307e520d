"""Weight-only quantized MatMuls another tool wrote as blocked DequantizeLinear, lowered to MatMulNBits.

int4 weight-only exports (NVIDIA ModelOpt's INT4 RTN/AWQ, onnxruntime's MatMulNBitsQuantizer in
QDQ mode, ...) write each weight as an opset-21 blocked DequantizeLinear of a constant (int4 or
uint4, with or without zero point) feeding a MatMul. onnxruntime's own optimizer turns exactly
``DQ(axis 0 of [K, N]) -> MatMul`` into com.microsoft.MatMulNBits, and nothing else: with a
Transpose of a [N, K] weight blocked on axis 1, or a Cast (a float16 dequantized weight made
float32) between the two, it leaves the DequantizeLinear running every inference and a float Gemm.

On the standard `onnx` target the Transpose or Cast is folded into the DequantizeLinear's constants
instead (a [K, N] weight blocked on axis 0, scales in the activation's type): the plain form, which
onnxruntime fuses when it loads the model. On ort-cpu and ort-cuda (where the target's table has
MatMulNBits for the activation's type)
`lower_dequantize_matmuls` writes each such MatMul as MatMulNBits directly, in every one of these
forms: the quantized values, scales and zero points are moved into MatMulNBits' [N, k_blocks,
block] layout (graphopt.quant.blockwise), a Cast's float16 scales become the activation's type
(exact), a pre-quant-scale Mul on the activation (AWQ) stays where it is. MatMulNBits' default
zero point is 2^(bits-1), a signed weight's 0, so a signed weight with no zero point needs none.
Left alone: a DequantizeLinear read by more than the one chain, block sizes other than powers of
two >= 16, a K that is not a whole number of blocks, rank-1 activations, weights of other types
than int4/uint4. It runs after the rule sweeps (attention fusions see the MatMuls).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ops.targets import MS_DOMAIN
from graphopt.passes._common import ONNX_DOMAINS, detach_and_remove, record
from graphopt.passes.weight_quant_forms import emit
from graphopt.quant.blockwise import BlockQuantized

__all__ = ["lower_dequantize_matmuls"]

#: MatMulNBits' accuracy_level per target: what onnxruntime's own DQ -> MatMul fusion writes on the
#: CPU (session.qdq_matmulnbits_accuracy_level, 4) and 0 on CUDA (graphopt.passes.weight_quant).
ACCURACY_LEVEL = {"ort-cpu": 4, "ort-cuda": 0}
#: int4 only: 8-bit MatMulNBits measured slower than the unquantized MatMul at batch 1 on the H100
#: (graphopt/passes/weight_quant_decision.py), so a blocked int8 weight stays as its exporter wrote it
_BITS = {ir.DataType.INT4: (4, True), ir.DataType.UINT4: (4, False)}
_FLOAT_TYPES = {ir.DataType.FLOAT: "f32", ir.DataType.FLOAT16: "f16", ir.DataType.BFLOAT16: "bf16"}


@dataclass
class _Chain:
    """MatMul(a, [Cast|Transpose]*(DequantizeLinear(q, scale, zero point)))."""

    matmul: ir.Node
    dequantize: ir.Node
    between: list[ir.Node]
    transposed: bool


def _single_reader(value: ir.Value) -> bool:
    return len(value.uses()) == 1 and not value.is_graph_output()


def _chain(matmul: ir.Node) -> _Chain | None:
    if matmul.op_type != "MatMul" or matmul.domain not in ONNX_DOMAINS or len(matmul.inputs) != 2:
        return None
    value = matmul.inputs[1]
    between: list[ir.Node] = []
    transposed = False
    while value is not None and _single_reader(value):
        producer = value.producer()
        if producer is None or producer.domain not in ONNX_DOMAINS:
            return None
        if producer.op_type == "DequantizeLinear":
            return _Chain(matmul, producer, between, transposed)
        if producer.op_type == "Transpose" and not transposed:
            perm = producer.attributes.get("perm")
            if perm is None or list(perm.value) != [1, 0]:
                return None
            transposed = True
        elif producer.op_type == "Cast" and not any(n.op_type == "Cast" for n in between):
            pass
        else:
            return None
        between.append(producer)
        value = producer.inputs[0]
    return None


def _const(value: ir.Value | None) -> np.ndarray | None:
    return None if value is None or value.const_value is None else value.const_value.numpy()


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def _block_quantized(chain: _Chain, scale_dtype: np.dtype) -> BlockQuantized | None:
    """The DequantizeLinear's constants in MatMulNBits' layout, or None where it has another form."""
    dq = chain.dequantize
    q_value = dq.inputs[0]
    if q_value is None or q_value.const_value is None or q_value.const_value.dtype not in _BITS:
        return None
    bits, signed = _BITS[q_value.const_value.dtype]
    q, scales = _const(q_value), _const(dq.inputs[1] if len(dq.inputs) > 1 else None)
    zp_value = dq.inputs[2] if len(dq.inputs) > 2 else None
    zero_points = _const(zp_value)
    block = _int_attr(dq, "block_size", 0)
    if q is None or scales is None or q.ndim != 2 or (zp_value is not None and zero_points is None):
        return None
    if block < 16 or block & (block - 1):
        return None
    axis = _int_attr(dq, "axis", 1) % 2
    if axis != (1 if chain.transposed else 0):  # the blocks must run along K
        return None
    q_kn = q.T if chain.transposed else q
    s_kn = scales.T if chain.transposed else scales
    zp_kn = None if zero_points is None else (zero_points.T if chain.transposed else zero_points)
    k, n = q_kn.shape
    if k % block or s_kn.shape != (k // block, n) or (zp_kn is not None and zp_kn.shape != s_kn.shape):
        return None
    offset = 1 << (bits - 1) if signed else 0  # MatMulNBits stores unsigned values
    unsigned = (q_kn.astype(np.int32) + offset).T.reshape(n, k // block, block).astype(np.uint8)
    if zp_kn is None:
        zp = np.full((n, k // block), offset, dtype=np.uint8)
    else:
        zp = (zp_kn.astype(np.int32) + offset).T.astype(np.uint8)
    symmetric = bool(np.all(zp == (1 << (bits - 1))))  # the kernel's default zero point: no input needed
    return BlockQuantized(unsigned, s_kn.T.astype(scale_dtype).copy(), zp, bits, block, k, symmetric)


def _form(chain: _Chain, dtype: str, target: Any) -> str | None:
    """MatMulNBits where the target has it; on the standard target the plain DQ(axis 0) -> MatMul form
    (for a chain with a Transpose or Cast: the form onnxruntime fuses when it loads the model)."""
    if target.name == "onnx":
        return "DequantizeLinear" if chain.between else None
    if target.why_not(MS_DOMAIN, "MatMulNBits", dtype, None) is not None:
        return None
    return "MatMulNBits"


def _lower(model: ir.Model, chain: _Chain, level: int, target: Any, used: set[str]) -> bool:
    a = chain.matmul.inputs[0]
    if a is None or a.type is None or a.dtype not in _FLOAT_TYPES or a.shape is None or len(a.shape) < 2:
        return False
    form = _form(chain, _FLOAT_TYPES[a.dtype], target)
    if form is None:
        return False
    quantized = _block_quantized(chain, a.dtype.numpy())
    if quantized is None:
        return False
    graph = model.graph
    base = chain.matmul.name or "MatMul"

    def fresh(hint: str) -> str:
        name, i = f"{base}_{hint}", 0
        while name in used:
            i += 1
            name = f"{base}_{hint}_{i}"
        used.add(name)
        return name

    made = emit(form, graph, a, quantized, fresh, level)
    old = chain.matmul.outputs[0]
    result = made[-1].outputs[0]
    result.type, result.shape = old.type, old.shape
    graph.insert_before(chain.matmul, made)
    old_name = old.name
    old.replace_all_uses_with(result, replace_graph_outputs=True)
    constants = [v for v in chain.dequantize.inputs if v is not None]
    for node in [chain.matmul, *chain.between, chain.dequantize]:
        detach_and_remove(model, node)
    for value in constants:  # the DequantizeLinear's initializers, now read by nobody
        if value.name is not None and value.name in graph.initializers and not value.uses() and not value.is_graph_output():
            graph.initializers.pop(value.name)
    if old_name:
        result.name = old_name
    return True


def lower_dequantize_matmuls(model: ir.Model, target: Any, *, stats: Any = None) -> int:
    """Write each MatMul of a blocked DequantizeLinear weight (through a Transpose or Cast) as
    com.microsoft.MatMulNBits where `target` has it, on the standard `onnx` target a Transpose or
    Cast between them folded into the DequantizeLinear's constants; returns how many were rewritten."""
    started = time.perf_counter()
    level = ACCURACY_LEVEL.get(target.name, 0 if target.name == "onnx" else None)
    lowered = 0
    if level is not None:
        graph = model.graph
        used = {v.name for node in graph for v in node.outputs if v.name} | set(graph.initializers)
        for node in list(graph):
            chain = _chain(node)
            if chain is not None and _lower(model, chain, level, target, used):
                lowered += 1
        if lowered and MS_DOMAIN not in model.opset_imports:
            model.opset_imports[MS_DOMAIN] = 1
    record(stats, lowered, started)
    return lowered
