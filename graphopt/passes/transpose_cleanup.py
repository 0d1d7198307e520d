"""Cleanup after the NHWC rewrite: Transpose pairs cancelled, data-free Transposes as Reshapes, dead nodes removed.

Transposes that meet fold into one permutation (or into nothing when they cancel); a
Transpose that only moves size-1 axes moves no data and becomes a Reshape; the Transposes,
Reshapes and Constants the rewrite left unused go, with the initializers nobody reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphopt.passes.nhwc_graph import _ONNX, _attr, _Builder, _detach_and_remove, _uses, _x
from graphopt.report.sections import LayoutSummary


def _compose(inner: Sequence[int], outer: Sequence[int]) -> list[int]:
    """Transpose(Transpose(x, inner), outer) == Transpose(x, result)."""
    return [int(inner[p]) for p in outer]


def _cancel_transposes(model: ir.Model, b: _Builder) -> None:
    """Fold Transpose(Transpose(x)) into one Transpose of x, or into x when the permutations cancel."""
    graph = model.graph
    for node in list(graph):
        if node.graph is None or node.op_type != "Transpose" or node.domain not in _ONNX:
            continue
        src = node.inputs[0]
        inner = src.producer() if src is not None else None
        if inner is None or inner.op_type != "Transpose" or inner.domain not in _ONNX or inner.graph is not graph:
            continue
        outer_perm, inner_perm = _attr(node, "perm"), _attr(inner, "perm")
        if outer_perm is None or inner_perm is None:
            continue
        perm = _compose(inner_perm, outer_perm)
        base, out = _x(inner), node.outputs[0]
        if perm == list(range(len(perm))):
            if out.is_graph_output():
                if base.is_graph_input() or base.is_graph_output() or base.const_value is not None:
                    continue  # the output's name cannot move onto base: keep the pair
                name = out.name
                out.name = b.fresh(name or "out")
                out.replace_all_uses_with(base, replace_graph_outputs=True)
                base.name = name
            else:
                out.replace_all_uses_with(base)
            _detach_and_remove(graph, [node])
        else:
            node.replace_input_with(0, base)
            node.attributes["perm"] = ir.AttrInt64s("perm", perm)
        if src is not None and not _uses(src) and not src.is_graph_output():
            _detach_and_remove(graph, [inner])


def _transposes_to_reshapes(model: ir.Model, b: _Builder, summary: LayoutSummary) -> None:
    """A Transpose that keeps the order of the axes longer than 1 moves no data: a Reshape."""
    graph = model.graph
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain not in _ONNX:
            continue
        x, perm = node.inputs[0], _attr(node, "perm")
        if x is None or x.shape is None or perm is None:
            continue
        shape = list(x.shape)
        moving = [p for p in perm if not (isinstance(shape[p], int) and shape[p] == 1)]
        if moving != sorted(moving):
            continue
        target = []
        unknown = 0
        for i, p in enumerate(perm):
            dim = shape[p]
            if isinstance(dim, int):
                target.append(dim)
            elif i == p == 0:
                target.append(0)  # Reshape's 0 copies the input's dim 0
            else:
                target.append(-1)
                unknown += 1
        if unknown > 1:
            continue
        shape_value = b.constant(np.array(target, np.int64), "shape")
        reshape = b.node("", "Reshape", [x, shape_value], hint=(node.name or "Transpose") + "_as_reshape")
        out = node.outputs[0]
        reshape.outputs[0].type, reshape.outputs[0].shape = out.type, out.shape
        graph.insert_before(node, reshape)
        name = out.name
        out.name = b.fresh(name or "t")
        out.replace_all_uses_with(reshape.outputs[0], replace_graph_outputs=True)
        reshape.outputs[0].name = name
        _detach_and_remove(graph, [node])
        summary.transposes_as_reshape += 1


def _remove_dead(model: ir.Model) -> None:
    graph = model.graph
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph)):
            if any(_uses(o) or o.is_graph_output() for o in node.outputs):
                continue
            if node.domain in _ONNX and node.op_type in ("Transpose", "Reshape", "Constant"):
                _detach_and_remove(graph, [node])
                changed = True
    used = {v.name for n in ir.traversal.RecursiveGraphIterator(graph) for v in n.inputs if v is not None}
    inputs = {v.name for v in graph.inputs}
    for name, value in list(graph.initializers.items()):
        if name not in used and name not in inputs and not _uses(value) and not value.is_graph_output():
            graph.initializers.pop(name)


