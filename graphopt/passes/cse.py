"""Common-subexpression elimination, constants included, over all scopes.

Why our own pass: onnx-ir's CommonSubexpressionEliminationPass only looks at the
main graph (not If/Loop bodies, not functions), and its DeduplicateInitializersPass
only merges initializers within one graph (warning once per initializer that is a
graph input). Here one linear, topological pass per scope does all of it:

* a node whose (domain, op, overload, version, inputs, attributes) equals an earlier
  one reuses that node's outputs; inputs of two-input commutative ops are compared
  as a set;
* small constants (initializers and Constant nodes, up to `const_size_limit`
  elements) with equal dtype, shape and bytes merge;
* a subgraph sees the table of the scopes around it, so a body recomputing or
  re-declaring something the outer graph has reuses the outer value;
* graph outputs keep their names (the kept value is renamed, or an Identity with the
  output's name is added when the kept value cannot be renamed);
* non-deterministic ops, nodes with subgraphs, constants above the limit, ops declared
  `never_merged` (Quantize/DequantizeLinear: onnxruntime's QDQ transformers want each
  node unit's own, and rewrite their int8 constants in place) and the constants they
  read are never merged.
"""

from __future__ import annotations

import time
from collections import ChainMap
from collections.abc import Hashable, MutableMapping
from typing import Any

import numpy as np
import onnx_ir as ir

from graphopt.ir.onnx_view import OnnxView
from graphopt.ops.registry import has_fact
from graphopt.passes._common import ONNX_DOMAINS, as_model, has_subgraphs, is_non_deterministic, record, subgraphs

__all__ = ["eliminate_common_subexpressions"]


_Table = MutableMapping[Hashable, Any]


def eliminate_common_subexpressions(model: ir.Model | OnnxView, *, const_size_limit: int = 1024, stats: Any = None) -> int:
    """Merge duplicate nodes and small duplicate constants; returns how many were merged.

    Merged-away nodes and initializers are removed; nodes left without users by the
    merge are DCE's job."""
    started = time.perf_counter()
    model = as_model(model)
    cse = _Cse(const_size_limit)
    cse.scope(model.graph, ChainMap())
    for function in model.functions.values():
        cse.scope(function, ChainMap())
    record(stats, cse.count, started)
    return cse.count


class _Cse:
    def __init__(self, const_size_limit: int) -> None:
        self.limit = const_size_limit
        self.count = 0

    def scope(self, scope: ir.Graph | ir.Function, table: ChainMap[Hashable, Any]) -> None:
        if isinstance(scope, ir.Graph):
            for value in list(scope.initializers.values()):
                self._initializer(scope, value, table)
        for node in list(scope):
            if has_subgraphs(node):
                for graph in subgraphs(node):
                    self.scope(graph, table.new_child())
                continue
            key = self._key(node)
            if key is None:
                continue
            kept = table.get(key)
            if kept is None:
                table[key] = tuple(node.outputs)
            else:
                self._merge(node, kept)

    # ------------------------------------------------------------ keys
    def _initializer(self, graph: ir.Graph, value: ir.Value, table: _Table) -> None:
        if value.is_graph_input() or value.is_graph_output() or value.const_value is None or _feeds_never_merged(value):
            return  # inputs can be overridden; outputs keep their names
        key = self._tensor_key(value.const_value)
        if key is None:
            return
        kept = table.get(key)
        if kept is None:
            table[key] = (value,)
            return
        value.replace_all_uses_with(kept[0])
        assert value.name is not None
        graph.initializers.pop(value.name)
        self.count += 1

    def _tensor_key(self, tensor: ir.TensorProtocol) -> Hashable | None:
        if tensor.size > self.limit or tensor.dtype == ir.DataType.STRING:
            return None
        try:
            data = tensor.tobytes()
        except Exception:  # noqa: BLE001 - unreadable tensor: leave it alone
            return None
        return ("const", tensor.dtype, tuple(tensor.shape), data)

    def _key(self, node: ir.Node) -> Hashable | None:
        if is_non_deterministic(node) or not node.outputs or has_fact(node.domain, node.op_type, "never_merged"):
            return None
        if node.op_type == "Constant" and node.domain in ONNX_DOMAINS and not node.inputs:
            try:
                tensor = ir.convenience.get_const_tensor(node.outputs[0])
            except (ValueError, TypeError):
                tensor = None
            return None if tensor is None or _feeds_never_merged(node.outputs[0]) else self._tensor_key(tensor)
        attrs: list[tuple[str, Any, Any]] = []
        for name, attr in node.attributes.items():
            if attr.is_ref():
                attrs.append((name, "ref", attr.ref_attr_name))
                continue
            value = attr.value
            if attr.type == ir.AttributeType.TENSOR:
                value = self._tensor_key(value)
                if value is None:
                    return None
            elif attr.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
                value = tuple(value)
            elif attr.type not in (ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING):
                return None  # sparse tensors, type protos, graphs: not worth hashing
            if isinstance(value, float) and np.isnan(value):
                value = "nan"  # nan != nan would make equal nodes look different
            attrs.append((name, attr.type, value))
        # The values themselves (hashed by identity): the key keeps them alive, so an id
        # can never be reused by a value created later in the pass.
        inputs = tuple(node.inputs)
        if len(inputs) == 2 and None not in inputs and has_fact(node.domain, node.op_type, "commutative"):
            inputs = tuple(sorted(inputs, key=id))
        return (node.domain, node.op_type, node.overload, node.version, len(node.outputs), inputs, tuple(sorted(attrs)))

    # ------------------------------------------------------------ merging
    def _merge(self, node: ir.Node, kept: tuple[ir.Value, ...]) -> None:
        graph = node.graph
        assert graph is not None
        identities: list[ir.Node] = []
        for old, new in zip(node.outputs, kept, strict=False):
            # Equal values: whatever one knows about type and shape holds for the other.
            if new.type is None:
                new.type = old.type
            if new.shape is None and old.shape is not None:
                new.shape = old.shape
            if old.is_graph_output():
                name = old.name
                if _can_take_name(new, graph):
                    old.name = None
                    new.name = name
                else:
                    # The kept value keeps its own name (input, initializer, another
                    # output, outer scope): copy it into a value named like the output.
                    identity = ir.Node("", "Identity", [new], name=f"{name}_cse_identity")
                    identity.outputs[0].name = name
                    identity.outputs[0].type = old.type
                    identity.outputs[0].shape = old.shape
                    identities.append(identity)
                    old.name = None
                    new = identity.outputs[0]
            old.replace_all_uses_with(new, replace_graph_outputs=True)
        if identities:
            graph.insert_before(node, identities)
        graph.remove(node, safe=True)
        self.count += 1


def _feeds_never_merged(value: ir.Value) -> bool:
    return any(has_fact(user.domain, user.op_type, "never_merged") for user, _ in value.uses())


def _can_take_name(value: ir.Value, graph: ir.Graph) -> bool:
    """Renaming is safe for a plain node output of the same graph."""
    return value.producer() is not None and value.graph is graph and not value.is_graph_output() and not value.is_graph_input()
