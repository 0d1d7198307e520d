"""`graphopt diff A.onnx B.onnx`: which nodes were removed, added or changed.

Nodes are matched by name within their graph (the main graph, each If/Loop/Scan
body, each function), unnamed ones by their op and first output, as the report
names them. A node is *changed* when its name is in both models but its op
(domain), inputs, outputs or attributes differ (subgraph attributes are compared
node by node, as graphs of their own).

When B was written by graphopt, its nodes carry provenance (graphopt.ir.provenance):
added nodes are grouped by the rewrite (or pass) that made them, removed nodes go
to the rewrite whose graphopt.replaced lists them, and everything else is listed
"not from a rewrite".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx_ir as ir
from rich.console import Console

from graphopt.errors import escape_markup as escape  # control characters escaped too
from graphopt.ir import provenance
from graphopt.ir.onnx_io import load_model
from graphopt.ir.onnx_view import OnnxView

__all__ = ["DIFF_SCHEMA", "NodeEntry", "NodeChange", "DiffGroup", "ModelDiff", "diff_models", "diff_files", "print_diff"]

DIFF_SCHEMA = "graphopt.diff"
DIFF_VERSION = 1
REWRITE, PASS, OTHER = "rewrite", "pass", "other"


@dataclass(frozen=True)
class NodeEntry:
    scope: str  # "main", a subgraph path (main/If_0.then_branch) or function:domain.name
    name: str
    op: str  # "Op", or "domain.Op" outside the default domain


@dataclass
class NodeChange:
    scope: str
    name: str
    op_before: str
    op_after: str
    fields: list[str]  # what differs: op, inputs, outputs, attributes
    details: list[str]  # the same in words, with the values


@dataclass
class DiffGroup:
    kind: str  # REWRITE, PASS or OTHER
    rewrite: int | None = None
    rule: str | None = None
    pass_name: str | None = None
    removed: list[NodeEntry] = field(default_factory=list)
    added: list[NodeEntry] = field(default_factory=list)
    changed: list[NodeChange] = field(default_factory=list)

    @property
    def title(self) -> str:
        if self.kind == REWRITE:
            return f"rewrite #{self.rewrite} {self.rule}"
        if self.kind == PASS:
            return f"pass {self.pass_name}"
        return "not from a rewrite"


@dataclass
class ModelDiff:
    a: str
    b: str
    groups: list[DiffGroup]
    provenance: bool  # B carries graphopt provenance metadata

    def count(self, what: str) -> int:
        return sum(len(getattr(g, what)) for g in self.groups)

    @property
    def empty(self) -> bool:
        return not any(g.removed or g.added or g.changed for g in self.groups)

    def summary(self) -> str:
        if self.empty:
            return "no differences in nodes"
        rewrites = sum(1 for g in self.groups if g.kind == REWRITE)
        line = f"{self.count('removed')} removed, {self.count('added')} added, {self.count('changed')} changed"
        if self.provenance:
            line += f"; {rewrites} rewrite{'s' if rewrites != 1 else ''} named in B"
        else:
            line += "; B carries no graphopt provenance, so nothing is grouped by rewrite"
        return line

    def to_dict(self) -> dict[str, Any]:
        groups = []
        for g in self.groups:
            body = asdict(g)
            body["pass"] = body.pop("pass_name")
            body["title"] = g.title
            groups.append(body)
        counts = {what: self.count(what) for what in ("removed", "added", "changed")}
        return {"schema": DIFF_SCHEMA, "version": DIFF_VERSION, "a": self.a, "b": self.b, "summary": counts, "groups": groups}


# ------------------------------------------------------------------ computing


@dataclass
class _Node:
    entry: NodeEntry
    node: ir.Node
    signature: dict[str, Any]


def _op(node: ir.Node) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _attribute(attr: ir.Attr) -> Any:
    if attr.is_ref():
        return f"@{attr.ref_attr_name}"
    if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return "<graph>"  # its nodes are compared in their own scope
    return ir.serde.serialize_attribute(attr).SerializeToString(deterministic=True)


def _signature(node: ir.Node) -> dict[str, Any]:
    return {
        "op": _op(node),
        "inputs": tuple(v.name or "" if v is not None else "" for v in node.inputs),
        "outputs": tuple(v.name or "" for v in node.outputs),
        "attributes": {name: _attribute(attr) for name, attr in node.attributes.items()},
    }


def _nodes(model: ir.Model) -> dict[tuple[str, str], _Node]:
    """Every node of every scope, keyed by (scope, name); a repeated name gets #2, #3 ..."""
    view = OnnxView(model)
    found: dict[tuple[str, str], _Node] = {}
    for scope in view.scopes():
        scope_label = view.scope_label(scope)
        for node in scope:
            name = base = view.label(node)
            repeat = 1
            while (scope_label, name) in found:
                repeat += 1
                name = f"{base}#{repeat}"
            found[(scope_label, name)] = _Node(NodeEntry(scope_label, name, _op(node)), node, _signature(node))
    return found


