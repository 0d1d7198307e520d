"""Drawings of rewrite snapshots as inline SVG, laid out in Python.

A snapshot (see snapshot.py) is a small DAG: the ops a rule matched or inserted,
plus the values crossing its boundary. grandalf's Sugiyama layout (layers top to
bottom, crossings reduced by barycentre sweeps, long edges routed through dummy
points) places the boxes; this module only measures labels and writes the SVG. An
edge's type label is laid out as a vertex of its own on the edge (as Graphviz does),
so labels never overlap each other or the boxes.
No system tool is needed, so `pip install graphopt` is enough for a report with
pictures. Labels carry op types and value types only, never names, so the same
rewrite repeated in every layer gives identical SVG text (drawn once in the page).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

__all__ = ["snapshot_to_svg", "format_type"]

# Box colours per kind of drawing: matched ("before") in amber, replacement ("after") in green.
_PALETTE = {"before": ("#fff4e0", "#c7892b"), "after": ("#e6f4ea", "#3d8b56")}
_OP_FONT, _EDGE_FONT, _BOUNDARY_FONT = 11.0, 8.0, 8.0
_CHAR_WIDTH = 0.6  # of the font size: an upper bound for Helvetica's average glyph
_X_SPACE, _Y_SPACE = 12.0, 10.0  # between boxes of a layer, between layers
_MARGIN = 4.0
_ENDPOINT = re.compile(r"[nio]\d+")


def format_type(dtype: str | None, shape: Sequence[Any] | None) -> str:
    """`f32[batch,seq,64]`; `f32` when the rank is unknown; `?` for an unknown dtype."""
    text = dtype or "?"
    if shape is not None:
        text += "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
    return text


class _Box:
    """What grandalf calls a vertex's view: its size in, its centre (xy) out. `kind`: "op",
    "boundary" (a value from or to outside, dashed) or "label" (an edge's type, text only)."""

    def __init__(self, label: str, font: float, kind: str) -> None:
        self.label, self.font, self.kind = label, font, kind
        pad_w, pad_h, least = {"op": (16, 12, 30.0), "boundary": (10, 8, 30.0), "label": (6, 4, 10.0)}[kind]
        self.w = max(len(label) * font * _CHAR_WIDTH + pad_w, least)
        self.h = font + pad_h
        self.xy = (0.0, 0.0)


class _Path:
    """An edge's view: grandalf hands it the points (centres and dummy points) it passes."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []

    def setpath(self, points: list[tuple[float, float]]) -> None:
        self.points = [(float(x), float(y)) for x, y in points]


def snapshot_to_svg(snapshot: Mapping[str, Any], kind: str = "before") -> str:
    """One self-contained <svg> of a snapshot in its JSON form ("" when it has no node)."""
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    boxes: dict[str, _Box] = {}
    for k, node in enumerate(snapshot.get("nodes") or []):
        boxes[f"n{k}"] = _Box(str(node.get("op", "?")) if isinstance(node, Mapping) else "?", _OP_FONT, "op")
    for k, value in enumerate(snapshot.get("inputs") or []):
        const = isinstance(value, Mapping) and value.get("const")
        boxes[f"i{k}"] = _Box(f"const {k}" if const else f"in {k}", _BOUNDARY_FONT, "boundary")
    for k, _ in enumerate(snapshot.get("outputs") or []):
        boxes[f"o{k}"] = _Box(f"out {k}", _BOUNDARY_FONT, "boundary")
    if not boxes:
        return ""
    # (source, target) per drawn edge; a typed edge goes through a label vertex "e<k>".
    links: list[tuple[str, str]] = []
    for edge in snapshot.get("edges") or []:
        if not isinstance(edge, Mapping):
            continue
        src, dst = str(edge.get("src", "")), str(edge.get("dst", ""))
        if not (_ENDPOINT.fullmatch(src) and _ENDPOINT.fullmatch(dst)) or src not in boxes or dst not in boxes or src == dst:
            continue  # not written by graphopt: never drawn
        known = edge.get("dtype") is not None or edge.get("shape") is not None  # new nodes are untyped until inference
        if known:
            label = f"e{len(links)}"
            boxes[label] = _Box(format_type(edge.get("dtype"), edge.get("shape")), _EDGE_FONT, "label")
            links += [(src, label), (label, dst)]
        else:
            links.append((src, dst))
    vertices = {key: Vertex(key) for key in boxes}
    for key, vertex in vertices.items():
        vertex.view = boxes[key]
    edges = []
    for src, dst in links:
        e = Edge(vertices[src], vertices[dst])
        e.view = _Path()
        edges.append(e)
    graph = Graph(list(vertices.values()), edges)

    # Lay out each connected part, then place the parts side by side.
    offset, height = 0.0, 0.0
    for part in graph.C:
        layout = SugiyamaLayout(part)
        layout.xspace, layout.yspace = _X_SPACE, _Y_SPACE
        layout.init_all(optimize=True)
        layout.draw()
        left = min(v.view.xy[0] - v.view.w / 2 for v in part.sV)
        top = min(v.view.xy[1] - v.view.h / 2 for v in part.sV)
        shift = (offset - left, -top)
        for v in part.sV:
            v.view.xy = (v.view.xy[0] + shift[0], v.view.xy[1] + shift[1])
        for e in part.sE:
            e.view.points = [(x + shift[0], y + shift[1]) for x, y in e.view.points]
        offset = max(v.view.xy[0] + v.view.w / 2 for v in part.sV) + _X_SPACE
        height = max(height, max(v.view.xy[1] + v.view.h / 2 for v in part.sV))
    width = offset - _X_SPACE

    fill, border = _PALETTE.get(kind, _PALETTE["before"])
    shapes: list[str] = []
    labels: list[str] = []
    for e in edges:
        points = _clip(e.view.points or [e.v[0].view.xy, e.v[1].view.xy], e.v[0].view, e.v[1].view)
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        shapes.append(f'<polyline points="{path}" fill="none" stroke="#777777" stroke-width="1"/>')
        if e.v[1].view.kind != "label":  # one arrowhead per edge, where it ends
            shapes.append(_arrowhead(points[-2], points[-1]))
    for box in boxes.values():
        x, y = box.xy[0] - box.w / 2, box.xy[1] - box.h / 2
        if box.kind == "label":
            labels.append(
                f'<text x="{box.xy[0]:.1f}" y="{box.xy[1] + box.font / 3:.1f}" font-size="{box.font:g}" text-anchor="middle" '
                f'fill="#333333">{escape(box.label)}</text>'
            )
            continue
        if box.kind == "boundary":
            style = 'fill="white" stroke="#999999" stroke-dasharray="3,2"'
            text_fill = "#555555"
        else:
            style = f'fill="{fill}" stroke="{border}"'
            text_fill = "#1f2328"
        shapes.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" rx="4" {style}/>')
        shapes.append(
            f'<text x="{box.xy[0]:.1f}" y="{box.xy[1] + box.font / 3:.1f}" font-size="{box.font:g}" text-anchor="middle" '
            f'fill="{text_fill}">{escape(box.label)}</text>'
        )
    truncated = int(snapshot.get("truncated") or 0)
    if truncated:
        height += 14
        labels.append(f'<text x="0" y="{height - 2:.1f}" font-size="9" fill="#555555">… {truncated} more nodes not drawn</text>')
    width = max(width, 60.0)
    w, h = width + 2 * _MARGIN, height + 2 * _MARGIN
    return (
        f'<svg viewBox="{-_MARGIN:g} {-_MARGIN:g} {w:.1f} {h:.1f}" width="{w:.0f}pt" height="{h:.0f}pt" role="img">'
        + "".join(shapes)
        + "".join(labels)
        + "</svg>"
    )


def _clip(points: list[tuple[float, float]], source: _Box, target: _Box) -> list[tuple[float, float]]:
    """The path from the bottom edge of the source box to the top edge of the target box."""
    points = list(points)
    (x0, y0), (x1, y1) = points[0], points[-1]
    points[0] = (x0, y0 + source.h / 2)
    points[-1] = (x1, y1 - target.h / 2 - 1)
    return points


def _arrowhead(before: tuple[float, float], tip: tuple[float, float]) -> str:
    """A small filled triangle pointing along the last segment of an edge."""
    (bx, by), (tx, ty) = before, tip
    dx, dy = tx - bx, ty - by
    length = (dx * dx + dy * dy) ** 0.5 or 1.0
    ux, uy = dx / length, dy / length
    size, half = 6.0, 3.0
    left = (tx - ux * size - uy * half, ty - uy * size + ux * half)
    right = (tx - ux * size + uy * half, ty - uy * size - ux * half)
    return f'<polygon points="{tx:.1f},{ty:.1f} {left[0]:.1f},{left[1]:.1f} {right[0]:.1f},{right[1]:.1f}" fill="#777777"/>'
