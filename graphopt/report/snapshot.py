"""Snapshots of rewritten subgraphs, and their drawings.

The driver captures, for each applied rewrite, the nodes the rule matched (just
before the commit) and the nodes it inserted (just after): op types, the edges
between them with dtype and shape, and the values crossing the boundary. The HTML
report draws each snapshot with Graphviz `dot` (a real layout engine), many
graphs per call. A drawing shows op types and value types only, never names, so
the same rewrite repeated in every layer of a model gives one drawing, drawn once;
the names are listed beside it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from graphopt.ir.view import GraphView
from graphopt.report.model import GraphSnapshot, SnapshotEdge, SnapshotNode, SnapshotValue

__all__ = [
    "MAX_SNAPSHOT_NODES",
    "GraphvizUnavailable",
    "capture_snapshot",
    "snapshot_to_dot",
    "find_dot",
    "render_svgs",
    "format_type",
]

#: Nodes kept per snapshot: enough for the largest fusion (attention), small enough
#: that a report of a deep model stays a few megabytes.
MAX_SNAPSHOT_NODES = 40
#: Seconds one `dot` call may take for a whole report's drawings.
DOT_TIMEOUT_S = 120


class GraphvizUnavailable(RuntimeError):
    """`dot` is not installed, or it failed: the report is rendered without drawings."""


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


# ------------------------------------------------------------------ drawing

_PALETTE = {
    # kind -> (fill, border) of op nodes: before in amber, after in green
    "before": ("#fff4e0", "#c7892b"),
    "after": ("#e6f4ea", "#3d8b56"),
}


def format_type(dtype: str | None, shape: Sequence[Any] | None) -> str:
    """`f32[batch,seq,64]`; `f32` when the rank is unknown; `?` for an unknown dtype."""
    text = dtype or "?"
    if shape is not None:
        text += "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
    return text


def _quote(text: str) -> str:
    # A DOT double-quoted string: backslashes and quotes escaped, newlines as \n.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def snapshot_to_dot(snapshot: Mapping[str, Any], kind: str = "before") -> str:
    """A DOT graph of a snapshot (in its JSON form). Labels carry op types and value
    types only, so identical subgraphs give identical text (and one drawing)."""
    fill, border = _PALETTE.get(kind, _PALETTE["before"])
    lines = [
        "digraph G {",
        '  graph [rankdir=TB, nodesep=0.2, ranksep=0.28, margin=0, bgcolor="transparent", fontname="Helvetica"];',
        f'  node [shape=box, style="rounded,filled", fillcolor="{fill}", color="{border}", fontname="Helvetica", '
        "fontsize=11, height=0.3, margin=\"0.08,0.03\"];",
        '  edge [fontname="Helvetica", fontsize=8, color="#777777", fontcolor="#333333", arrowsize=0.6];',
    ]
    for k, node in enumerate(snapshot.get("nodes", [])):
        lines.append(f"  n{k} [label={_quote(str(node.get('op', '?')))}];")
    boundary = 'shape=box, style="dashed,rounded", color="#999999", fillcolor="white", fontcolor="#555555", fontsize=8, height=0.2, width=0.3, margin="0.04,0.01"'
    for k, value in enumerate(snapshot.get("inputs", [])):
        label = f"const {k}" if value.get("const") else f"in {k}"
        lines.append(f"  i{k} [label={_quote(label)}, {boundary}];")
    for k, _ in enumerate(snapshot.get("outputs", [])):
        lines.append(f"  o{k} [label={_quote(f'out {k}')}, {boundary}];")
    for edge in snapshot.get("edges", []):
        src, dst = str(edge.get("src", "")), str(edge.get("dst", ""))
        if not (_ENDPOINT.fullmatch(src) and _ENDPOINT.fullmatch(dst)):
            continue  # not written by graphopt; never pasted raw into DOT
        known = edge.get("dtype") is not None or edge.get("shape") is not None  # new nodes are untyped until inference
        label = format_type(edge.get("dtype"), edge.get("shape")) if known else ""
        lines.append(f"  {src} -> {dst} [label={_quote(label)}];")
    truncated = int(snapshot.get("truncated") or 0)
    if truncated:
        lines.append(f'  more [shape=plaintext, fontsize=9, fontcolor="#555555", label={_quote(f"… {truncated} more nodes not drawn")}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


_ENDPOINT = re.compile(r"[nio]\d+")


def find_dot(command: str | None = "dot") -> str | None:
    """The path of Graphviz's `dot`, or None when it is not installed."""
    return shutil.which(command) if command else None


def render_svgs(dot_sources: Iterable[str], dot: str | None = "dot", timeout_s: float = DOT_TIMEOUT_S) -> list[str]:
    """Lay out every graph with one `dot -Tsvg` call; returns one inline-ready <svg> each.

    Raises GraphvizUnavailable when `dot` is missing or fails (the caller renders without
    drawings)."""
    sources = list(dot_sources)
    if not sources:
        return []
    executable = find_dot(dot)
    if executable is None:
        raise GraphvizUnavailable("Graphviz `dot` was not found (install graphviz to get the drawings)")
    try:
        done = subprocess.run(
            [executable, "-Tsvg"], input="".join(sources).encode("utf-8"), capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise GraphvizUnavailable(f"Graphviz `dot` did not run: {error}") from None
    if done.returncode != 0:
        first = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no message"])[0]
        raise GraphvizUnavailable(f"Graphviz `dot` failed: {first}")
    svgs = [_inline_svg(part) for part in done.stdout.decode("utf-8", "replace").split("</svg>")[: len(sources)]]
    if len(svgs) != len(sources) or not all(svg.startswith("<svg") for svg in svgs):
        raise GraphvizUnavailable(f"Graphviz `dot` gave {len(svgs)} drawings for {len(sources)} graphs")
    return svgs


_PROLOGUE = re.compile(r"^.*?(?=<svg\b)", re.S)  # XML declaration, DOCTYPE, comments before <svg>
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TITLE = re.compile(r"<title>.*?</title>", re.S)  # internal ids (n0, i1 -> n0): noise as tooltips
# ids repeat across drawings; namespaces are implied in HTML; the font is set by the page's CSS
_ID = re.compile(r'\s(?:id|xmlns:xlink|xmlns|font-family)="[^"]*"')
_WHITE_BACKGROUND = re.compile(r'<polygon fill="(?:white|transparent)" stroke="transparent"[^>]*/>')


def _inline_svg(part: str) -> str:
    svg = _PROLOGUE.sub("", part, count=1)
    svg = _COMMENT.sub("", svg)
    svg = _TITLE.sub("", svg)
    svg = _ID.sub("", svg)
    svg = _WHITE_BACKGROUND.sub("", svg)
    svg = re.sub(r"\n\s*\n+", "\n", svg).strip()
    return svg + "</svg>" if svg else ""
