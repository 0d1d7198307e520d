"""Small helpers shared by the passes: walking scopes, op sets, recording stats."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import onnx_ir as ir

from graphopt.ops.registry import has_fact

__all__ = [
    "ONNX_DOMAINS",
    "in_qdq_unit",
    "is_non_deterministic",
    "subgraphs",
    "has_subgraphs",
    "record",
    "as_model",
]

ONNX_DOMAINS = frozenset({"", "ai.onnx"})

def is_non_deterministic(node: ir.Node) -> bool:
    """Its result is not a function of its inputs: never folded, never merged."""
    return has_fact(node.domain, node.op_type, "non_deterministic")


def subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    """The graph-valued attributes of a node (If branches, Loop/Scan bodies)."""
    for attr in node.attributes.values():
        if attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            yield from attr.value


def has_subgraphs(node: ir.Node) -> bool:
    return any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values())


def record(stats: Any, changes: int, started: float) -> None:
    """Add one run to a `graphopt.report.model.PassStats`-like object (runs, changes, time_s)."""
    if stats is None:
        return
    stats.runs += 1
    stats.changes += changes
    stats.time_s += time.perf_counter() - started


def as_model(model_or_view: Any) -> ir.Model:
    """The `ir.Model` itself, or the one an `OnnxView` wraps."""
    return model_or_view if isinstance(model_or_view, ir.Model) else model_or_view.model


def take_over(old: ir.Value, new: ir.Value) -> None:
    """`new` replaces `old` for every reader (graph outputs too) and takes its name, so a split
    of a fused op back into its parts keeps the model's value names."""
    name = old.name
    old.name = f"{name}__fused"
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    new.name = name


def detach_and_remove(model: ir.Model, node: ir.Node) -> None:
    """Remove a node whose outputs nobody reads any more, first letting go of its inputs."""
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    model.graph.remove(node)



def in_qdq_unit(node: ir.Node) -> bool:
    """The op of a QDQ node unit (DequantizeLinear -> op -> QuantizeLinear): it reads a dequantized
    activation, or its output is quantized again. onnxruntime fuses such a unit into QLinearConv,
    QLinearMatMul, ... only as it is, so passes leave its op alone (graphopt/match/qdq.py is the
    rules' side). A DequantizeLinear of a constant (weight-only quantization) makes no unit."""
    for value in node.inputs:
        producer = value.producer() if value is not None else None
        if producer is None or producer.op_type != "DequantizeLinear" or not producer.inputs:
            continue
        data = producer.inputs[0]
        if data is not None and (data.is_graph_input() or (data.const_value is None and not _made_by_constant(data))):
            return True
    return any(user.op_type == "QuantizeLinear" for value in node.outputs for user, _ in value.uses())


def _made_by_constant(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ONNX_DOMAINS
