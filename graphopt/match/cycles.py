"""Proof that a rewrite keeps the graph acyclic, before it is committed.

A rewrite replaces old values with the outputs of new nodes. If an input of a new
node is computed from one of the values it replaces, then after the redirect that
input is computed from the new node itself: a cycle. The driver asks
`cycle_through` before every commit and declines such a rewrite as a near-miss.

The search runs backwards from the new nodes' inputs and never leaves the part of
the graph that lies, in topological order, after the earliest replaced value: a
node placed before every replaced value cannot be computed from one. `TopoOrder`
keeps those positions up to date across rewrites without rescanning the graph
(new nodes get positions between their inputs and the root they are inserted
before; a rewrite that makes the view re-sort its graph renumbers the scope).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from graphopt.ir.view import GraphView

__all__ = ["TopoOrder", "cycle_through"]


class TopoOrder:
    """Positions of one scope's nodes in topological order (smaller comes first)."""

    def __init__(self, view: GraphView, scope: Any) -> None:
        self.view, self.scope = view, scope
        self._pos: dict[int, tuple[Any, float]] = {}
        self.renumber()

    def renumber(self) -> None:
        self._pos = {id(n): (n, float(i)) for i, n in enumerate(self.view.nodes(self.scope))}

    def of(self, node: Any) -> float | None:
        entry = self._pos.get(id(node))
        return entry[1] if entry is not None and entry[0] is node else None

    def place(self, root: Any, new_nodes: Sequence[Any], resorted: bool) -> None:
        """Record the positions of nodes a commit inserted before `root`.

        The new nodes read only values produced before the root, and their outputs
        are read only by the root's users (unless the view re-sorted the graph), so
        they fit between the last producer of their inputs and the root."""
        if resorted:
            self.renumber()
            return
        hi = self.of(root)
        fresh = {id(n) for n in new_nodes}
        lo = float("-inf")
        for node in new_nodes:
            for value in self.view.inputs(node):
                producer = _producer(self.view, value)
                if producer is None or id(producer) in fresh:
                    continue
                pos = self.of(producer)
                if pos is None:
                    self.renumber()
                    return
                lo = max(lo, pos)
        if hi is None:
            self.renumber()
            return
        lo = max(lo, hi - 1.0)
        step = (hi - lo) / (len(new_nodes) + 1)
        if step <= 1e-9:  # the gap between two nodes is used up: start afresh
            self.renumber()
            return
        for i, node in enumerate(new_nodes, 1):
            self._pos[id(node)] = (node, lo + i * step)


def _producer(view: GraphView, value: Any) -> Any:
    if value is None:
        return None
    try:
        return view.producer(value)
    except (AttributeError, TypeError):  # a literal the view passes as an input (FX constants)
        return None


def _inputs(view: GraphView, node: Any) -> Iterable[Any]:
    yield from view.inputs(node)
    implicit = getattr(view, "implicit_inputs", None)  # values a subgraph (If/Loop body) reads from outside
    if implicit is not None:
        yield from implicit(node)


def cycle_through(view: GraphView, order: TopoOrder, new_nodes: Sequence[Any], replacements: Sequence[tuple[Any, Any]]) -> str | None:
    """Why committing these new nodes and replacements would create a cycle, or None."""
    olds = {id(old): old for old, _ in replacements}
    if not olds:
        return None
    fresh = {id(n) for n in new_nodes}
    earliest = float("inf")
    for old in olds.values():
        producer = _producer(view, old)
        pos = order.of(producer) if producer is not None else None
        if pos is None:  # unknown position: search without the bound
            earliest = float("-inf")
            break
        earliest = min(earliest, pos)

    # (node whose inputs to look at, the new node whose input leads to it, whether it is that new node):
    # the new nodes themselves first, then, backwards, the existing nodes their inputs come from.
    stack: list[tuple[Any, Any, bool]] = [(node, node, True) for node in reversed(new_nodes)]
    seen: set[int] = set()
    while stack:
        current, reader, is_new = stack.pop()
        if not is_new:
            if id(current) in seen:
                continue
            seen.add(id(current))
            pos = order.of(current)
            if pos is not None and pos < earliest:
                continue  # placed before every replaced value: cannot be computed from one
        for value in _inputs(view, current):
            if value is None:
                continue
            if id(value) in olds:
                return _why(view, reader, value, None if is_new else current)
            producer = _producer(view, value)
            if producer is not None and id(producer) not in fresh:
                stack.append((producer, reader, False))
    return None


def _why(view: GraphView, reader: Any, old: Any, via: Any | None) -> str:
    name = getattr(old, "name", None) or "a replaced value"
    new_op = view.op_key(reader)[1]
    if via is None:
        return f"would create a cycle: new {new_op} would read {name}, a value it replaces"
    return f"would create a cycle: new {new_op} would read the result of {view.label(via)}, which is computed from {name}, a value it replaces"
