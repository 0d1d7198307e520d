"""Projections of one input packed into one GEMM: x @ Wq, x @ Wk, x @ Wv (or a gated MLP's
x @ Wgate, x @ Wup) with constant weights become x @ [Wq | Wk | Wv], split on the last axis
(views). One GEMM instead of two or three: fewer launches, a wider N for the GEMM kernel,
and x read once. The weights are concatenated at compile time (they are constants once
frozen); the old ones die with their GEMMs.

Bias-free projections (`aten.mm` / `aten.matmul`, LLaMA-style blocks) and biased ones with
constant biases (`aten.addmm(b, x, W)`: Qwen2's q/k/v, what PackSdpaProjections in
rules/sdpa.pdll leaves, where no fused attention takes them): x @ [Wq | Wk | Wv] + [bq | bk | bv].
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from graphopt.passes.fx_passes import NewConstant, _constant_2d, _fake_call, _transposed_constant, attr_tensor

__all__ = ["pack_projections"]

aten = torch.ops.aten
_GEMMS = (aten.mm.default, aten.matmul.default)
_BIASED = aten.addmm.default


def _bias(gm: fx.GraphModule, operand: Any, width: int) -> torch.Tensor | None:
    """addmm's constant bias as a [width] tensor (a per-column bias of this projection), else None."""
    if not isinstance(operand, fx.Node) or operand.op != "get_attr":
        return None
    tensor = attr_tensor(gm, str(operand.target))
    return tensor if isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (width,) else None


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
    """Pack every group of GEMMs of one input with constant [K, N_i] weights (bias-free, or each with
    a constant [N_i] bias); returns how many GEMMs went (a group of three counts two)."""
    graph = gm.graph
    groups: dict[tuple[Any, ...], list[tuple[fx.Node, torch.Tensor, torch.Tensor | None]]] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.kwargs:
            continue
        if node.target in _GEMMS and len(node.args) == 2:
            x, weight, bias = node.args[0], _right_matrix(gm, node.args[1]), None
        elif node.target is _BIASED and len(node.args) == 3:
            x, weight = node.args[1], _right_matrix(gm, node.args[2])
            bias = None if weight is None else _bias(gm, node.args[0], int(weight.shape[1]))
            if weight is None or bias is None or bias.dtype != weight.dtype:
                continue
        else:
            continue
        if not isinstance(x, fx.Node) or weight is None:
            continue
        key = (x, node.target, weight.dtype, weight.device, weight.shape[0])
        groups.setdefault(key, []).append((node, weight, bias))
    removed = 0
    for (x, target, *_), members in groups.items():
        if len(members) < 2:
            continue
        first = members[0][0]
        sizes = [int(w.shape[1]) for _, w, _ in members]
        with graph.inserting_before(first):
            packed = new_constant(torch.cat([w for _, w, _ in members], dim=1).contiguous(), "packed_projections")
            packed.meta["graphopt_parts"] = [w for _, w, _ in members]  # their names, for the report (fx_weight_quant)
            packed.meta["graphopt_source"] = "+".join(_source(node.args[-1]) for node, _, _ in members)
            if target is _BIASED:
                biases = new_constant(torch.cat([b for _, _, b in members if b is not None]).contiguous(), "packed_biases")
                args: tuple[Any, ...] = (biases, x, packed)
            else:
                args = (x, packed)
            product = graph.call_function(target, args)
            product.meta["val"] = _fake_call(fake_mode, target, tuple(a.meta["val"] for a in args))
            parts = graph.call_function(aten.split_with_sizes.default, (product, sizes, -1))
            parts.meta["val"] = _fake_call(fake_mode, aten.split_with_sizes.default, (product.meta["val"], sizes, -1))
            for i, (node, _, _) in enumerate(members):
                part = graph.call_function(operator.getitem, (parts, i))
                part.meta["val"] = parts.meta["val"][i]
                node.replace_all_uses_with(part)
        for node, _, _ in members:
            graph.erase_node(node)
        removed += len(members) - 1
    return removed
