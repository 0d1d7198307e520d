"""The graph view: what the matcher and the rewrite driver need from a graph.

The ONNX implementation (`graphopt.ir.onnx_view.OnnxView`) works on onnx-ir's
in-memory model; an FX implementation presents ATen nodes through the same
canonical (ONNX) op names. Nodes and values are the underlying library's own
objects: the view only answers questions about them and performs mutations, so
nothing is copied.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["GraphView", "Node", "Value", "Scope"]

Node = Any
Value = Any
Scope = Any


class GraphView(Protocol):
    # ---------------------------------------------------------------- reading
    def scopes(self) -> list[Scope]:
        """Every graph to rewrite: the main graph, subgraphs, and function bodies."""

    def nodes(self, scope: Scope) -> Sequence[Node]:
        """The nodes of one scope in topological order."""

    def scope_of(self, node: Node) -> Scope: ...

    def op_key(self, node: Node) -> tuple[str, str]:
        """(domain, op_type) in the canonical (ONNX) vocabulary; '' is the default domain."""

    def inputs(self, node: Node) -> Sequence[Value | None]: ...

    def outputs(self, node: Node) -> Sequence[Value]: ...

    def producer(self, value: Value) -> Node | None: ...

    def output_index(self, value: Value) -> int: ...

    def users(self, value: Value) -> list[Node]:
        """Consumer nodes of `value`, once per use (a node using it twice appears twice)."""

    def is_graph_output(self, value: Value) -> bool: ...

    def const_array(self, value: Value) -> np.ndarray | None:
        """The constant's contents, or None when the value is not a constant."""

    def is_const(self, value: Value) -> bool: ...

    def dtype(self, value: Value) -> str | None:
        """Element type as a short name: f32, f16, bf16, f64, i64, i32, i8, u8, bool …"""

    def shape(self, value: Value) -> tuple[int | str | None, ...] | None:
        """Static dims as ints, symbolic dims as names, unknown as None; None if rank unknown."""

    def attr(self, node: Node, name: str) -> Any:
        """The attribute's value, else the op schema's default, else `MISSING`."""

    def attrs(self, node: Node) -> Mapping[str, Any]:
        """Attributes actually set on the node."""

    def raw_attrs(self, node: Node) -> Mapping[str, Any]:
        """The node's attributes in the graph library's own form (copied verbatim by `{..x}`)."""

    def opset(self, domain: str) -> int | None:
        """The opset version the model imports for `domain`."""

    def label(self, node: Node) -> str:
        """A stable, human-readable name for reports."""

    def scope_label(self, scope: Scope) -> str: ...

    # --------------------------------------------------------------- mutating
    def new_node(
        self,
        scope: Scope,
        domain: str,
        op_type: str,
        inputs: Sequence[Value | None],
        attrs: Mapping[str, Any],
        num_outputs: int,
        name_hint: str = "",
    ) -> Node:
        """A node not yet in the graph (inserted by `commit`), named after `name_hint`."""

    def new_constant(self, scope: Scope, array: np.ndarray, name_hint: str) -> Value:
        """A constant value holding `array`, usable as an input of new nodes."""

    def commit(
        self,
        root: Node,
        new_nodes: Sequence[Node],
        replacements: Sequence[tuple[Value, Value]],
        matched: Sequence[Node],
        *,
        provenance: Mapping[str, str] | None = None,
    ) -> list[Node]:
        """Insert `new_nodes` before `root`, redirect every use of each old value to its
        replacement (graph outputs keep their names), and erase the matched nodes and
        other producers left without users. Returns the nodes whose inputs changed.

        `provenance` (graphopt.ir.provenance's keys) is recorded on every inserted node,
        with the names of the nodes the commit erased."""

    def discard_pending(self) -> None:
        """Forget constants made for a rewrite that will not be committed."""

    def iter_all_nodes(self) -> Iterator[Node]: ...
