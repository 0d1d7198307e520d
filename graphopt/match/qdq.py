"""Which matches would hide a QDQ node unit from onnxruntime's quantized fusions.

A quantized model in QDQ form (onnxruntime.quantization, torch.ao, TensorRT-style
exports) marks each quantized op as a node unit: DequantizeLinear on its inputs ->
the op -> QuantizeLinear on its output. onnxruntime's QDQ transformers turn a unit into
QLinearConv, QLinearMatMul, QLinearAdd, QGemm, ... only when the op between the Q/DQ is
the float op they expect. A rule that replaces that op (Conv + Relu -> FusedConv, where
the unit is DQ -> Conv -> Relu -> Q) leaves a unit no selector knows, and the model runs
dequantized in float32. So the driver refuses a rewrite that takes such an op, unless the
rule matches the Q/DQ nodes themselves (a rule written for QDQ units).

A weight-only DequantizeLinear (of a constant, with no QuantizeLinear after the op: int4
weights for MatMulNBits) makes no unit here: fusions around it (attention over the
projections) keep onnxruntime's DQ -> MatMul -> MatMulNBits fusion.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from graphopt.ir.view import GraphView

__all__ = ["qdq_unit_problem"]

_QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")


def _is(view: GraphView, node: Any, op_type: str) -> bool:
    domain, op = view.op_key(node)
    return op == op_type and domain in _QDQ_DOMAINS


def _reads_dequantized_activation(view: GraphView, node: Any) -> bool:
    for value in view.inputs(node):
        producer = view.producer(value) if value is not None else None
        if producer is None or not _is(view, producer, "DequantizeLinear"):
            continue
        data = next(iter(view.inputs(producer)), None)
        if data is not None and not view.is_const(data):
            return True
    return False


def _is_quantized_after(view: GraphView, node: Any) -> bool:
    return any(_is(view, user, "QuantizeLinear") for value in view.outputs(node) for user in view.users(value))


def qdq_unit_problem(view: GraphView, matched: Iterable[Any]) -> str | None:
    """Why a rewrite of the `matched` nodes would break a QDQ node unit, or None."""
    nodes = list(matched)
    if any(_is(view, n, "QuantizeLinear") or _is(view, n, "DequantizeLinear") for n in nodes):
        return None
    for node in nodes:
        if _reads_dequantized_activation(view, node) or _is_quantized_after(view, node):
            return (f"{view.label(node)} is the op of a QDQ node unit (DequantizeLinear -> op -> QuantizeLinear): "
                    "onnxruntime fuses the unit into a quantized kernel only as it is")
    return None