def _change(before: _Node, after: _Node) -> NodeChange | None:
    fields: list[str] = []
    details: list[str] = []
    a, b = before.signature, after.signature
    if a["op"] != b["op"]:
        fields.append("op")
        details.append(f"op {a['op']} -> {b['op']}")
    for what in ("inputs", "outputs"):
        if a[what] != b[what]:
            fields.append(what)
            details.append(f"{what} ({', '.join(a[what])}) -> ({', '.join(b[what])})")
    differing = sorted(name for name in {*a["attributes"], *b["attributes"]} if a["attributes"].get(name) != b["attributes"].get(name))
    if differing:
        fields.append("attributes")
        details.append(f"attributes {', '.join(differing)}")
    if not fields:
        return None
    return NodeChange(after.entry.scope, after.entry.name, a["op"], b["op"], fields, details)


def _group_key(node: ir.Node) -> tuple[Any, ...]:
    props = node.metadata_props
    index = props.get(provenance.REWRITE_KEY)
    if index is not None and index.isdigit():
        return (REWRITE, int(index), props.get(provenance.RULE_KEY, "?"))
    if provenance.PASS_KEY in props:
        return (PASS, props[provenance.PASS_KEY])
    return (OTHER,)


def _change_group(before: _Node, after: _Node) -> tuple[Any, ...]:
    """A node of A changed in place: rewrites never edit nodes, but they rewire readers onto
    another value, so a new input made by a rewrite's node points at that rewrite."""
    old_inputs = set(before.signature["inputs"])
    for value in after.node.inputs:
        producer = value.producer() if value is not None and value.name not in old_inputs else None
        if producer is not None and _group_key(producer)[0] == REWRITE:
            return _group_key(producer)
    # Rewired onto a constant (no producer node): the rewrite left its record on this node.
    records = provenance.removed_records(after.node.metadata_props)
    if records and provenance.RULE_KEY not in after.node.metadata_props:
        index, rule, _ = max(records, key=lambda record: record[0])
        return (REWRITE, index, str(rule))
    return _group_key(after.node)


def _is_made(node: ir.Node, original: ir.Node) -> bool:
    return provenance.RULE_KEY in node.metadata_props and provenance.RULE_KEY not in original.metadata_props


