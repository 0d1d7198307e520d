"""Passes over FX graphs of ATen ops that are not single patterns (the torch backend's
counterparts of graphopt/passes/ for ONNX): constant folding, the channels-last
layout around convolutions, and two small normalizations that let the canonical
rules see what ONNX graphs show (``rsqrt`` as ``Reciprocal(Sqrt)``), undone after the
rules ran where nothing used them.

Every pass edits the graph in place, keeps ``node.meta["val"]`` (fake tensors) on the
nodes it makes, and returns how many changes it made.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from graphopt.ir.fx_view import is_neutral

__all__ = [
    "fold_constants",
    "split_rsqrt",
    "merge_rsqrt",
    "drop_clones",
    "views_to_reshapes",
    "to_channels_last",
    "remove_dead_code",
    "attr_tensor",
]

aten = torch.ops.aten

# Never folded: uninitialized memory, and ops whose result is not a function of their inputs.
_NEVER_FOLD_NAMES = ("empty", "new_empty", "rand", "normal", "bernoulli", "dropout", "native_dropout", "uniform", "multinomial")

NewConstant = Callable[[torch.Tensor, str], fx.Node]


def attr_tensor(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _foldable(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or is_neutral(node) or not isinstance(target, torch._ops.OpOverload):
        return False
    if node.is_impure() or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    name = target._schema.name.split("::")[-1]
    return not name.startswith(_NEVER_FOLD_NAMES)


def _bytes(val: Any) -> int | None:
    if not isinstance(val, torch.Tensor):
        return None
    numel = 1
    for d in val.shape:
        if not isinstance(d, int):
            return None  # symbolic: not a constant size
        numel *= d
    return numel * val.element_size()


def fold_constants(gm: fx.GraphModule, new_constant: NewConstant, size_limit_bytes: int = 1 << 20) -> int:
    """Evaluate nodes whose inputs are all constants (get_attr tensors) into new constants.

    A fold may make a constant of at most `size_limit_bytes`, unless it is no larger than
    the constants that die with it (a Cast or transpose of a weight read once)."""
    graph = gm.graph
    values: dict[fx.Node, torch.Tensor] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            tensor = attr_tensor(gm, str(node.target))
            if isinstance(tensor, torch.Tensor):
                values[node] = tensor
    folded = 0
    for node in list(graph.nodes):
        if not _foldable(node) or not all(n in values for n in node.all_input_nodes):
            continue
        out_bytes = _bytes(node.meta.get("val"))
        if out_bytes is None:
            continue
        dying = sum(_bytes(n.meta.get("val")) or 0 for n in node.all_input_nodes if len(n.users) == 1)
        if out_bytes > size_limit_bytes and out_bytes > dying:
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
        try:
            with torch.no_grad():
                result = node.target(*args, **kwargs)  # type: ignore[operator]
        except Exception:  # an op that cannot run on these constants stays in the graph
            continue
        if not isinstance(result, torch.Tensor):
            continue
        with graph.inserting_before(node):
            constant = new_constant(result, node.name)
        node.replace_all_uses_with(constant)
        graph.erase_node(node)
        values[constant] = result
        folded += 1
    return folded


def drop_clones(gm: fx.GraphModule) -> int:
    """clone(x) -> x. After functionalization nothing writes to a clone, so it only copies
    (`.contiguous()` on a transposed tensor): it would hide the ops around it from the rules.
    Clones that feed the graph's outputs stay, so no output aliases an input."""
    changed = 0
    returned: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "output":
            fx.node.map_arg(node.args, returned.add)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.clone.default and node not in returned and isinstance(node.args[0], fx.Node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            changed += 1
    if changed:  # strides downstream may differ now: a view may have to copy
        views_to_reshapes(gm)
    return changed


def split_rsqrt(gm: fx.GraphModule) -> int:
    """rsqrt(x) -> reciprocal(sqrt(x)), the form ONNX graphs (and the RMSNorm rules) have."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.rsqrt.default:
            with gm.graph.inserting_before(node):
                root = gm.graph.call_function(aten.sqrt.default, (node.args[0],))
                inverse = gm.graph.call_function(aten.reciprocal.default, (root,))
            root.meta["val"] = inverse.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(inverse)
            gm.graph.erase_node(node)
            changed += 1
    return changed


def merge_rsqrt(gm: fx.GraphModule) -> int:
    """reciprocal(sqrt(x)) with the sqrt read once -> rsqrt(x) (what split_rsqrt left unused)."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.reciprocal.default:
            continue
        root = node.args[0]
        if isinstance(root, fx.Node) and root.target is aten.sqrt.default and len(root.users) == 1:
            with gm.graph.inserting_before(node):
                merged = gm.graph.call_function(aten.rsqrt.default, (root.args[0],))
            merged.meta["val"] = node.meta.get("val")
            node.replace_all_uses_with(merged)
            gm.graph.erase_node(node)
            gm.graph.erase_node(root)
            changed += 1
    return changed


def views_to_reshapes(gm: fx.GraphModule) -> int:
    """aten.view -> aten.reshape. Rewrites may hand a view a tensor with other strides (a
    permuted attention output, a channels-last feature map); reshape is a view whenever the
    strides allow it and a copy otherwise (what inductor's freezing does too)."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (aten.view.default, aten._unsafe_view.default):
            node.target = aten.reshape.default
            changed += 1
    return changed


def to_channels_last(gm: fx.GraphModule, new_constant: NewConstant) -> int:
    """2-D convolutions in channels-last (NHWC) memory format: constant weights are stored
    channels-last, and each input is made channels-last (a no-op at run time when its
    producer already was one: convolutions and pointwise ops keep the format)."""
    graph = gm.graph
    changed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        x, w = node.args[0], node.args[1]
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() != 4 or node.args[6]:  # 2-D, not transposed
            continue
        if isinstance(w, fx.Node) and w.op == "get_attr":
            weight = attr_tensor(gm, str(w.target))
            if isinstance(weight, torch.Tensor) and not weight.is_contiguous(memory_format=torch.channels_last):
                with graph.inserting_before(node):
                    w_cl = new_constant(weight.contiguous(memory_format=torch.channels_last), f"{w.name}_nhwc")
                node.replace_input_with(w, w_cl)
        if isinstance(x, fx.Node) and not (x.target is aten.contiguous.default and x.kwargs.get("memory_format") == torch.channels_last):
            with graph.inserting_before(node):
                x_cl = graph.call_function(aten.contiguous.default, (x,), {"memory_format": torch.channels_last})
            x_val = x.meta.get("val")
            x_cl.meta["val"] = x_val.contiguous(memory_format=torch.channels_last) if isinstance(x_val, torch.Tensor) else x_val
            node.replace_input_with(x, x_cl)
        changed += 1
    return changed


def remove_dead_code(gm: fx.GraphModule) -> int:
    """Erase pure nodes nobody reads, then the constants nothing reads any more."""
    graph = gm.graph
    before = len(graph.nodes)
    for node in list(graph.nodes):  # getitems of erased tuples first, so their producers can go too
        if node.op == "call_function" and node.target is operator.getitem and not node.users:
            graph.erase_node(node)
    # Random ops nobody reads go too (SDPA is tagged random for its dropout, even at p = 0).
    graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure(impure_random=False))
    used = {str(n.target) for n in graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_buffers(recurse=False)):
        if name.startswith(("_go_", "_frozen_")) and name not in used:
            delattr(gm, name)
    return before - len(graph.nodes)
