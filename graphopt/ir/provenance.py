"""Provenance: which rewrite or pass made a node, kept in the ONNX node's metadata_props.

The keys travel with the saved model, so `graphopt diff` (and any ONNX tool) can
tell which rule made a node and which of the input's nodes it stands in for:

    graphopt.rule      the rule whose rewrite made the node
    graphopt.rewrite   that rewrite's index in the report (RewriteRecord.index)
    graphopt.replaced  comma-separated names of the input model's nodes the rewrite
                       replaced, with those replaced by the earlier rewrites it
                       builds on (and by later ones that only rewired onto its
                       nodes); cut at MAX_REPLACED_CHARS, ending in ",…" when cut
    graphopt.pass      the pass that made the node (constant_folding, precision, ...)
    graphopt.removed   exactly which input nodes each rewrite removed itself, as a JSON
                       list of [index, rule, [names]]: on the first node a rewrite inserted,
                       or, for a rewrite that inserted none (it rewired readers onto an
                       existing value: a Cast pair dropped, a Gather folded to a constant),
                       on a node next to it; records move on to the node that replaces
                       their carrier, so none is lost while the carrier is rewritten again

Only nodes graphopt inserts or rewires get these keys: untouched nodes stay byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import onnx_ir as ir

__all__ = [
    "RULE_KEY",
    "REWRITE_KEY",
    "REPLACED_KEY",
    "PASS_KEY",
    "REMOVED_KEY",
    "MAX_REPLACED_CHARS",
    "TRUNCATED",
    "join_names",
    "split_names",
    "replaced_names",
    "removed_records",
    "record_rewrite",
    "tag_new_nodes",
]

RULE_KEY = "graphopt.rule"
REWRITE_KEY = "graphopt.rewrite"
REPLACED_KEY = "graphopt.replaced"
PASS_KEY = "graphopt.pass"
REMOVED_KEY = "graphopt.removed"
#: Bound on the length of a graphopt.replaced value (a fused attention replaces tens of nodes).
MAX_REPLACED_CHARS = 4000
#: The last item of a list that was cut.
TRUNCATED = "…"


def join_names(names: Iterable[str]) -> str:
    """Comma-separated, in order, without repeats; cut (ending in ",…") past MAX_REPLACED_CHARS."""
    kept: list[str] = []
    length = 0
    for name in dict.fromkeys(n for n in names if n):
        if length + len(name) + 1 > MAX_REPLACED_CHARS or name == TRUNCATED:
            kept.append(TRUNCATED)
            break
        kept.append(name)
        length += len(name) + 1
    return ",".join(kept)


def split_names(text: str) -> list[str]:
    """The names of a graphopt.replaced value (the cut mark left out)."""
    return [name for name in text.split(",") if name and name != TRUNCATED]


def replaced_names(erased: Iterable[ir.Node], labels: Mapping[int, str]) -> str:
    """graphopt.replaced for the nodes a rewrite erased.

    A node an earlier rewrite made stands for the input nodes that rewrite replaced:
    its own (generated) name is no node of the input, so its list is inherited instead.
    Nodes a pass made are left out for the same reason. `labels` holds the names of
    matched nodes taken before the commit renamed their outputs (unnamed nodes are
    labelled after their first output)."""
    names: list[str] = []
    for node in erased:
        inherited = node.metadata_props.get(REPLACED_KEY)
        if inherited is not None:
            names.extend(inherited.split(","))
        elif PASS_KEY not in node.metadata_props:
            names.append(labels.get(id(node)) or node.name or "")
    return join_names(names)


def record_rewrite(
    inserted: Sequence[ir.Node], erased: Iterable[ir.Node], labels: Mapping[int, str], made_by: Mapping[str, str], results: Sequence[ir.Value]
) -> None:
    """Write a committed rewrite's provenance (`made_by`: rule and index) on the nodes it inserted.

    A rewrite that only rewires (a Transpose with the identity perm -> its input) inserts
    no node to carry graphopt.replaced. A node an earlier rewrite made next to the rewired
    value (its producer, else one of its readers) takes the erased names on instead, so
    what a chain of rewrites removed stays with the fused node it ends in."""
    erased = list(erased)
    replaced = replaced_names(erased, labels)
    for node in inserted:
        node.metadata_props.update(made_by)
        node.metadata_props[REPLACED_KEY] = replaced
    # Exactly what each rewrite removed: the input nodes this one erased itself, plus the
    # records the graphopt-made nodes it erased were carrying.
    records = [record for node in erased for record in removed_records(node.metadata_props)]
    direct = [labels.get(id(node)) or node.name or "" for node in erased if not _has_provenance(node.metadata_props)]
    if made_by.get(REWRITE_KEY, "").isdigit() and any(direct):
        records.append([int(made_by[REWRITE_KEY]), made_by.get(RULE_KEY, "?"), [name for name in direct if name]])
    neighbours = [*(v.producer() for v in results), *(use.node for v in results for use in v.uses())]
    fused = next((n for n in neighbours if n is not None and RULE_KEY in n.metadata_props), None)
    if not inserted and replaced and fused is not None:
        props = fused.metadata_props
        props[REPLACED_KEY] = join_names([*props.get(REPLACED_KEY, "").split(","), *replaced.split(",")])
    # The carrier: the first inserted node; else the fused node next to the rewired value;
    # else a reader the rewrite rewired (a Gather folded into a constant has no fused node).
    readers = [use.node for v in results for use in v.uses()]
    carrier = inserted[0] if inserted else fused or next(iter(readers), None)
    if carrier is not None and records:
        carrier.metadata_props[REMOVED_KEY] = json.dumps([*removed_records(carrier.metadata_props), *records], separators=(",", ":"))


def removed_records(props: Mapping[str, str]) -> list[list[Any]]:
    """The [index, rule, [names]] records of graphopt.removed ([] when absent or malformed)."""
    try:
        records = json.loads(props.get(REMOVED_KEY, "[]"))
    except ValueError:
        return []
    if not isinstance(records, list):
        return []
    return [r for r in records if isinstance(r, list) and len(r) == 3 and isinstance(r[0], int) and isinstance(r[2], list)]


def _all_nodes(model: ir.Model) -> Iterator[ir.Node]:
    """Every node of the model, its functions and all their subgraphs, in no particular order.

    Not onnx-ir's RecursiveGraphIterator: it checks each attribute against `ir.Attr`, whose
    protocol metaclass makes that isinstance a Python call; twice per pass of a run, that was
    ~2 ms of a small model's optimization."""
    scopes: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    while scopes:
        for node in scopes.pop():
            yield node
            for attr in node.attributes.values():
                if attr.is_ref():  # a function body's reference to its caller's attribute: no graph of its own
                    continue
                if attr.type == _GRAPH:
                    scopes.append(attr.value)
                elif attr.type == _GRAPHS:
                    scopes.extend(attr.value)


_GRAPH, _GRAPHS = ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS


@contextmanager
def tag_new_nodes(model: ir.Model, pass_name: str) -> Iterator[None]:
    """Mark the nodes that appear during the block (and carry no provenance yet) as made by `pass_name`.

    One walk over the model before and one after: linear, like the passes it wraps."""
    before = list(_all_nodes(model))  # held, so that no new node can reuse a freed node's id
    known = set(map(id, before))
    yield
    for node in _all_nodes(model):
        if id(node) not in known and not _has_provenance(node.metadata_props):
            node.metadata_props[PASS_KEY] = pass_name
    del before


def _has_provenance(props: Mapping[str, str]) -> bool:
    return RULE_KEY in props or PASS_KEY in props