def diff_models(a: ir.Model, b: ir.Model, a_name: str = "A", b_name: str = "B") -> ModelDiff:
    """The node-level difference from `a` to `b`, grouped by B's provenance."""
    before, after = _nodes(a), _nodes(b)
    # A node a rewrite made may carry the name of the node it stands in for (a Conv folded with
    # its BatchNormalization keeps the Conv's name): it is still that rewrite's new node, and
    # the old one is removed. Such pairs are compared as different nodes.
    made = {key for key, item in after.items() if key in before and _is_made(item.node, before[key].node)}
    before = {(key if key not in made else (key[0], key[1], "before")): item for key, item in before.items()}  # type: ignore[misc]
    groups: dict[tuple[Any, ...], DiffGroup] = {}

    def group(key: tuple[Any, ...]) -> DiffGroup:
        if key not in groups:
            if key[0] == REWRITE:
                groups[key] = DiffGroup(REWRITE, rewrite=key[1], rule=key[2])
            elif key[0] == PASS:
                groups[key] = DiffGroup(PASS, pass_name=key[1])
            else:
                groups[key] = DiffGroup(OTHER)
        return groups[key]

    # Which rewrite removed which node: the lowest-numbered one that lists it (a later
    # rewrite built on an earlier one's nodes lists the input nodes the earlier one replaced).
    replaced_by: dict[tuple[str, str], tuple[Any, ...]] = {}
    # B says exactly which rewrite removed which input node (graphopt.removed); the
    # graphopt.replaced lists (all a fused node stands for) are the fallback for older files.
    removed_by: dict[tuple[str, str], tuple[Any, ...]] = {}
    for key, item in after.items():
        for index, rule, names in provenance.removed_records(item.node.metadata_props):
            for name in names:
                known = removed_by.get((key[0], str(name)))
                if known is None or known[1] > index:
                    removed_by[(key[0], str(name))] = (REWRITE, index, str(rule))
    has_provenance = bool(removed_by)
    for key, item in after.items():
        if key in before:
            continue
        group_key = _group_key(item.node)
        group(group_key).added.append(item.entry)
        has_provenance = has_provenance or group_key[0] != OTHER
        listed = item.node.metadata_props.get(provenance.REPLACED_KEY)
        if group_key[0] == REWRITE and listed:
            for name in provenance.split_names(listed):
                known = replaced_by.get((key[0], name))
                if known is None or known[1] > group_key[1]:
                    replaced_by[(key[0], name)] = group_key
    for key, item in before.items():
        if key not in after:
            key = key[:2]
            group(removed_by.get(key) or replaced_by.get(key, (OTHER,))).removed.append(item.entry)
    for key, item in after.items():
        if key in before:
            change = _change(before[key], item)
            if change is not None:
                group(_change_group(before[key], item)).changed.append(change)
    ordered = sorted(groups.items(), key=lambda kv: (("rewrite", "pass", "other").index(kv[0][0]), kv[0][1:]))
    return ModelDiff(a_name, b_name, [g for _, g in ordered], has_provenance)


def diff_files(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> ModelDiff:
    """Load both models (with graphopt's checks: a bad file raises ModelError) and diff them."""
    return diff_models(load_model(a), load_model(b), str(a), str(b))


# ------------------------------------------------------------------ rendering


def _entries(group: DiffGroup) -> Iterator[str]:
    for entry in group.removed:
        yield f"  [red]-[/] {escape(_where(entry.scope, entry.name))}  [dim]{escape(entry.op)}[/]"
    for entry in group.added:
        yield f"  [green]+[/] {escape(_where(entry.scope, entry.name))}  [dim]{escape(entry.op)}[/]"
    for change in group.changed:
        yield f"  [yellow]~[/] {escape(_where(change.scope, change.name))}  [dim]{escape(change.op_after)}[/]: {escape('; '.join(change.details))}"


def _where(scope: str, name: str) -> str:
    return name if scope == "main" else f"{name} (in {scope})"


def print_diff(result: ModelDiff, console: Console) -> None:
    """One section per rewrite, pass and the rest: - removed, + added, ~ changed; then the counts."""
    for group in result.groups:
        counts = ", ".join(f"{len(getattr(group, what))} {what}" for what in ("removed", "added", "changed") if getattr(group, what))
        console.print(f"[bold]{escape(group.title)}[/]: {counts}", highlight=False, soft_wrap=True)
        for line in _entries(group):
            console.print(line, highlight=False, soft_wrap=True)
    console.print(result.summary(), highlight=False, soft_wrap=True)
