"""Writes into graph inputs, put back in place (the torch backend without inductor).

Functionalization (graphopt.torch_trace) turns a model's in-place write into an input, a
static KV cache's ``k_cache.index_copy_(2, cache_position, k)``, into a functional op that
makes a new tensor, ``new = index_copy(k_cache, 2, pos, k)``, read by the rest of the
graph, and a ``copy_(k_cache, new)`` at the graph's end. Run as it is, that copies the
whole cache twice per step for a one-token write (a decode step at the memory-bandwidth
limit reads the cache once). Inductor re-inplaces such graphs itself; without inductor
`reinplace_input_writes` does: the functional op becomes its in-place form on the input
at the same place in the graph, its readers read the input, and the trailing copy_ goes.

Only where the input is read by nothing else (no reader of the old value can then see the
new one) and the write covers the input itself (not a view of it).
"""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["reinplace_input_writes", "written_inputs", "INPLACE_FORMS"]

aten = torch.ops.aten

#: functional op -> its in-place form, same arguments (the first is the tensor written).
INPLACE_FORMS = {
    aten.index_copy.default: aten.index_copy_.default,
    aten.index_put.default: aten.index_put_.default,
}


def _trailing_copies(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is aten.copy_.default
            and isinstance(n.args[0], fx.Node) and n.args[0].op == "placeholder"]


def reinplace_input_writes(gm: fx.GraphModule) -> int:
    """copy_(x, index_copy(x, ...)) with x an input read by nothing else -> index_copy_(x, ...)
    where the index_copy was. Returns how many writes went in place."""
    graph = gm.graph
    changed = 0
    for copy in _trailing_copies(graph):
        target, written = copy.args[0], copy.args[1]
        if not isinstance(written, fx.Node) or written.op != "call_function":
            continue
        inplace = INPLACE_FORMS.get(written.target)  # type: ignore[call-overload]
        if inplace is None or written.args[0] is not target or copy.kwargs:
            continue
        # No other reader of x: none can observe the write happening earlier than the copy_ did.
        if set(target.users) != {written, copy}:  # type: ignore[union-attr]
            continue
        val, out = target.meta.get("val"), written.meta.get("val")  # type: ignore[union-attr]
        if not (isinstance(val, torch.Tensor) and isinstance(out, torch.Tensor) and val.shape == out.shape and val.dtype == out.dtype):
            continue
        with graph.inserting_before(written):
            node = graph.call_function(inplace, written.args, written.kwargs)
        node.meta.update(written.meta)
        node.meta["val"] = val
        # Its readers read what the in-place op returns (the input itself): the order stays explicit.
        written.replace_all_uses_with(node)
        copy.replace_all_uses_with(node)
        graph.erase_node(copy)
        graph.erase_node(written)
        changed += 1
    if changed:
        graph.lint()
        gm.recompile()
    return changed


def written_inputs(gm: fx.GraphModule) -> frozenset[int]:
    """Positions of the graph inputs some op writes to (in place or through a trailing copy_)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {node: i for i, node in enumerate(placeholders)}
    written: set[int] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for i, argument in enumerate(node.target._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            if isinstance(value, fx.Node) and value in index:
                written.add(index[value])
    return frozenset(written)
