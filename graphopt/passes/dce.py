"""Dead-code elimination over the main graph, subgraphs and function bodies.

Why not only onnx-ir's RemoveUnusedNodesPass: when it removes a dead If/Loop, the
nodes inside its bodies stay registered as users of the outer values they read, so
those outer producers are never seen as dead (not even on a second run); it also
leaves dead subgraph initializers. This pass detaches the bodies of a removed node,
removes dead initializers in every graph, and then uses onnx-ir's
RemoveUnusedFunctionsPass (which walks subgraphs and nested calls) for functions.

Node contents are never changed: unused optional outputs stay declared.
"""

from __future__ import annotations

import time
from typing import Any

import onnx_ir as ir

from graphopt.ir.onnx_view import OnnxView
from graphopt.passes._common import as_model, record, subgraphs

__all__ = ["eliminate_dead_code"]


def eliminate_dead_code(model: ir.Model | OnnxView, *, remove_functions: bool = True, stats: Any = None) -> int:
    """Remove nodes, initializers (and unused model-local functions) that no graph
    output depends on; returns how many were removed. Graph inputs, graph outputs and
    their producers always stay."""
    started = time.perf_counter()
    model = as_model(model)
    removed = _sweep(model.graph, legacy_weight_inputs=(model.ir_version or 0) < 4)
    for function in model.functions.values():
        removed += _sweep(function)
    if remove_functions and model.functions:  # none: nothing to remove, and onnx-ir's passes (~6 ms) stay unimported
        from onnx_ir.passes.common import RemoveUnusedFunctionsPass

        before = len(model.functions)
        RemoveUnusedFunctionsPass()(model)
        removed += before - len(model.functions)
    record(stats, removed, started)
    return removed


def _sweep(scope: ir.Graph | ir.Function, legacy_weight_inputs: bool = False) -> int:
    """One reverse pass: users come after producers, so a node is seen only after every
    node that could use it (bodies of surviving nodes are swept before what precedes
    them, so outer values they stop reading die in the same pass)."""
    removed = 0
    for node in reversed(list(scope)):
        if any(out.uses() or out.is_graph_output() for out in node.outputs):
            for graph in subgraphs(node):
                removed += _sweep(graph, legacy_weight_inputs)
            continue
        removed += 1 + _detach_bodies(node)
        scope.remove(node, safe=True)
    if isinstance(scope, ir.Graph):
        removed += _remove_dead_initializers(scope, legacy_weight_inputs)
    return removed


def _detach_bodies(node: ir.Node) -> int:
    """Drop the uses that a removed node's bodies hold on outer values; returns nodes dropped."""
    count = 0
    for graph in subgraphs(node):
        for inner in reversed(list(graph)):
            count += 1 + _detach_bodies(inner)
            graph.remove(inner, safe=False)
            for i in range(len(inner.inputs)):
                inner.replace_input_with(i, None)
    return count


def _remove_dead_initializers(graph: ir.Graph, legacy_weight_inputs: bool = False) -> int:
    """Unused initializers go. An initializer listed among the inputs stays (a caller may
    feed it) — except before IR version 4, where every weight had to be listed there:
    then the dead weight and its input entry go together."""
    dead = [
        value
        for value in graph.initializers.values()
        if not value.uses() and not value.is_graph_output() and (legacy_weight_inputs or not value.is_graph_input())
    ]
    dead_inputs = {id(v) for v in dead if v.is_graph_input()}
    if dead_inputs:
        kept = [v for v in graph.inputs if id(v) not in dead_inputs]
        graph.inputs.clear()
        graph.inputs.extend(kept)
    for value in dead:
        if value.name is not None:
            graph.initializers.pop(value.name)
    return len(dead)
