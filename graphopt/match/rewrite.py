"""Run the rewrite half of a rule against a match.

The executor only *builds*: new nodes are created detached, and the caller
(the driver) decides whether to commit them — after checking that the target
can run every one of them. Nothing in the graph changes here, except constants
registered for new nodes, which are dropped again as unused if the rewrite is
not committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphopt.ir.view import GraphView
from graphopt.match.matcher import Match, MatchContext, OpBinding
from graphopt.pattern.ir import (
    EXPRESSION_HOLDERS,
    Build,
    Call,
    Choose,
    Expr,
    FirstOf,
    Let,
    Lit,
    OpsetChoose,
    Ref,
    Replace,
    Rule,
    field_names,
    parse_op_key,
)
from graphopt.pattern.native import RewriteDeclined, call_native, lookup

__all__ = ["PlannedRewrite", "plan_rewrite", "target_variants"]


@dataclass
class PlannedRewrite:
    match: Match
    new_nodes: list[Any]
    replacements: list[tuple[Any, Any]]  # (old value, new value)


class _BuiltOutputs:
    """A new node with several outputs; `x.0`, `x.1` select them."""

    def __init__(self, node: Any, view: GraphView) -> None:
        self.node = node
        self.outputs = list(view.outputs(node))

    def __getitem__(self, key: str | int) -> Any:
        return self.outputs[int(key)]


def plan_rewrite(view: GraphView, match: Match) -> PlannedRewrite:
    """Evaluate the rule body; raises RewriteDeclined when a native helper backs out."""
    scope = view.scope_of(match.root)
    ctx = MatchContext(view, scope)
    env: dict[str, Any] = dict(match.bindings)
    new_nodes: list[Any] = []
    replacements: list[tuple[Any, Any]] = []

    def as_value(x: Any, hint: str) -> Any:
        if isinstance(x, OpBinding):
            return x.value
        if isinstance(x, _BuiltOutputs):
            return x.outputs[0]
        if isinstance(x, (np.ndarray, np.generic)):
            return ctx.constant(np.asarray(x), hint)
        return x

    def evaluate(expr: Any, hint: str = "") -> Any:
        if isinstance(expr, Ref):
            if expr.name not in env:
                raise KeyError(f"'{expr.name}' is not bound")
            value = env[expr.name]
            if expr.field is None:
                return value
            if isinstance(value, _BuiltOutputs):
                return value[expr.field]
            if isinstance(value, Mapping):
                return value[expr.field]
            return getattr(value, expr.field)
        if isinstance(expr, Lit):
            return expr.value
        if isinstance(expr, Call):
            native = lookup("Rewrite", expr.name) or lookup("Constraint", expr.name)
            if native is None:
                raise KeyError(f"native {expr.name} is not registered")
            args = [_plain(evaluate(a)) for a in expr.args]
            return call_native(native, ctx, *args, rule=match.rule.name)
        if isinstance(expr, Choose):
            label = _plain(evaluate(expr.tag))
            for branch, branch_expr in expr.branches:
                if branch == label or (isinstance(label, str) and label.rpartition(".")[2] == branch):  # a type: its name
                    return None if branch_expr is None else evaluate(branch_expr, hint)
            tag = expr.tag.name if expr.tag.field is None else f"{expr.tag.name}.{expr.tag.field}"
            raise RewriteDeclined(f"no rewrite for {tag} = {label!r}")
        if isinstance(expr, FirstOf):  # a rule not split by target_variants: its first option
            return evaluate(expr.options[0], hint)
        if isinstance(expr, OpsetChoose):
            version = view.opset(expr.domain)
            for guard, branch_expr in expr.branches:
                if guard.admits(version):
                    return evaluate(branch_expr, hint)
            ranges = " or ".join(guard.describe() for guard, _ in expr.branches)
            raise RewriteDeclined(f"the model's opset is {version}; the rewrite needs {ranges}")
        if isinstance(expr, Build):
            hint_in = f"{expr.op_type or 'op'}_in"
            operands = [None if o is None else as_value(evaluate(o, hint_in), hint_in) for o in expr.operands]
            attrs: dict[str, Any] = {}
            # New nodes are named after the node they stand in for, so reports and tools can trace them.
            name_hint = view.label(match.root)
            if expr.copy_from is not None:
                source = env[expr.copy_from]
                source_node = source.node if isinstance(source, OpBinding) else source
                attrs.update(view.raw_attrs(source_node))
                name_hint = view.label(source_node)
            for name, value_expr in expr.attrs:
                value = _plain(evaluate(value_expr))
                if value is None:
                    attrs.pop(name, None)  # None removes an attribute (e.g. one that was copied)
                else:
                    attrs[name] = value
            domain, op_type = (expr.domain, expr.op_type) if expr.type_ref is None else parse_op_key(env[expr.type_ref])
            node = view.new_node(scope, domain, op_type, operands, attrs, expr.num_outputs, name_hint=name_hint)
            new_nodes.append(node)
            built = _BuiltOutputs(node, view)
            return built if expr.num_outputs > 1 else built.outputs[0]
        raise TypeError(f"cannot evaluate {expr!r}")

    try:
        for stmt in match.rule.body:
            if isinstance(stmt, Let):
                env[stmt.name] = evaluate(stmt.expr, stmt.name)
            elif isinstance(stmt, Replace):
                target = env[stmt.target]
                if not isinstance(target, OpBinding):
                    raise TypeError(f"replace target '{stmt.target}' is not a matched op")
                outputs = list(view.outputs(target.node))
                values = [as_value(evaluate(e, stmt.target), stmt.target) for e in stmt.values]
                if len(values) > len(outputs):
                    raise RewriteDeclined(f"{len(values)} replacements for {len(outputs)} outputs")
                for old, new in zip(outputs, values):
                    if new is None:
                        raise RewriteDeclined("replacement value is missing")
                    replacements.append((old, new))
                # Outputs not replaced must be unused, or the rewrite would leave them dangling.
                for old in outputs[len(values):]:
                    if view.users(old) or view.is_graph_output(old):
                        raise RewriteDeclined(f"output {view.output_index(old)} of {view.label(target.node)} is still used")
    except RewriteDeclined:
        view.discard_pending()
        raise
    return PlannedRewrite(match, new_nodes, replacements)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, OpBinding) else value



def target_variants(rule: Rule) -> list[Rule]:
    """The rule once per option of each `first { ... }` in its rewrite, in order.

    The driver tries them one after another at a node: an option the target cannot run
    is refused like any rewrite, and the next one is tried. All keep the rule's name."""
    target = rule.first_choice  # cached on the rule (and in the pattern cache)
    if target is None:
        return [rule]
    variants: list[Rule] = []
    for option in target.options:
        body = tuple(_substitute(stmt, target, option) for stmt in rule.body)
        variants += target_variants(dataclasses.replace(rule, body=body))  # type: ignore[arg-type]
    return variants


def _substitute(e: object, old: FirstOf, new: Expr) -> object:
    if e is old:
        return new
    if isinstance(e, tuple):
        return tuple(_substitute(x, old, new) for x in e)
    if isinstance(e, EXPRESSION_HOLDERS):
        return dataclasses.replace(e, **{name: _substitute(getattr(e, name), old, new) for name in field_names(type(e))})  # type: ignore[arg-type]
    return e

