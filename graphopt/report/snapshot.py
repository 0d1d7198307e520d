"""Snapshots of rewritten subgraphs, and their drawings.

The driver captures, for each applied rewrite, the nodes the rule matched (just
before the commit) and the nodes it inserted (just after): op types, the edges
between them with dtype and shape, and the values crossing the boundary. The HTML
report draws each snapshot (drawing.py); the names are listed beside the drawing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from graphopt.ir.view import GraphView
from graphopt.report.sections import GraphSnapshot, SnapshotEdge, SnapshotNode, SnapshotValue

__all__ = ["MAX_SNAPSHOT_NODES", "capture_snapshot"]

#: Nodes kept per snapshot: enough for the largest fusion (attention), small enough
#: that a report of a deep model stays a few megabytes.
MAX_SNAPSHOT_NODES = 40
# ------------------------------------------------------------------ capture


def capture_snapshot(
    view: GraphView, nodes: Sequence[Any], passthrough: Iterable[Any] = (), limit: int = MAX_SNAPSHOT_NODES
) -> GraphSnapshot:
    """The subgraph made of `nodes` (in the given order, at most `limit` of them): every
    value they read from outside becomes an input, every value used outside (or a graph
    output) an output. `passthrough` values, when not made by `nodes`, are drawn going
    straight from input to output: a rewrite that replaces a match by an existing value
    (a no-op Transpose dropped) has no new node to show. Reads only the view, so it works
    for any graph kind."""
    unique = list({id(node): node for node in nodes}.values())  # a node bound twice is drawn once
    kept = unique[:limit]
    position = {id(node): k for k, node in enumerate(kept)}
    inputs: list[SnapshotValue] = []
    outputs: list[SnapshotValue] = []
    edges: list[SnapshotEdge] = []
    input_of: dict[int, int] = {}  # id(value) -> index in inputs

    def typed(value: Any) -> tuple[str | None, list[int | str | None] | None]:
        shape = view.shape(value)
        return view.dtype(value), None if shape is None else [d if isinstance(d, (int, type(None))) else str(d) for d in shape]

    for k, node in enumerate(kept):
        for value in view.inputs(node):
            if value is None:  # an omitted optional input
                continue
            dtype, shape = typed(value)
            producer = view.producer(value)
            if producer is not None and id(producer) in position:
                source = f"n{position[id(producer)]}"
            else:
                if id(value) not in input_of:
                    input_of[id(value)] = len(inputs)
                    inputs.append(SnapshotValue(_value_name(value), dtype, shape, view.is_const(value)))
                source = f"i{input_of[id(value)]}"
            edges.append(SnapshotEdge(source, f"n{k}", dtype, shape))
    made_here = {id(value) for node in kept for value in view.outputs(node)}
    for value in passthrough:
        if value is None or id(value) in made_here:
            continue
        dtype, shape = typed(value)
        if id(value) not in input_of:
            input_of[id(value)] = len(inputs)
            inputs.append(SnapshotValue(_value_name(value), dtype, shape, view.is_const(value)))
        edges.append(SnapshotEdge(f"i{input_of[id(value)]}", f"o{len(outputs)}", dtype, shape))
        outputs.append(SnapshotValue(_value_name(value), dtype, shape))
    for k, node in enumerate(kept):
        for value in view.outputs(node):
            used_outside = any(id(user) not in position for user in view.users(value))
            if used_outside or view.is_graph_output(value):
                dtype, shape = typed(value)
                edges.append(SnapshotEdge(f"n{k}", f"o{len(outputs)}", dtype, shape))
                outputs.append(SnapshotValue(_value_name(value), dtype, shape))
    return GraphSnapshot(
        nodes=[SnapshotNode(view.label(node), _op_name(view.op_key(node))) for node in kept],
        inputs=inputs,
        outputs=outputs,
        edges=edges,
        truncated=len(unique) - len(kept),
    )


def _value_name(value: Any) -> str:
    return str(getattr(value, "name", None) or "?")


def _op_name(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}" if key[0] else key[1]
