"""Projections of one input packed into one GEMM: x @ Wq, x @ Wk, x @ Wv (or a gated MLP's
x @ Wgate, x @ Wup) with constant weights become x @ [Wq | Wk | Wv], split on the last axis
(views). One GEMM instead of two or three: fewer launches, a wider N for the GEMM kernel,
and x read once. The weights are concatenated at compile time (they are constants once
frozen); the old ones die with their GEMMs.

Bias-free projections only (`aten.mm` / `aten.matmul`, LLaMA-style blocks): the biased
form (addmm, BERT's q/k/v) is PackSdpaProjections' (rules/sdpa.pdll), where the fused
attention takes it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from graphopt.passes.fx_passes import NewConstant, _constant_2d, _fake_call, _transposed_constant

__all__ = ["pack_projections"]

aten = torch.ops.aten
_GEMMS = (aten.mm.default, aten.matmul.default)


def _right_matrix(gm: fx.GraphModule, operand: Any) -> torch.Tensor | None:
    """The GEMM's constant right operand as a [K, N] tensor (a transposed [N, K] weight read as such)."""
    transposed = _transposed_constant(gm, operand)
    if transposed is not None:
        return transposed[1].t()
    return _constant_2d(gm, operand)


def _source(operand: Any) -> str:
    """The weight's parameter name (graphopt.torch_trace), through a transpose."""
    if isinstance(operand, fx.Node) and operand.op == "call_function" and operand.args:
        operand = operand.args[0]
    return str(operand.meta.get("graphopt_source") or operand.target) if isinstance(operand, fx.Node) else "?"


def pack_projections(gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any) -> int:
    """Pack every group of bias-free GEMMs of one input with constant [K, N_i] weights; returns
    how many GEMMs went (a group of three counts two)."""
    graph = gm.graph
    groups: dict[tuple[Any, ...], list[tuple[fx.Node, torch.Tensor]]] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _GEMMS or len(node.args) != 2 or node.kwargs:
            continue
        x, weight = node.args[0], _right_matrix(gm, node.args[1])
        if not isinstance(x, fx.Node) or weight is None:
            continue
        key = (x, node.target, weight.dtype, weight.device, weight.shape[0])
        groups.setdefault(key, []).append((node, weight))
    removed = 0
    for (x, target, *_), members in groups.items():
        if len(members) < 2:
            continue
        first = members[0][0]
        sizes = [int(w.shape[1]) for _, w in members]
        with graph.inserting_before(first):
            packed = new_constant(torch.cat([w for _, w in members], dim=1).contiguous(), "packed_projections")
            packed.meta["graphopt_parts"] = [w for _, w in members]  # their names, for the report (fx_weight_quant)
            packed.meta["graphopt_source"] = "+".join(_source(node.args[1]) for node, _ in members)
            product = graph.call_function(target, (x, packed))
            product.meta["val"] = _fake_call(fake_mode, target, (x.meta["val"], packed.meta["val"]))
            parts = graph.call_function(aten.split_with_sizes.default, (product, sizes, -1))
            parts.meta["val"] = _fake_call(fake_mode, aten.split_with_sizes.default, (product.meta["val"], sizes, -1))
            for i, (node, _) in enumerate(members):
                part = graph.call_function(operator.getitem, (parts, i))
                part.meta["val"] = parts.meta["val"][i]
                node.replace_all_uses_with(part)
        for node, _ in members:
            graph.erase_node(node)
        removed += len(members) - 1
    return removed
